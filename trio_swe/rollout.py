"""Many episodes: ``open_rollouts`` (also ``run_rollouts``) streams results as they finish.

``open_rollouts`` runs episodes with a concurrency limit inside its own nursery and hands each
:class:`~trio_swe.EpisodeResult` out the moment it is ready. Leaving the block early cancels the
episodes still running (their sandboxes are killed on the way out).

slime's generate function lives in :mod:`trio_swe.integrations.slime`, results files in
:mod:`trio_swe.results`.
"""

from __future__ import annotations

import collections
import hashlib
import math
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, NamedTuple, Protocol

import trio

from ._boot import boot_limiter
from ._errors import ConfigError
from ._groups import open_private_nursery
from .agents import Agent
from .config import SweConfig
from .episode import EpisodeResult, run_episode
from .grading import InstanceMetadata
from .sandbox import Backend

__all__ = [
    "EpisodeRunner",
    "GroupMember",
    "LocalEpisodes",
    "episode_seed",
    "open_rollouts",
    "open_rollouts_on",
    "plan_groups",
    "run_rollouts",
]

#: Seeds stay below 2**30, so a seed plus a turn index (what agents send) fits in an int32.
_SEED_BITS = 30


class GroupMember(NamedTuple):
    """One episode to run: the instance, its group, its place and the group's size."""

    md: InstanceMetadata
    group_id: str
    group_index: int
    group_size: int = 1


def plan_groups(
    instances: Iterable[InstanceMetadata],
    n_per_instance: int = 1,
    *,
    done: Collection[tuple[str, int]] = (),
) -> Iterator[GroupMember]:
    """The episodes of ``instances``: ``n_per_instance`` per instance, lazily, in order.

    An instance's group is its id; an instance that appears again in ``instances`` (a dataset
    that repeats rows for more samples) makes a group of its own per occurrence,
    ``ID~1``, ``ID~2``... The names depend only on ``instances``' order, so a rerun over the
    same instances names the same groups. Members whose ``(group_id, group_index)`` is in
    ``done`` (a resumed run's finished episodes) are left out.
    """
    if n_per_instance < 1:
        raise ConfigError(f"n_per_instance must be >= 1, not {n_per_instance}")
    seen: collections.Counter[str] = collections.Counter()
    for md in instances:
        yield from _group_of(md, seen, n_per_instance, done)


def episode_seed(group_id: str, group_index: int, run_seed: int | None = None) -> int:
    """The sampling seed of one group member: stable, distinct per member, below 2**30.

    A hash of the run's seed (when there is one), the group and the index: the same run seed
    gives the same episodes' seeds on every rerun (a resumed run too), another run seed others.
    """
    key = f"{'' if run_seed is None else int(run_seed)}\0{group_id}\0{group_index}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _SEED_BITS)


