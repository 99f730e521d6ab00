"""The driver's side: a pool of rollout workers, and rollouts streamed from it.

:class:`WorkerPool` starts the workers (one per node by default), keeps them across batches, and
dispatches episodes to the least loaded live worker, at most ``concurrency + boot_ahead`` per
worker: ``concurrency`` running their agents, the rest booting, waiting for an agent slot or
grading beside them (as :func:`trio_swe.open_rollouts` does in one process). A worker
that dies mid-episode (``ray.kill``, OOM, node loss) costs nothing but time: its episodes run
again on another worker (each instance is in the results exactly once), the limiter gets its
leases back at once, a surviving worker kills the dead one's provider sandboxes (found by their
owner metadata), and a replacement worker is started. Leaving a rollout early or cancelling
the driver cancels the episodes on their workers and waits until their sandboxes are killed.

Everything here is trio. From asyncio, :class:`~._asyncio.AsyncioWorkerPool` is the same pool
through :mod:`trio_swe.aio`.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager
from typing import Any, Literal, NamedTuple, TypeVar, cast

import msgspec
import ray
import trio
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from .._errors import ConfigError, TrioSweError
from ..config import SweConfig
from ..episode import EpisodeResult
from ..grading import InstanceMetadata
from ..results import decode_result
from ..rollout import GroupMember, open_rollouts_on
from ._bridge import ActorHandle, ObjectRef, cancel_and_wait, wait_ref
from ._leases import LimiterStatistics
from ._limiter import open_limiter
from ._owned import DEFAULT_ORPHAN_TTL_SEC, check_orphan_ttl
from ._wire import Job, encode_config, encode_job
from ._worker import AgentFactory, BackendFactory, RolloutWorker, WorkerInfo, WorkerStatistics

__all__ = ["WorkerPool", "WorkerPoolError", "WorkerView"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a cancelled episode may take to clean up on its worker before the driver moves on.
CANCEL_TIMEOUT_SEC = 60.0
#: How long reaping a dead worker's sandboxes may take (their short TTL is the backstop).
REAP_TIMEOUT_SEC = 60.0


class WorkerPoolStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`WorkerPool.statistics` returns: a frozen snapshot, as trio's are."""

    live: int  #: workers ready for episodes
    starting: int  #: workers being created (a replacement, or the first ones)
    running: int  #: episodes in flight across the workers (booting, waiting, agent or grading)
    deaths: int  #: workers lost (node loss, OOM, ray.kill)
    reruns: int  #: episodes run again because their worker died
    reaps: int  #: dead workers whose E2B sandboxes were listed and killed
    reaped: int  #: sandboxes those reaps killed


class WorkerPoolError(TrioSweError):
    """The pool cannot run episodes: no worker is alive, or a worker failed to start."""


class _Worker:
    """The driver's view of one worker."""

    def __init__(self, index: int, worker_id: str, handle: ActorHandle, options: dict[str, Any]):
        self.index = index
        self.worker_id = worker_id
        self.handle = handle
        self.options = options
        self.ready_ref: ObjectRef = handle.ready.remote()
        self.state: Literal["starting", "live", "dead"] = "starting"
        self.info: WorkerInfo | None = None
        self.running: int = 0  # episodes dispatched here and not back yet

    def mark_live(self, raw: bytes) -> None:
        if self.state == "starting":
            self.info = msgspec.msgpack.decode(raw, type=WorkerInfo)
            self.state = "live"


class WorkerView(NamedTuple):
    """One live worker, as :meth:`WorkerPool.live_workers` lists it."""

    info: WorkerInfo
    handle: ActorHandle
    running: int  #: episodes on it: booting, waiting for an agent slot, agent, grading


