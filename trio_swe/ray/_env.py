"""A worker pool shared by a process's callers, configured from the environment (slime).

slime calls ``generate()`` once per sample from its rollout processes. With ``SWE_RAY_WORKERS``
set, those calls dispatch to one pool of named Ray workers that every process opening the same
pool name shares, instead of each process carrying its own sandboxes. The ``SWE_RAY_*``
variables are part of :class:`~trio_swe.SweConfig` (``config.ray``, a
:class:`~trio_swe.config.RayOptions`; the table is in :mod:`trio_swe.config`), so reading them
needs no Ray; this module runs the pool they describe.
"""

from __future__ import annotations

from ..config import RayOptions, SweConfig
from ._pool import WorkerPool

__all__ = ["RayOptions", "shared_pool"]


_POOLS: dict[RayOptions, WorkerPool] = {}


def shared_pool(options: RayOptions, config: SweConfig) -> WorkerPool:
    """This process's handle on the shared pool ``options.pool`` (Ray joined if needed).

    The first process to open a pool of that name starts its workers with its ``config``; the
    others reuse them. The handle is made once per process and options.
    """
    pool = _POOLS.get(options)
    if pool is None:
        import ray

        if not ray.is_initialized():
            ray.init(address=options.address, namespace=options.namespace)
        pool = WorkerPool(
            workers=options.workers,
            concurrency=options.concurrency,
            config=config,
            max_booting=options.max_booting,
            max_alive=options.max_alive,
            limiter_name=f"{options.pool}-limiter",
            name=options.pool,
            namespace=options.namespace,
            detached=options.detached,
        )
        _POOLS[options] = pool
    return pool