def _member_params(
    member: GroupMember, sampling_params: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """The sampling parameters of one member: its own seed when the run is seeded or grouped.

    Ungrouped runs without a seed sample unseeded, as before groups existed.
    """
    run_seed = (sampling_params or {}).get("seed")
    if run_seed is None and member.group_size == 1:
        return sampling_params
    seed = episode_seed(member.group_id, member.group_index, run_seed)
    return {**(sampling_params or {}), "seed": seed}


@asynccontextmanager
async def open_rollouts(
    instances: Iterable[InstanceMetadata | GroupMember],
    agent: Agent,
    *,
    backend: Backend,
    config: SweConfig | None = None,
    concurrency: int = 4,
    boot_ahead: int | None = None,
    n_per_instance: int = 1,
    done: Collection[tuple[str, int]] = (),
    sampling_params: Mapping[str, Any] | None = None,
    network: bool = True,
    build_samples: bool = True,
    keep_eval_artifacts: bool = False,
    episode_id: Callable[[InstanceMetadata], str] | None = None,
    on_start: Callable[[InstanceMetadata], None] | None = None,
) -> AsyncIterator[trio.MemoryReceiveChannel[EpisodeResult]]:
    """Run ``n_per_instance`` episodes per instance, at most ``concurrency`` agents at a time;
    stream the results.

    Use it as an async context manager whose value is an async iterator of results, in the
    order they finish::

        async with open_rollouts(mds, agent, backend=LocalBackend(), concurrency=8) as results:
            async for result in results:
                print(result.instance_id, result.status, result.reward)

    Leaving the block before the iterator is exhausted cancels the episodes still running.
    Instances are pulled from ``instances`` lazily, only when a slot is free.

    Only the agents hold the ``concurrency`` slots: up to ``boot_ahead`` more episodes boot and
    prepare their sandboxes, then wait for a slot, or grade after theirs, so the policy serves
    ``concurrency`` agents while boots and grading run around them (without it, episodes that
    start together boot and grade together and leave the policy idle meanwhile). The wait for
    a slot counts against neither the agent's budget nor the episode's guard. At most
    ``concurrency + boot_ahead`` episodes hold sandboxes at once.

    Groups (GRPO): each instance's ``n_per_instance`` episodes are a group (see
    :func:`plan_groups`); every episode has its own sandbox and its own seed
    (:func:`episode_seed` of ``sampling_params["seed"]`` when given), put in the sampling
    parameters its agent uses; each result carries ``group_id`` and ``group_index``, and
    :func:`trio_swe.results.group_advantages` computes the advantages from a results file.

    Args:
        instances: the instances (from :func:`trio_swe.grading.get_metadata`), or the
            members :func:`plan_groups` made (a resumed run's remaining episodes), run as they
            are.
        agent: the agent every episode uses (it must be safe to run concurrently, as the
            built-in agents are).
        backend: where sandboxes come from.
        config: budgets and limits; :meth:`SweConfig.from_env` when None.
        concurrency: agents running at once (boots are further limited by
            ``config.boot.concurrency``).
        boot_ahead: episodes booting, waiting for a slot or grading beside them, at most
            ``concurrency`` (its default; 0: each episode holds its slot from boot to grade).
        n_per_instance: episodes per instance (a group each).
        done: ``(group_id, group_index)`` of episodes already finished: not run again.
        sampling_params: sampling parameters for every policy call (a ``seed`` in them is the
            run's seed, from which each episode's own is derived).
        network: whether agent sandboxes get network access.
        build_samples: False skips building samples.
        keep_eval_artifacts: each result keeps what its grading ran and saw
            (:attr:`EpisodeResult.eval_artifacts`), e.g. to write the SWE-bench harness's files.
        episode_id: makes each episode's id from its instance (default: a fresh unique id).
        on_start: called as each episode starts (progress displays).
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, not {concurrency}")
    if boot_ahead is not None and not 0 <= boot_ahead <= concurrency:
        # More would wait longer than one agent's budget for a slot (see run_episode).
        raise ConfigError(f"boot_ahead must be between 0 and concurrency, not {boot_ahead}")
    cfg = config if config is not None else SweConfig.from_env()
    runner = LocalEpisodes(
        agent,
        backend=backend,
        config=cfg,
        concurrency=concurrency,
        boot_ahead=concurrency if boot_ahead is None else boot_ahead,
        network=network,
        build_samples=build_samples,
        keep_eval_artifacts=keep_eval_artifacts,
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


class EpisodeRunner(Protocol):
    """Where and how :func:`open_rollouts_on` runs one episode: here
    (:class:`LocalEpisodes`), or on a Ray pool's workers (``WorkerPool``)."""

    async def acquire(self) -> object:
        """Wait for room for one more episode; the slot :meth:`run` gets (and releases)."""
        ...

    async def run(
        self,
        slot: object,
        member: GroupMember,
        *,
        episode_id: str | None,
        sampling_params: Mapping[str, Any] | None,
    ) -> EpisodeResult | None:
        """Run ``member``'s episode in ``slot``, release the slot; None: cancelled elsewhere
        (no result to hand out)."""
        ...


class LocalEpisodes:
    """Episodes in this trio run: :func:`~trio_swe.run_episode`, ``concurrency`` agents at a
    time and ``boot_ahead`` more episodes booting, waiting or grading beside them (see
    :func:`open_rollouts`), boots under this run's shared boot limiter."""

    def __init__(
        self,
        agent: Agent,
        *,
        backend: Backend,
        config: SweConfig,
        concurrency: int,
        boot_ahead: int = 0,
        network: bool = True,
        build_samples: bool = True,
        keep_eval_artifacts: bool = False,
    ) -> None:
        self.agent, self.backend, self.config = agent, backend, config
        self.network, self.build_samples = network, build_samples
        self.keep_eval_artifacts = keep_eval_artifacts
        # Episodes alive (holding sandboxes), and among them the agents running: with no boot
        # ahead the one limiter serves as both, and an episode holds its slot throughout.
        self._slots = trio.CapacityLimiter(concurrency + boot_ahead)
        self._agents = trio.CapacityLimiter(concurrency) if boot_ahead else None
        self._boot = boot_limiter(config)

    async def acquire(self) -> object:
        borrower = object()  # a group's members are equal: each needs its own token
        await self._slots.acquire_on_behalf_of(borrower)
        return borrower

    async def run(
        self,
        slot: object,
        member: GroupMember,
        *,
        episode_id: str | None,
        sampling_params: Mapping[str, Any] | None,
    ) -> EpisodeResult:
        try:
            return await run_episode(
                member.md,
                self.agent,
                backend=self.backend,
                config=self.config,
                episode_id=episode_id,
                sampling_params=sampling_params,
                limiter=self._boot,
                agent_slots=self._agents,
                network=self.network,
                build_samples=self.build_samples,
                group_id=member.group_id,
                group_index=member.group_index,
                keep_eval_artifacts=self.keep_eval_artifacts,
            )
        finally:
            self._slots.release_on_behalf_of(slot)


@asynccontextmanager
async def open_rollouts_on(
    runner: EpisodeRunner,
    instances: Iterable[InstanceMetadata | GroupMember],
    *,
    n_per_instance: int = 1,
    done: Collection[tuple[str, int]] = (),
    sampling_params: Mapping[str, Any] | None = None,
    episode_id: Callable[[InstanceMetadata], str] | None = None,
    on_start: Callable[[InstanceMetadata], None] | None = None,
) -> AsyncIterator[trio.MemoryReceiveChannel[EpisodeResult]]:
    """The rollout loop, once for every runner: :func:`open_rollouts` on ``runner``.

    Members are planned lazily (:func:`plan_groups`) and started when ``runner`` has room
    (``on_start`` as each one is); results stream in the order they finish; leaving the block
    cancels what still runs.
    """
    if n_per_instance < 1:
        raise ConfigError(f"n_per_instance must be >= 1, not {n_per_instance}")
    send, receive = trio.open_memory_channel[EpisodeResult](math.inf)

    async def one(
        member: GroupMember, slot: object, out: trio.MemorySendChannel[EpisodeResult]
    ) -> None:
        async with out:
            if on_start is not None:
                on_start(member.md)
            result = await runner.run(
                slot,
                member,
                episode_id=episode_id(member.md) if episode_id is not None else None,
                sampling_params=_member_params(member, sampling_params),
            )
            if result is not None:
                await out.send(result)

    async def drive(nursery: trio.Nursery) -> None:
        async with send:
            for member in _members(instances, n_per_instance, done):
                slot = await runner.acquire()
                nursery.start_soon(one, member, slot, send.clone())

    # The nursery is ours: the consumer's own exception comes out as itself, not in a group.
    async with open_private_nursery("an episode of run_rollouts") as nursery:
        nursery.start_soon(drive, nursery)
        async with receive:
            yield receive
        # The consumer is done (exhausted the results, or left early): stop what still runs.
        nursery.cancel_scope.cancel()


def _members(
    items: Iterable[InstanceMetadata | GroupMember],
    n_per_instance: int,
    done: Collection[tuple[str, int]],
) -> Iterator[GroupMember]:
    """Instances planned into groups (lazily); members planned already pass as they are."""
    seen: collections.Counter[str] = collections.Counter()
    for item in items:
        if isinstance(item, GroupMember):
            yield item
        else:
            yield from _group_of(item, seen, n_per_instance, done)


def _group_of(
    md: InstanceMetadata,
    seen: collections.Counter[str],
    n_per_instance: int,
    done: Collection[tuple[str, int]],
) -> Iterator[GroupMember]:
    occurrence = seen[md.instance_id]
    seen[md.instance_id] += 1
    group_id = md.instance_id if occurrence == 0 else f"{md.instance_id}~{occurrence}"
    for index in range(n_per_instance):
        if (group_id, index) not in done:
            yield GroupMember(md, group_id, index, n_per_instance)


#: The same as :func:`open_rollouts` (its first name; trio names resource openers ``open_*``).
run_rollouts = open_rollouts
