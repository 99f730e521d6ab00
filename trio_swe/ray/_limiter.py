"""The cluster-wide limiter: a Ray actor handing out sandbox leases, and the worker's side of it.

:class:`ClusterLimiter` is an async actor around a :class:`~._leases.LeaseTable`. Workers ask it
before every boot (:class:`LeasedBackend` wraps their backend): the request waits until the
sandbox fits under both caps, the lease stops counting as booting once the sandbox is up, and it
is returned when the sandbox is killed (or its boot fails). A worker that dies gives its leases
back two ways: the driver that sees it die calls :meth:`ClusterLimiter.reclaim` at once, and the
limiter expires holders that stop sending heartbeats (a node lost with its driver).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVarTuple

import ray
import trio

from .._errors import ConfigError, SandboxBootError
from ..sandbox import (
    Backend,
    BackendStatistics,
    BackendWrapper,
    Sandbox,
    SandboxSpec,
    SandboxStatistics,
)
from ._bridge import ActorHandle, ObjectRef, wait_ref
from ._leases import LeaseTable, LimiterStatistics

__all__ = ["ClusterLimiter", "LeasedBackend", "LimiterClient", "open_limiter"]

logger = logging.getLogger(__name__)

#: Name of the limiter actor that workers of every pool find (in the Ray namespace in use).
DEFAULT_LIMITER_NAME = "trio_swe-limiter"
#: How long a sandbox's kill waits for the limiter to take its lease back.
RELEASE_WAIT_SEC = 5.0


class _Limiter:
    """The actor's body (decorated by :data:`ClusterLimiter`)."""

    def __init__(self, max_booting: int, max_alive: int, holder_ttl_sec: float) -> None:
        self._table = LeaseTable(
            max_booting=max_booting, max_alive=max_alive, holder_ttl_sec=holder_ttl_sec
        )
        self._waiters: dict[str, asyncio.Future[bool]] = {}
        self._expirer: asyncio.Task[None] | None = None

    def _start_expirer(self) -> None:
        if self._expirer is None:
            self._expirer = asyncio.get_running_loop().create_task(self._expire_forever())

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self._table.holder_ttl_sec / 4)
            before = self._table.statistics().reclaimed
            silent, granted = self._table.expire(time.monotonic())
            reclaimed = self._table.statistics().reclaimed - before
            if reclaimed:
                logger.warning("reclaimed %d leases of silent workers %s", reclaimed, silent)
            self._wake(granted)

    def _wake(self, granted: list[str]) -> None:
        for lease_id in granted:
            waiter = self._waiters.pop(lease_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(True)
            elif waiter is None or waiter.cancelled():
                self._wake(self._table.release(lease_id))  # nobody is waiting for it any more

    async def acquire(self, lease_id: str, holder: str) -> bool:
        """Wait for a lease. False: the request was released (cancelled) before it arrived."""
        self._start_expirer()
        granted = self._table.request(lease_id, holder, time.monotonic())
        if granted is not None:
            return granted
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[lease_id] = waiter
        try:
            return bool(await waiter)
        except asyncio.CancelledError:
            self._waiters.pop(lease_id, None)
            self._wake(self._table.release(lease_id))
            raise

    async def booted(self, lease_id: str) -> None:
        self._wake(self._table.booted(lease_id))

    async def release(self, lease_id: str) -> None:
        waiter = self._waiters.pop(lease_id, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(False)
        self._wake(self._table.release(lease_id))

    async def heartbeat(self, holder: str) -> None:
        self._start_expirer()
        self._table.heartbeat(holder, time.monotonic())

    async def holder_ttl(self) -> float:
        """Seconds without a heartbeat after which a holder's leases are reclaimed."""
        return self._table.holder_ttl_sec

    async def reclaim(self, holder: str) -> int:
        """Take back every lease of ``holder`` (a worker known dead); returns how many."""
        for lease_id, waiter in list(self._waiters.items()):
            if self._table.holder_of(lease_id) == holder and not waiter.done():
                waiter.set_result(False)
                del self._waiters[lease_id]
        count, granted = self._table.reclaim(holder)
        self._wake(granted)
        return count

    async def statistics(self) -> bytes:
        import msgspec

        return msgspec.msgpack.encode(self._table.statistics())

    async def per_holder(self) -> dict[str, int]:
        return dict(self._table.per_holder())


#: The limiter as a Ray actor class (async); :func:`open_limiter` starts or finds one.
ClusterLimiter: Any = ray.remote(_Limiter)


def open_limiter(
    *,
    max_booting: int = 0,
    max_alive: int = 0,
    holder_ttl_sec: float = 60.0,
    name: str | None = DEFAULT_LIMITER_NAME,
    namespace: str | None = None,
    detached: bool = False,
) -> ActorHandle:
    """The cluster's limiter actor: the one named ``name`` if it exists, else a new one.

    ``name=None`` makes a private (unnamed) limiter. The caps and holder TTL of an existing
    limiter are kept. ``holder_ttl_sec``: a holder (worker) silent that long has its leases
    reclaimed (its workers heartbeat every quarter of it, at most every 5 s). ``detached``: a
    new limiter outlives the process that made it (it is otherwise gone with that process, and
    with it every lease).
    """
    if holder_ttl_sec <= 0 or not math.isfinite(holder_ttl_sec):
        raise ConfigError(f"holder_ttl_sec must be a positive number, not {holder_ttl_sec}")
    options: dict[str, Any] = {}
    if name is not None:
        options.update(name=name, get_if_exists=True)
        if namespace is not None:
            options["namespace"] = namespace
    if detached:
        options["lifetime"] = "detached"
    return (
        ray.remote(_Limiter)
        .options(
            num_cpus=0,
            max_concurrency=100_000,
            # On the head node, which goes only with the cluster: a limiter lost with some
            # worker node would take every lease's bookkeeping with it (as Ray Train places
            # its state actor).
            resources={"node:__internal_head__": 0.001},
            **options,
        )
        .remote(max_booting, max_alive, holder_ttl_sec)
    )


def limiter_statistics(handle: ActorHandle) -> LimiterStatistics:
    """A snapshot of the limiter (blocking; from a driver's thread, not from a trio task)."""
    import msgspec

    raw: bytes = ray.get(handle.statistics.remote())
    return msgspec.msgpack.decode(raw, type=LimiterStatistics)


class LimiterClient:
    """A worker's side of the limiter: ask, mark booted, release; heartbeats."""

    def __init__(self, handle: ActorHandle, holder: str) -> None:
        self.handle = handle
        self.holder = holder
        self.waited_sec = 0.0
        self.leases = 0

    async def acquire(self) -> str:
        """Wait for a lease and return its id. Cancelling the wait drops the request."""
        lease_id = uuid.uuid4().hex
        t0 = time.monotonic()
        ref: ObjectRef = self.handle.acquire.remote(lease_id, self.holder)
        try:
            granted = await wait_ref(ref)
        except BaseException:
            # Cancelled (or the limiter failed): whether or not the lease was granted meanwhile,
            # releasing it by id gives it back (or drops the queued request).
            self.release(lease_id)
            raise
        self.waited_sec += time.monotonic() - t0
        if not granted:
            raise SandboxBootError(f"the cluster limiter dropped lease request {lease_id}")
        self.leases += 1
        return lease_id

    def booted(self, lease_id: str) -> None:
        self.handle.booted.remote(lease_id)

    def release(self, lease_id: str) -> None:
        self.handle.release.remote(lease_id)

    async def give_back(self, lease_id: str) -> None:
        """Release ``lease_id`` and wait (shielded, at most :data:`RELEASE_WAIT_SEC`) until the
        limiter has it back. Ray orders messages per caller only: without the wait, what the
        worker reports next (the episode's result) could reach the driver, and the driver's own
        call to the limiter the limiter, before this release did. A limiter that is gone or slow
        costs no more than that bound."""
        ref: ObjectRef = self.handle.release.remote(lease_id)
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + RELEASE_WAIT_SEC
            try:
                await wait_ref(ref)
            except Exception:  # the limiter is gone (its leases with it) or failed: sent anyway
                logger.debug("lease %s: release not acknowledged", lease_id, exc_info=True)

    async def heartbeat_forever(self, every_sec: float) -> None:
        while True:
            self.handle.heartbeat.remote(self.holder)
            await trio.sleep(every_sec)


_Args = TypeVarTuple("_Args")


class _LeasedSandbox:
    """A sandbox whose kill returns its lease."""

    def __init__(self, inner: Sandbox, client: LimiterClient, lease_id: str) -> None:
        self._inner = inner
        self._client = client
        self._lease: str | None = lease_id

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def workdir(self) -> str:
        return self._inner.workdir

    def start_background(
        self, async_fn: Callable[[*_Args], Awaitable[object]], *args: *_Args
    ) -> None:
        self._inner.start_background(async_fn, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def exec(self, cmd: str, **kwargs: Any) -> Any:
        return await self._inner.exec(cmd, **kwargs)

    async def write_file(self, path: str, data: bytes | str, **kwargs: Any) -> None:
        await self._inner.write_file(path, data, **kwargs)

    async def read_file(self, path: str, **kwargs: Any) -> bytes:
        return await self._inner.read_file(path, **kwargs)

    async def kill(self) -> None:
        try:
            await self._inner.kill()
        finally:
            if self._lease is not None:
                lease, self._lease = self._lease, None
                await self._client.give_back(lease)

    def statistics(self) -> SandboxStatistics:
        return self._inner.statistics()


class LeasedBackendStatistics(BackendStatistics, frozen=True, kw_only=True):
    """A leased backend's counters: the wrapped backend's, and the leases it took.

    Attributes:
        inner: the wrapped backend's own statistics (its subclass).
        lease_wait_sec: time spent waiting for leases from the cluster limiter.
        leases: leases taken.
    """

    inner: BackendStatistics
    lease_wait_sec: float
    leases: int


class LeasedBackend(BackendWrapper):
    """Wraps a backend: every boot first takes a lease from the cluster limiter."""

    def __init__(self, backend: Backend, client: LimiterClient) -> None:
        super().__init__(backend)
        self._client = client

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        lease_id = await self._client.acquire()
        try:
            sandbox = await self._backend.create_sandbox(spec, nursery)
        except BaseException:
            await self._client.give_back(lease_id)
            raise
        self._client.booted(lease_id)
        return _LeasedSandbox(sandbox, self._client, lease_id)

    def statistics(self) -> LeasedBackendStatistics:
        return self.wrapped_statistics(
            LeasedBackendStatistics,
            lease_wait_sec=self._client.waited_sec,
            leases=self._client.leases,
        )
