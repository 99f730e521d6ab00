"""A worker pool shared by a process's callers, configured from the environment (slime).

slime calls ``generate()`` once per sample from its rollout processes. With ``SWE_RAY_WORKERS``
set, those calls dispatch to one pool of named Ray workers that every process opening the same
pool name shares, instead of each process carrying its own sandboxes.

=========================  ===========================================================  ===========
variable                   meaning                                                      default
=========================  ===========================================================  ===========
``SWE_RAY_WORKERS``        workers in the pool: a number, or ``auto`` (one per node);    (no Ray)
                           unset, empty or ``0`` runs episodes in the calling process
``SWE_RAY_CONCURRENCY``    episodes at once per worker                                   16
``SWE_RAY_ADDRESS``        cluster to join when Ray is not initialised yet               auto
``SWE_RAY_POOL``           name of the shared pool (its workers are ``NAME-i``)          trio_swe-pool
``SWE_RAY_NAMESPACE``      Ray namespace of the pool and its limiter                     trio_swe
``SWE_RAY_MAX_BOOTING``    cluster-wide cap on sandboxes booting at once (0: none)       0
``SWE_RAY_MAX_ALIVE``      cluster-wide cap on sandboxes alive at once (0: none)         0
``SWE_RAY_DETACHED``       ``1``: the workers outlive the process that started them     0
=========================  ===========================================================  ===========
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import msgspec

from .._errors import ConfigError
from ..config import SweConfig
from ._pool import WorkerPool

__all__ = ["RayOptions", "shared_pool"]


class RayOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The ``SWE_RAY_*`` variables (see the module docstring)."""

    workers: int | None = None  # None: one per node ("auto")
    concurrency: int = 16
    address: str = "auto"
    pool: str = "trio_swe-pool"
    namespace: str = "trio_swe"
    max_booting: int = 0
    max_alive: int = 0
    detached: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RayOptions | None:
        """The options, or None when ``SWE_RAY_WORKERS`` is unset, empty or ``0``.

        Raises:
            ConfigError: a variable is malformed (the message names it).
        """
        env = os.environ if environ is None else environ
        raw = env.get("SWE_RAY_WORKERS", "").strip()
        if raw in ("", "0"):
            return None
        workers: int | None
        workers = None if raw == "auto" else _int(env, "SWE_RAY_WORKERS", minimum=1, raw=raw)
        return cls(
            workers=workers,
            concurrency=_int(env, "SWE_RAY_CONCURRENCY", minimum=1, default=16),
            address=env.get("SWE_RAY_ADDRESS", "").strip() or "auto",
            pool=_name(env, "SWE_RAY_POOL", "trio_swe-pool"),
            namespace=_name(env, "SWE_RAY_NAMESPACE", "trio_swe"),
            max_booting=_int(env, "SWE_RAY_MAX_BOOTING", minimum=0, default=0),
            max_alive=_int(env, "SWE_RAY_MAX_ALIVE", minimum=0, default=0),
            detached=_flag(env, "SWE_RAY_DETACHED"),
        )


def _int(
    env: Mapping[str, str], var: str, *, minimum: int, default: int = 0, raw: str | None = None
) -> int:
    text = (env.get(var, "") if raw is None else raw).strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()):
        raise ConfigError(f"{var}={text!r} is not a whole number")
    value = int(text)
    if value < minimum:
        raise ConfigError(f"{var}={text!r} must be >= {minimum}")
    return value


def _name(env: Mapping[str, str], var: str, default: str) -> str:
    text = env.get(var, "").strip() or default
    if not all(c.isalnum() or c in "-_." for c in text):
        raise ConfigError(f"{var}={text!r}: use letters, digits, '-', '_' and '.'")
    return text


def _flag(env: Mapping[str, str], var: str) -> bool:
    text = env.get(var, "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{var}={text!r}: use 1 or 0")


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
