"""A worker's sandboxes carry its name, and live only as long as it keeps them alive.

A worker killed outright (``ray.kill``, OOM, node loss, its driver killed) runs no cleanup. For
the local backend that is fine: a sandbox dies with its parent process (the init's lifeline).
A provider's sandbox (E2B) would live on until its TTL, an hour for a grading sandbox. So every
sandbox a worker boots goes through :class:`OwnedBackend`:

* its metadata names the worker (``trio_swe_owner``): whoever sees the worker die lists that
  owner's sandboxes through the provider's API and kills them (:func:`kill_owned`, run by the
  pool on a surviving worker);
* where the sandbox can extend its own TTL (``set_timeout``), it is booted with a short TTL,
  ``orphan_ttl_sec``, that a task of the live worker keeps pushing forward (a dead man's
  switch): once nobody pushes, the provider reclaims it within ``orphan_ttl_sec``, even when no
  driver is left to reap it. It is never pushed past the TTL the episode asked for.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import msgspec
import trio

from .._errors import ConfigError
from ..sandbox import Backend, BackendStatistics, BackendWrapper, Sandbox, SandboxSpec

__all__ = ["OWNER_KEY", "OwnedBackend", "check_orphan_ttl", "kill_owned"]

logger = logging.getLogger(__name__)

#: The metadata key naming the worker that booted a sandbox.
OWNER_KEY = "trio_swe_owner"

#: Default TTL of a worker's provider sandboxes while the worker keeps them alive (seconds).
DEFAULT_ORPHAN_TTL_SEC = 300.0


def check_orphan_ttl(value: float | None) -> None:
    """Raise :class:`ConfigError` unless ``value`` is None or a finite number >= 3 s."""
    if value is not None and not (value >= 3 and math.isfinite(value)):
        raise ConfigError(f"orphan_ttl_sec must be None or at least 3 s, not {value}")


class OwnedBackendStatistics(BackendStatistics, frozen=True, kw_only=True):
    """An owned backend's counters: the wrapped backend's, and the TTL pushes of its sandboxes.

    Attributes:
        inner: the wrapped backend's own statistics (its subclass).
        ttl_refreshes: TTLs pushed forward.
        ttl_refresh_failures: pushes that failed (the next one tries again).
    """

    inner: BackendStatistics
    ttl_refreshes: int
    ttl_refresh_failures: int


class OwnedBackend(BackendWrapper):
    """Wraps a worker's backend: its sandboxes are tagged with ``owner`` and kept alive by it.

    Args:
        backend: the worker's backend.
        owner: the worker's id (unique per worker start).
        orphan_ttl_sec: the TTL of sandboxes that can extend theirs; pushed forward every third
            of it while the worker lives. None: no switch (sandboxes keep the TTL asked for).
    """

    def __init__(self, backend: Backend, owner: str, *, orphan_ttl_sec: float | None) -> None:
        check_orphan_ttl(orphan_ttl_sec)
        super().__init__(backend)
        self.owner = owner
        self._ttl = orphan_ttl_sec
        self.refreshes = 0
        self.refresh_failures = 0

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        asked = spec.ttl_sec
        short = self._ttl is not None and self._ttl < asked and self._switchable()
        spec = msgspec.structs.replace(
            spec,
            metadata={**spec.metadata, OWNER_KEY: self.owner},
            ttl_sec=self._ttl if short and self._ttl is not None else asked,
        )
        sandbox = await self._backend.create_sandbox(spec, nursery)
        if short and hasattr(sandbox, "set_timeout"):
            # The sandbox's nursery is cancelled before it is killed: the switch stops there.
            nursery.start_soon(self._keep_alive, sandbox, trio.current_time() + asked)
        return sandbox

    def _switchable(self) -> bool:
        # Only where sandboxes extend their TTL (``set_timeout``): E2B's. The local backend's
        # die with their owner anyway; docker's have no TTL.
        return self._backend.name == "e2b"

    async def _keep_alive(self, sandbox: Any, not_after: float) -> None:
        assert self._ttl is not None
        period = self._ttl / 3
        while True:
            await trio.sleep(period)
            left = not_after - trio.current_time()
            if left <= 0:
                return  # the TTL the episode asked for has come: let it run out
            try:
                await sandbox.set_timeout(min(self._ttl, left))
                self.refreshes += 1
            except Exception as exc:  # a later push may work; the TTL has room for two more
                self.refresh_failures += 1
                logger.warning("could not extend sandbox %s: %r", sandbox.id, exc)

    def statistics(self) -> OwnedBackendStatistics:
        return self.wrapped_statistics(
            OwnedBackendStatistics,
            ttl_refreshes=self.refreshes,
            ttl_refresh_failures=self.refresh_failures,
        )


async def kill_owned(backend: Backend, owner: str) -> list[str]:
    """Kill the sandboxes ``owner`` booted through the provider's API; the ids killed.

    ``backend`` is the worker's own (not wrapped). One that cannot list its sandboxes (local:
    they died with their owner) kills none.
    """
    kill = getattr(backend, "kill_sandboxes", None)
    if kill is None:
        return []
    killed: list[str] = await kill({OWNER_KEY: owner})
    return killed
