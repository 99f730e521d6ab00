"""The rollout worker: a Ray async actor hosting one long-lived trio run (guest of its loop).

The actor's asyncio loop hosts trio in guest mode through :mod:`trio_swe.aio`. A host task keeps
that trio run alive for the actor's whole life and owns what must outlive a batch: the backend
(an E2B backend's HTTP/2 pools), the agent (its policy client's connection pool), the heartbeat to
the cluster limiter. Every :meth:`run` call is one more trio task in the same run, so all
episodes of the worker share the boot limiter and the pools.

Why guest mode rather than ``trio.run`` in a thread of a threaded actor: an async actor parks no
OS thread per running episode (a threaded actor needs one per concurrent call, so a thousand
sandboxes mean a thousand threads), and Ray's ``ray.cancel`` of an async actor task arrives as
``asyncio.CancelledError``, which :func:`trio_swe.aio.run` turns into a trio cancellation and
waits out (sandboxes killed) before the task ends. Per call the two differ by a couple of
milliseconds either way depending on load (``python -m bench ray``), nothing next to an episode.

A worker killed outright (``ray.kill``, OOM, node loss, its driver killed) runs no cleanup. Its
local sandboxes die with it (the init's lifeline pipe). Its E2B sandboxes carry its id in their
metadata (:mod:`._owned`): the pool has a surviving worker list and kill them (:meth:`reap`), and
their short TTL, pushed forward only while this worker lives, reclaims them when nobody is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import ray
import trio

from .. import aio
from .._close import aclose_quietly
from ..agents import Agent, create_agent
from ..config import SweConfig
from ..episode import run_episode
from ..results import encode_result
from ..sandbox import Backend, open_backend
from ._bridge import ActorHandle, wait_ref
from ._limiter import LeasedBackend, LimiterClient
from ._owned import DEFAULT_ORPHAN_TTL_SEC, OwnedBackend, kill_owned
from ._wire import decode_config, decode_job

__all__ = ["AgentFactory", "BackendFactory", "RolloutWorker", "WorkerInfo"]

#: Builds the worker's backend inside its trio run: a :class:`~trio_swe.sandbox.Backend`, or an
#: async context manager yielding one (closed when the worker stops). Shipped to the worker by
#: Ray (cloudpickle), so use importable callables, e.g.
#: ``functools.partial(LocalBackend, state_dir="/scratch/trio_swe")``.
BackendFactory = Callable[[], Any]
#: Builds the worker's agent inside its trio run from the pool's config (default:
#: ``create_agent(config)``).
AgentFactory = Callable[[SweConfig], Agent]

#: Longest wait between heartbeats to the limiter; shorter when its holder TTL is short (a
#: quarter of it), so a live worker is never taken for a silent one.
HEARTBEAT_SEC = 5.0


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Where a worker runs, and how many episodes it takes."""

    worker_id: str
    node_id: str
    pid: int
    concurrency: int  #: agents running at once
    boot_ahead: int = 0  #: episodes booting, waiting for an agent slot or grading beside them


class WorkerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A worker's counters."""

    worker_id: str
    node_id: str
    running: int  #: episodes here now: booting, waiting for an agent slot, agent, grading
    finished: int
    cancelled: int
    backend: dict[str, Any]


@contextlib.asynccontextmanager
async def _open_backend(spec: str | BackendFactory, config: SweConfig) -> AsyncIterator[Backend]:
    if isinstance(spec, str):
        # By name, from the one registry (E2B_* and SSL_CERT_FILE of the worker's env).
        async with open_backend(spec) as backend:
            yield backend
        return
    made = spec()
    if inspect.isawaitable(made):
        made = await made
    if hasattr(made, "__aenter__"):
        async with made as backend:
            yield backend
    else:
        yield made


