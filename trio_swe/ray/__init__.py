"""Scale-out on Ray: rollout workers as actors, a cluster-wide sandbox limiter.

Install with ``pip install 'trio-swe[ray]'``. Each :class:`WorkerPool` worker is a Ray async actor
hosting one long-lived trio run (a guest of the actor's asyncio loop) with its own backend,
agent and connection pools, kept across batches. The driver streams results as they finish,
from trio (from asyncio: the same with :class:`AsyncioWorkerPool`)::

    import ray
    from trio_swe.ray import WorkerPool

    ray.init(address="auto")
    async with WorkerPool(concurrency=16, max_alive=200) as pool:  # one worker per node
        async with pool.rollouts(mds) as results:
            async for result in results:
                ...

A worker that dies mid-episode has its episodes run again elsewhere (each instance once in the
results); its sandboxes die with it (local backend) or are found by their owner metadata and
killed by a surviving worker (E2B; a short TTL that only live workers push forward catches the
rest), and its limiter leases return. Cancelling the driver cancels every worker's episodes and
waits for their cleanup.
"""

from __future__ import annotations

from .._errors import TrioSweError

try:
    import ray as _ray  # noqa: F401
except ImportError as exc:  # pragma: no cover - the extra is installed in the test setup

    class RayNotInstalledError(TrioSweError, ImportError):
        """trio_swe.ray needs the ``ray`` extra."""

    raise RayNotInstalledError("trio_swe.ray needs Ray: pip install 'trio-swe[ray]'") from exc

from ._asyncio import AsyncioWorkerPool
from ._env import RayOptions, shared_pool
from ._leases import LeaseTable, LimiterStatistics
from ._limiter import ClusterLimiter, LeasedBackend, LimiterClient, open_limiter
from ._pool import WorkerPool, WorkerPoolError, WorkerPoolStatistics, WorkerView
from ._worker import RolloutWorker, WorkerInfo, WorkerStatistics

__all__ = [
    "AsyncioWorkerPool",
    "ClusterLimiter",
    "LeaseTable",
    "LeasedBackend",
    "LimiterClient",
    "LimiterStatistics",
    "RayOptions",
    "RolloutWorker",
    "WorkerInfo",
    "WorkerPool",
    "WorkerPoolError",
    "WorkerPoolStatistics",
    "WorkerStatistics",
    "WorkerView",
    "open_limiter",
    "shared_pool",
]