class WorkerPool:
    """Rollout workers as Ray actors, each hosting one long-lived trio run.

    Example (trio; from asyncio, :class:`~._asyncio.AsyncioWorkerPool`)::

        async with WorkerPool(concurrency=16, config=config) as pool:
            async with pool.rollouts(mds) as results:
                async for result in results:    # in the order they finish
                    ...

    Args:
        workers: how many workers; None starts one per alive node (placed with a hard node
            affinity), an int spreads that many over the cluster (``SPREAD``). Ignored when
            ``resources`` or ``placement_group`` say where each worker goes.
        concurrency: agents running at once on each worker.
        boot_ahead: episodes booting, waiting for an agent slot or grading beside them on each
            worker, at most ``concurrency`` (its default; 0: each episode holds its slot from
            boot to grade), as :func:`trio_swe.open_rollouts`'s: a worker runs up to
            ``concurrency + boot_ahead`` episodes, and as many hold sandboxes.
        config: the episodes' configuration (:meth:`SweConfig.from_env` of the driver when None);
            shipped to the workers as msgpack.
        backend: ``"local"``, ``"e2b"`` (built on the worker, from its environment), or a
            factory ``f() -> Backend | async context manager`` run in the worker's trio run
            (``functools.partial(LocalBackend, state_dir=...)``); default ``config.backend``.
        agent: an agent name from the registry, or a factory ``f(config) -> Agent`` run in the
            worker's trio run; default ``config.agent``.
        max_booting / max_alive: cluster-wide caps on sandboxes booting / alive at once, kept
            by the limiter actor ``limiter_name`` (0 and 0: no limiter).
        limiter_name: the limiter's actor name (shared by every pool that uses the same one).
        resources: one mapping of Ray custom resources per worker (``{"node_b": 1}``) to pin it.
        placement_group: a placement group; worker ``i`` goes in bundle ``i``.
        num_cpus: CPUs each worker reserves for scheduling.
        name: a shared pool: workers are named ``{name}-{i}`` and reused by every process that
            opens a pool of that name (slime's rollout actors); None: private workers.
        namespace: Ray namespace of named workers and the limiter.
        replace_dead: start a replacement for a worker that died.
        runtime_env: Ray runtime environment of the workers.
        detached: a shared pool's workers (and a limiter it creates) outlive the process that
            started them (until :meth:`shutdown` or the cluster's end); otherwise they die with
            it (Ray kills the actors of a dead owner).
        lease_ttl_sec: a worker silent that long (dead with no driver to tell) has its leases
            reclaimed by the limiter; applies to a limiter this pool creates.
        orphan_ttl_sec: a worker's provider sandboxes (E2B) get this TTL, pushed forward while
            the worker lives (never past the TTL the episode asked for): a worker that dies
            with nobody left to reap its sandboxes leaves them for at most this long. None:
            sandboxes keep the episode's TTL.
    """

    def __init__(
        self,
        *,
        workers: int | None = None,
        concurrency: int = 4,
        boot_ahead: int | None = None,
        config: SweConfig | None = None,
        backend: str | BackendFactory | None = None,
        agent: str | AgentFactory | None = None,
        max_booting: int = 0,
        max_alive: int = 0,
        limiter_name: str | None = "trio_swe-limiter",
        resources: Sequence[Mapping[str, float]] | None = None,
        placement_group: Any = None,
        num_cpus: float = 1.0,
        name: str | None = None,
        namespace: str | None = None,
        replace_dead: bool = True,
        runtime_env: Mapping[str, Any] | None = None,
        detached: bool = False,
        lease_ttl_sec: float = 60.0,
        orphan_ttl_sec: float | None = DEFAULT_ORPHAN_TTL_SEC,
    ) -> None:
        check_orphan_ttl(orphan_ttl_sec)
        if not (lease_ttl_sec > 0 and math.isfinite(lease_ttl_sec)):
            raise ConfigError(f"lease_ttl_sec must be a positive number, not {lease_ttl_sec}")
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, not {concurrency}")
        if boot_ahead is not None and not 0 <= boot_ahead <= concurrency:
            # More would wait longer than one agent's budget for a slot (see run_episode).
            raise ConfigError(f"boot_ahead must be between 0 and concurrency, not {boot_ahead}")
        if workers is not None and workers < 1:
            raise ConfigError(f"workers must be >= 1 (or None: one per node), not {workers}")
        if max_booting < 0 or max_alive < 0:
            raise ConfigError("max_booting and max_alive must be >= 0 (0: no cap)")
        self.concurrency = concurrency
        self.boot_ahead = concurrency if boot_ahead is None else boot_ahead
        self.config = config if config is not None else SweConfig.from_env()
        self._n_workers = workers
        self._backend = backend
        self._agent = agent
        self._max_booting = max_booting
        self._max_alive = max_alive
        self._limiter_name = limiter_name
        self._resources = list(resources) if resources is not None else None
        self._placement_group = placement_group
        self._num_cpus = num_cpus
        self._name = name
        self._namespace = namespace
        self._replace_dead = replace_dead
        self._runtime_env = dict(runtime_env) if runtime_env is not None else None
        self._detached = detached
        self._lease_ttl = lease_ttl_sec
        self._orphan_ttl = orphan_ttl_sec
        self._workers: list[_Worker] = []
        self._limiter: ActorHandle | None = None
        self._changed = trio.Event()
        self._started = False
        self.reruns = 0
        self.deaths = 0
        self.reaps = 0
        self.reaped = 0

    # -- lifecycle ----------------------------------------------------------------------------
    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the workers this pool started (a shared pool's workers stay up: :meth:`shutdown`)."""
        await self._aclose_trio(self._name is None)

    async def shutdown(self) -> None:
        """Stop every worker of the pool, shared or not."""
        await self._aclose_trio(True)

    async def start(self) -> None:
        """Start the workers (and the limiter) and wait until every one is ready."""
        if self._started:
            return
        if not ray.is_initialized():
            raise WorkerPoolError("Ray is not initialised: call ray.init(...) first")
        if self._max_booting or self._max_alive:
            self._limiter = open_limiter(
                max_booting=self._max_booting,
                max_alive=self._max_alive,
                holder_ttl_sec=self._lease_ttl,
                name=self._limiter_name,
                namespace=self._namespace,
                detached=self._detached,
            )
        config = encode_config(self.config)
        for index, options in enumerate(self._placements()):
            self._workers.append(self._spawn(index, options, config))
        self._started = True
        for worker in list(self._workers):
            try:
                worker.mark_live(await wait_ref(worker.ready_ref))
            except ray.exceptions.RayError as exc:
                await self._aclose_trio(True)
                raise WorkerPoolError(f"rollout worker {worker.index} failed to start: {exc}")

    def _placements(self) -> list[dict[str, Any]]:
        base: dict[str, Any] = {"num_cpus": self._num_cpus, "max_concurrency": 100_000}
        if self._runtime_env is not None:
            base["runtime_env"] = self._runtime_env
        if self._placement_group is not None:
            count = self._n_workers or len(self._placement_group.bundle_specs)
            return [
                {
                    **base,
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(
                        self._placement_group, placement_group_bundle_index=i
                    ),
                }
                for i in range(count)
            ]
        if self._resources is not None:
            return [{**base, "resources": dict(r)} for r in self._resources]
        if self._n_workers is not None:
            return [{**base, "scheduling_strategy": "SPREAD"} for _ in range(self._n_workers)]
        nodes = [n for n in cast(list[dict[str, Any]], ray.nodes()) if n.get("Alive")]  # type: ignore[no-untyped-call]
        if not nodes:
            raise WorkerPoolError("the Ray cluster has no alive node")
        return [
            {
                **base,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
            }
            for n in nodes
        ]

    def _spawn(self, index: int, options: dict[str, Any], config: bytes) -> _Worker:
        opts = dict(options)
        worker_id = f"{self._name or 'worker'}-{index}-{uuid.uuid4().hex[:8]}"
        if self._name is not None:
            opts.update(name=f"{self._name}-{index}", get_if_exists=True)
            if self._namespace is not None:
                opts["namespace"] = self._namespace
            if self._detached:
                opts["lifetime"] = "detached"
        handle = RolloutWorker.options(**opts).remote(
            worker_id,
            config,
            self.concurrency,
            self._backend,
            self._agent,
            self._limiter,
            self._orphan_ttl,
            self.boot_ahead,
        )
        return _Worker(index, worker_id, handle, options)

    async def _aclose_trio(self, stop_workers: bool) -> None:
        workers, self._workers = self._workers, []
        self._started = False
        if not stop_workers:
            return
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + 30.0
            # Only live workers close cleanly; one still starting (perhaps never placeable: its
            # node is gone) is killed below without waiting for it.
            refs: list[ObjectRef] = [w.handle.close.remote() for w in workers if w.state == "live"]
            for ref in refs:
                try:
                    await wait_ref(ref)
                except ray.exceptions.RayError:
                    pass
        for w in workers:
            ray.kill(w.handle)

    # -- dispatch -----------------------------------------------------------------------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _acquire(self) -> _Worker:
        """A live worker with a free slot (the least loaded), its slot taken."""
        while True:
            live = [w for w in self._workers if w.state == "live"]
            room = self.concurrency + self.boot_ahead
            free = [w for w in live if w.running < room]
            if free:
                worker = min(free, key=lambda w: w.running)
                worker.running += 1
                return worker
            starting = [w for w in self._workers if w.state == "starting"]
            if not live and not starting:
                raise WorkerPoolError("no rollout worker is alive")
            await self._wait_changed(starting)

    async def _any_live(self) -> _Worker | None:
        """A live worker (waiting for one that is starting), or None when none is left."""
        while True:
            live = [w for w in self._workers if w.state == "live"]
            if live:
                return min(live, key=lambda w: w.running)
            starting = [w for w in self._workers if w.state == "starting"]
            if not starting:
                return None
            await self._wait_changed(starting)

    async def _wait_changed(self, starting: list[_Worker]) -> None:
        """Until a worker of ``starting`` is ready (or failed), or the pool changed."""
        async with trio.open_nursery() as nursery:

            async def watch(w: _Worker, nursery: trio.Nursery = nursery) -> None:
                try:
                    w.mark_live(await wait_ref(w.ready_ref))
                except ray.exceptions.RayError as exc:
                    logger.warning("replacement worker %d failed to start: %s", w.index, exc)
                    w.state = "dead"
                nursery.cancel_scope.cancel()

            async def wait_changed(
                nursery: trio.Nursery = nursery, changed: trio.Event = self._changed
            ) -> None:
                await changed.wait()
                nursery.cancel_scope.cancel()

            for w in starting:
                nursery.start_soon(watch, w)
            nursery.start_soon(wait_changed)

    def _release(self, worker: _Worker) -> None:
        worker.running -= 1
        self._notify()

    def _died(self, worker: _Worker, error: BaseException) -> bool:
        """Mark ``worker`` dead (True the first time): kill it, reclaim its leases, replace it."""
        if worker.state == "dead":
            return False
        logger.warning("rollout worker %d died: %s", worker.index, error)
        worker.state = "dead"
        self.deaths += 1
        try:
            ray.kill(worker.handle)  # unreachable but alive must not keep running episodes
        except Exception:
            pass
        if self._limiter is not None:
            self._limiter.reclaim.remote(worker.worker_id)
        if self._replace_dead and self._started:
            index = max(w.index for w in self._workers) + 1
            options = dict(worker.options)
            strategy = options.get("scheduling_strategy")
            if isinstance(strategy, NodeAffinitySchedulingStrategy):
                # Its node may be gone: prefer it, but go anywhere.
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    strategy.node_id, soft=True
                )
            self._workers.append(self._spawn(index, options, encode_config(self.config)))
        self._workers = [w for w in self._workers if w.state != "dead"]
        self._notify()
        return True

    async def _reap(self, dead: _Worker) -> None:
        """Have a live worker kill the sandboxes ``dead`` left at the provider (shielded,
        bounded: a cancelled driver still reaps; what is missed dies at its short TTL)."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + REAP_TIMEOUT_SEC
            while True:
                reaper = await self._any_live()
                if reaper is None:
                    logger.warning("no live worker to reap worker %s's sandboxes", dead.worker_id)
                    return
                try:
                    killed: list[str] = await wait_ref(reaper.handle.reap.remote(dead.worker_id))
                except ray.exceptions.RayActorError as exc:
                    self._died(reaper, exc)
                    continue
                except ray.exceptions.RayError as exc:
                    logger.warning("reaping worker %s's sandboxes failed: %s", dead.worker_id, exc)
                    return
                self.reaps += 1
                self.reaped += len(killed)
                if killed:
                    logger.warning(
                        "killed %d sandboxes of dead worker %s", len(killed), dead.worker_id
                    )
                return

    async def _run_job(
        self,
        md: InstanceMetadata,
        *,
        batch: str,
        worker: _Worker | None,
        episode_id: str | None,
        sampling_params: Mapping[str, Any] | None,
        network: bool,
        build_samples: bool,
        on_late: Callable[[bytes], None] | None = None,
        group: tuple[str, int] | None = None,
    ) -> tuple[bytes, EpisodeResult] | None:
        """Run one episode on some worker, again elsewhere if that worker dies.

        ``on_late(frame)``: the episode finished on its worker while this call was being
        cancelled (its result would otherwise be lost)."""
        params = dict(sampling_params) if sampling_params is not None else None
        while True:
            if worker is None:
                worker = await self._acquire()
            job = Job(
                key=uuid.uuid4().hex,
                batch=batch,
                md=md,
                episode_id=episode_id,
                sampling_params=params,
                network=network,
                build_samples=build_samples,
                group_id=group[0] if group is not None else None,
                group_index=group[1] if group is not None else 0,
            )
            try:
                ref: ObjectRef = worker.handle.run.remote(encode_job(job))
                try:
                    reply = await wait_ref(ref)
                except trio.Cancelled:
                    late = await cancel_and_wait(ref, timeout_sec=CANCEL_TIMEOUT_SEC)
                    if late and on_late is not None:
                        on_late(late)
                    raise
            except ray.exceptions.RayActorError as exc:
                self._release(worker)
                if self._died(worker, exc):
                    await self._reap(worker)
                self.reruns += 1
                worker = None
                continue
            except BaseException:
                self._release(worker)
                raise
            self._release(worker)
            worker = None
            if not reply:
                return None  # cancelled on the worker (a batch cancel from elsewhere)
            return reply, decode_result(reply)

    # -- public API ---------------------------------------------------------------------------
    async def run_episode(
        self,
        md: InstanceMetadata,
        *,
        episode_id: str | None = None,
        sampling_params: Mapping[str, Any] | None = None,
        network: bool = True,
        build_samples: bool = True,
    ) -> EpisodeResult:
        """One episode on the least loaded worker (again elsewhere if that worker dies)."""
        await self.start()
        out = await self._run_job(
            md,
            batch=uuid.uuid4().hex,
            worker=None,
            episode_id=episode_id,
            sampling_params=sampling_params,
            network=network,
            build_samples=build_samples,
        )
        if out is None:
            raise WorkerPoolError(f"the episode of {md.instance_id} was cancelled on its worker")
        return out[1]

    @asynccontextmanager
    async def rollouts(
        self,
        instances: Iterable[InstanceMetadata | GroupMember],
        *,
        n_per_instance: int = 1,
        done: Collection[tuple[str, int]] = (),
        sampling_params: Mapping[str, Any] | None = None,
        network: bool = True,
        build_samples: bool = True,
        episode_id: Callable[[InstanceMetadata], str] | None = None,
        on_start: Callable[[InstanceMetadata], None] | None = None,
        on_frame: Callable[[bytes, EpisodeResult], None] | None = None,
    ) -> AsyncIterator[trio.MemoryReceiveChannel[EpisodeResult]]:
        """Run ``n_per_instance`` episodes per instance across the workers; stream the results
        as they finish.

        The rollout loop is :func:`trio_swe.rollout.open_rollouts_on`'s (groups, seeds and
        resume as :func:`trio_swe.run_rollouts`): an async context manager whose value is an
        async iterator of results; leaving the block early (or cancelling it) cancels the
        episodes still running and waits until their sandboxes are killed. Instances are pulled
        lazily, when a worker has a free slot.

        ``on_frame(frame, result)`` is called with each result's encoded frame (as a results
        file stores it) before the result is handed out: ``ResultsWriter.write_frame`` appends it
        without encoding it again.
        """
        await self.start()
        runner = _PoolEpisodes(
            self, network=network, build_samples=build_samples, on_frame=on_frame
        )
        async with open_rollouts_on(
            runner,
            instances,
            n_per_instance=n_per_instance,
            done=done,
            sampling_params=sampling_params,
            episode_id=episode_id,
            on_start=on_start,
        ) as results:
            yield results

    # -- inspection ---------------------------------------------------------------------------
    @property
    def workers(self) -> list[WorkerInfo]:
        """The live workers."""
        return [w.info for w in self._workers if w.state == "live" and w.info is not None]

    @property
    def limiter(self) -> ActorHandle | None:
        return self._limiter

    def live_workers(self) -> list[WorkerView]:
        """The live workers: where they run, their actor handle, episodes running on each."""
        return [
            WorkerView(w.info, w.handle, w.running)
            for w in self._workers
            if w.state == "live" and w.info is not None
        ]

    async def worker_statistics(self) -> list[WorkerStatistics]:
        """Each live worker's counters (its backend's among them)."""
        out: list[WorkerStatistics] = []
        for w in self._workers:
            if w.state != "live":
                continue
            raw: bytes = await wait_ref(w.handle.statistics.remote())
            out.append(msgspec.msgpack.decode(raw, type=WorkerStatistics))
        return out

    async def limiter_statistics(self) -> LimiterStatistics | None:
        """The limiter's snapshot (None without a limiter)."""
        if self._limiter is None:
            return None
        raw: bytes = await wait_ref(self._limiter.statistics.remote())
        return msgspec.msgpack.decode(raw, type=LimiterStatistics)

    def statistics(self) -> WorkerPoolStatistics:
        """A snapshot of the pool's workers and what befell them (see the struct's fields)."""
        return WorkerPoolStatistics(
            live=sum(1 for w in self._workers if w.state == "live"),
            starting=sum(1 for w in self._workers if w.state == "starting"),
            running=sum(w.running for w in self._workers),
            deaths=self.deaths,
            reruns=self.reruns,
            reaps=self.reaps,
            reaped=self.reaped,
        )