class _Worker:
    """The actor's body (decorated by :data:`RolloutWorker`)."""

    def __init__(
        self,
        worker_id: str,
        config: bytes,
        concurrency: int,
        backend: str | BackendFactory | None = None,
        agent: str | AgentFactory | None = None,
        limiter: ActorHandle | None = None,
        orphan_ttl_sec: float | None = DEFAULT_ORPHAN_TTL_SEC,
        boot_ahead: int = 0,
    ) -> None:
        self._id = worker_id
        self._orphan_ttl = orphan_ttl_sec
        self._config = decode_config(config)
        self._concurrency, self._boot_ahead = concurrency, boot_ahead
        self._backend_spec: str | BackendFactory = backend or self._config.backend
        self._agent_spec = agent
        self._limiter = limiter
        self._host: asyncio.Task[None] | None = None
        self._host_ready: asyncio.Future[None] | None = None
        self._stop: trio.Event | None = None
        self._backend: Backend | None = None
        self._own_backend: Backend | None = None  # not wrapped: what reaps another's sandboxes
        self._agent: Agent | None = None
        self._slots: trio.CapacityLimiter | None = None
        self._agents: trio.CapacityLimiter | None = None
        self._batches: dict[str, dict[str, trio.CancelScope]] = {}
        self._running = self._finished = self._cancelled = 0
        self._idle: dict[str, trio.Event] = {}

    # -- the host trio task -------------------------------------------------------------------
    async def _start(self) -> None:
        if self._host is None:
            loop = asyncio.get_running_loop()
            self._host_ready = loop.create_future()
            self._host = loop.create_task(aio.run(self._hold))
        assert self._host_ready is not None
        host = self._host
        await asyncio.wait([self._host_ready, host], return_when=asyncio.FIRST_COMPLETED)
        if not self._host_ready.done():
            host.result()  # the host failed while starting: raise its error here
            raise RuntimeError("the worker's trio run ended while starting")
        self._host_ready.result()

    async def _hold(self) -> None:
        cfg = self._config
        self._stop = trio.Event()
        try:
            async with (
                trio.open_nursery() as nursery,
                _open_backend(self._backend_spec, cfg) as backend,
            ):
                agent_spec = self._agent_spec
                agent = agent_spec(cfg) if callable(agent_spec) else create_agent(cfg, agent_spec)
                try:
                    self._own_backend = backend
                    backend = OwnedBackend(backend, self._id, orphan_ttl_sec=self._orphan_ttl)
                    if self._limiter is not None:
                        client = LimiterClient(self._limiter, self._id)
                        backend = LeasedBackend(backend, client)
                        ttl: float = await wait_ref(self._limiter.holder_ttl.remote())
                        nursery.start_soon(client.heartbeat_forever, min(HEARTBEAT_SEC, ttl / 4))
                    self._backend, self._agent = backend, agent
                    # Episodes here (holding sandboxes), and among them the agents running:
                    # with no boot ahead the one limiter serves as both (as LocalEpisodes).
                    self._slots = trio.CapacityLimiter(self._concurrency + self._boot_ahead)
                    if self._boot_ahead:
                        self._agents = trio.CapacityLimiter(self._concurrency)
                    assert self._host_ready is not None
                    if not self._host_ready.done():
                        self._host_ready.set_result(None)  # same thread: trio is asyncio's guest
                    await self._stop.wait()
                    nursery.cancel_scope.cancel()
                finally:
                    await aclose_quietly([agent], timeout_sec=30.0)
        except BaseException as exc:
            if self._host_ready is not None and not self._host_ready.done():
                self._host_ready.set_exception(
                    exc if isinstance(exc, Exception) else RuntimeError(repr(exc))
                )
            raise

    # -- remote methods -----------------------------------------------------------------------
    async def ready(self) -> bytes:
        """Start the trio run (backend, agent) if needed; where this worker runs."""
        await self._start()
        info = WorkerInfo(
            worker_id=self._id,
            node_id=ray.get_runtime_context().get_node_id(),
            pid=os.getpid(),
            concurrency=self._concurrency,
            boot_ahead=self._boot_ahead,
        )
        return msgspec.msgpack.encode(info)

    async def run(self, job: bytes) -> bytes:
        """Run one episode; its result as a results-file frame (b"" if it was cancelled)."""
        await self._start()
        return await aio.run(self._episode, job)

    async def cancel(self, batch: str) -> int:
        """Cancel the episodes of ``batch`` and wait until they have cleaned up; how many."""
        await self._start()
        return await aio.run(self._cancel_batch, batch)

    async def reap(self, owner: str) -> list[str]:
        """Kill the sandboxes of ``owner`` (a dead worker) through this worker's backend."""
        await self._start()
        return await aio.run(self._reap, owner)

    async def statistics(self) -> bytes:
        await self._start()
        backend = self._backend
        stats = WorkerStatistics(
            worker_id=self._id,
            node_id=ray.get_runtime_context().get_node_id(),
            running=self._running,
            finished=self._finished,
            cancelled=self._cancelled,
            backend=msgspec.to_builtins(backend.statistics()) if backend is not None else {},
        )
        return msgspec.msgpack.encode(stats)

    async def close(self) -> None:
        """Stop the trio run: close the agent's and the backend's connections."""
        if self._host is None:
            return
        stop = self._stop
        if stop is not None:
            await aio.run(_set, stop)
        await asyncio.wait([self._host])

    # -- trio side ----------------------------------------------------------------------------
    async def _episode(self, raw: bytes) -> bytes:
        job = decode_job(raw)
        assert self._slots is not None
        assert self._backend is not None
        assert self._agent is not None
        scopes = self._batches.setdefault(job.batch, {})
        done = trio.Event()
        self._idle[job.key] = done
        self._running += 1
        try:
            with trio.CancelScope() as scope:
                scopes[job.key] = scope
                async with self._slots:
                    result = await run_episode(
                        job.md,
                        self._agent,
                        backend=self._backend,
                        config=self._config,
                        episode_id=job.episode_id,
                        sampling_params=job.sampling_params,
                        agent_slots=self._agents,
                        network=job.network,
                        build_samples=job.build_samples,
                        group_id=job.group_id,
                        group_index=job.group_index,
                    )
                self._finished += 1
                return encode_result(result)
            self._cancelled += 1
            return b""
        finally:
            self._running -= 1
            scopes.pop(job.key, None)
            if not scopes:
                self._batches.pop(job.batch, None)
            self._idle.pop(job.key, None)
            done.set()

    async def _reap(self, owner: str) -> list[str]:
        assert self._own_backend is not None
        return await kill_owned(self._own_backend, owner)

    async def _cancel_batch(self, batch: str) -> int:
        scopes = dict(self._batches.get(batch, {}))
        for scope in scopes.values():
            scope.cancel()
        for key in scopes:
            event = self._idle.get(key)
            if event is not None:
                await event.wait()
        return len(scopes)


async def _set(event: trio.Event) -> None:
    event.set()


#: The worker as a Ray actor class; the pool sets its resources and placement.
RolloutWorker: Any = ray.remote(_Worker)
