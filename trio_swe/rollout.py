"""Many episodes: ``open_rollouts`` (also ``run_rollouts``) streams results as they finish.

``open_rollouts`` runs episodes with a concurrency limit inside its own nursery and hands each
:class:`~trio_swe.EpisodeResult` out the moment it is ready. Leaving the block early cancels the
episodes still running (their sandboxes are killed on the way out).

slime's generate function lives in :mod:`trio_swe.integrations.slime`, results files in
:mod:`trio_swe.results`.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from ._errors import ConfigError
from ._groups import open_private_nursery
from .agents import Agent
from .config import SweConfig
from .episode import EpisodeResult, boot_limiter, run_episode
from .grading import InstanceMetadata
from .sandbox import Backend

__all__ = ["open_rollouts", "run_rollouts"]


@asynccontextmanager
async def open_rollouts(
    instances: Iterable[InstanceMetadata],
    agent: Agent,
    *,
    backend: Backend,
    config: SweConfig | None = None,
    concurrency: int = 4,
    sampling_params: Mapping[str, Any] | None = None,
    network: bool = True,
    build_samples: bool = True,
    episode_id: Callable[[InstanceMetadata], str] | None = None,
    on_start: Callable[[InstanceMetadata], None] | None = None,
) -> AsyncIterator[trio.MemoryReceiveChannel[EpisodeResult]]:
    """Run one episode per instance, at most ``concurrency`` at a time; stream the results.

    Use it as an async context manager whose value is an async iterator of results, in the
    order they finish::

        async with open_rollouts(mds, agent, backend=LocalBackend(), concurrency=8) as results:
            async for result in results:
                print(result.instance_id, result.status, result.reward)

    Leaving the block before the iterator is exhausted cancels the episodes still running.
    Instances are pulled from ``instances`` lazily, only when a slot is free.

    Args:
        instances: the instances (from :func:`trio_swe.grading.get_metadata`).
        agent: the agent every episode uses (it must be safe to run concurrently, as the
            built-in agents are).
        backend: where sandboxes come from.
        config: budgets and limits; :meth:`SweConfig.from_env` when None.
        concurrency: episodes running at once (boots are further limited by
            ``config.boot.concurrency``).
        sampling_params: SGLang sampling parameters for every policy call.
        network: whether agent sandboxes get network access.
        build_samples: False skips building samples.
        episode_id: makes each episode's id from its instance (default: a fresh unique id).
        on_start: called as each episode starts (progress displays).
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, not {concurrency}")
    cfg = config if config is not None else SweConfig.from_env()
    shared_boot = boot_limiter(cfg)
    send, receive = trio.open_memory_channel[EpisodeResult](math.inf)
    slots = trio.CapacityLimiter(concurrency)

    async def one(
        md: InstanceMetadata, borrower: object, out: trio.MemorySendChannel[EpisodeResult]
    ) -> None:
        async with out:
            if on_start is not None:
                on_start(md)
            try:
                result = await run_episode(
                    md,
                    agent,
                    backend=backend,
                    config=cfg,
                    episode_id=episode_id(md) if episode_id is not None else None,
                    sampling_params=sampling_params,
                    limiter=shared_boot,
                    network=network,
                    build_samples=build_samples,
                )
            finally:
                slots.release_on_behalf_of(borrower)
            await out.send(result)

    async def drive(nursery: trio.Nursery) -> None:
        async with send:
            for md in instances:
                borrower = object()  # equal instances (n samples per prompt) need their own token
                await slots.acquire_on_behalf_of(borrower)
                nursery.start_soon(one, md, borrower, send.clone())

    # The nursery is ours: the consumer's own exception comes out as itself, not in a group.
    async with open_private_nursery("an episode of run_rollouts") as nursery:
        nursery.start_soon(drive, nursery)
        async with receive:
            yield receive
        # The consumer is done (exhausted the results, or left early): stop what still runs.
        nursery.cancel_scope.cancel()


#: The same as :func:`open_rollouts` (its first name; trio names resource openers ``open_*``).
run_rollouts = open_rollouts