class _PoolEpisodes:
    """The pool as an :class:`~trio_swe.rollout.EpisodeRunner`: a slot is the least loaded
    worker; an episode runs there (again elsewhere if that worker dies), its frame handed to
    ``on_frame`` before its result, a frame that finished while being cancelled too."""

    def __init__(
        self,
        pool: WorkerPool,
        *,
        network: bool,
        build_samples: bool,
        on_frame: Callable[[bytes, EpisodeResult], None] | None,
    ) -> None:
        self._pool = pool
        self._network, self._build_samples = network, build_samples
        self._on_frame = on_frame
        self._batch = uuid.uuid4().hex

    async def acquire(self) -> object:
        return await self._pool._acquire()

    def _late(self, frame: bytes) -> None:
        if self._on_frame is not None:
            self._on_frame(frame, decode_result(frame))

    async def run(
        self,
        slot: object,
        member: GroupMember,
        *,
        episode_id: str | None,
        sampling_params: Mapping[str, Any] | None,
    ) -> EpisodeResult | None:
        assert isinstance(slot, _Worker)
        got = await self._pool._run_job(
            member.md,
            batch=self._batch,
            worker=slot,
            episode_id=episode_id,
            sampling_params=sampling_params,
            network=self._network,
            build_samples=self._build_samples,
            on_late=self._late,
            group=(member.group_id, member.group_index),
        )
        if got is None:
            return None
        frame, result = got
        if self._on_frame is not None:
            self._on_frame(frame, result)
        return result
