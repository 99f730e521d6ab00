"""The pool from asyncio: :class:`AsyncioWorkerPool`, a :class:`~._pool.WorkerPool` whose
calls run in the asyncio loop's trio guest (:mod:`trio_swe.aio`). The pool itself is trio only.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

from .. import aio
from ..episode import EpisodeResult
from ..grading import InstanceMetadata
from ..rollout import GroupMember
from ._bridge import ActorHandle
from ._leases import LimiterStatistics
from ._pool import WorkerPool, WorkerPoolStatistics, WorkerView
from ._worker import WorkerInfo, WorkerStatistics

__all__ = ["AsyncioWorkerPool"]


class AsyncioWorkerPool:
    """A :class:`~._pool.WorkerPool` driven from asyncio, with the same methods::

        async with AsyncioWorkerPool(concurrency=16) as pool:     # WorkerPool's arguments
            async with pool.rollouts(mds) as results:
                async for result in results:
                    ...

    Args:
        pool: the trio pool to drive (e.g. :func:`~._env.shared_pool`'s); else one is made
            from ``options`` (:class:`~._pool.WorkerPool`'s arguments).
    """

    def __init__(self, pool: WorkerPool | None = None, **options: Any) -> None:
        self.pool = pool if pool is not None else WorkerPool(**options)

    async def __aenter__(self) -> AsyncioWorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        await aio.run(self.pool.start)

    async def aclose(self) -> None:
        await aio.run(self.pool.aclose)

    async def shutdown(self) -> None:
        await aio.run(self.pool.shutdown)

    async def run_episode(self, md: InstanceMetadata, **options: Any) -> EpisodeResult:
        """:meth:`WorkerPool.run_episode <trio_swe.ray.WorkerPool.run_episode>`."""
        return await aio.run(functools.partial(self.pool.run_episode, md, **options))

    def rollouts(
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
    ) -> AbstractAsyncContextManager[AsyncIterator[EpisodeResult]]:
        """:meth:`WorkerPool.rollouts <trio_swe.ray.WorkerPool.rollouts>`: leaving the block
        early cancels the episodes still running and waits for their cleanup."""
        return aio.open_stream(
            functools.partial(
                self.pool.rollouts,
                instances,
                n_per_instance=n_per_instance,
                done=done,
                sampling_params=sampling_params,
                network=network,
                build_samples=build_samples,
                episode_id=episode_id,
                on_start=on_start,
                on_frame=on_frame,
            )
        )

    async def worker_statistics(self) -> list[WorkerStatistics]:
        return await aio.run(self.pool.worker_statistics)

    async def limiter_statistics(self) -> LimiterStatistics | None:
        return await aio.run(self.pool.limiter_statistics)

    def statistics(self) -> WorkerPoolStatistics:
        return self.pool.statistics()

    def live_workers(self) -> list[WorkerView]:
        return self.pool.live_workers()

    @property
    def workers(self) -> list[WorkerInfo]:
        return self.pool.workers

    @property
    def limiter(self) -> ActorHandle | None:
        return self.pool.limiter
