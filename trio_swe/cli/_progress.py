"""A run's episodes with a live display: here (an agent on a backend) or on a Ray pool.

On a terminal, a progress bar and the run's figures (:class:`._live.LiveStats`) redrawn in
place; otherwise (a pipe, a log file, ``--no-progress``) a line per finished episode and the
figures on one plain line every ``every`` seconds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import trio
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..agents import Agent
from ..config import SweConfig
from ..episode import EpisodeResult
from ..grading import InstanceMetadata
from ..results import ResultsWriter
from ..rollout import GroupMember, run_rollouts
from ..sandbox import Backend
from ._live import LiveStats

__all__ = ["run_with_progress"]


async def run_with_progress(
    console: Console,
    mds: Sequence[InstanceMetadata | GroupMember],
    agent: Agent | None,
    *,
    backend: Backend | None,
    config: SweConfig,
    concurrency: int,
    writer: ResultsWriter | None,
    network: bool,
    show_progress: bool,
    every: float = 30.0,
    on_result: Callable[[EpisodeResult], None] | None = None,
    pool: Any = None,
    keep_eval_artifacts: bool = False,
) -> list[EpisodeResult]:
    """Run ``mds`` with a live display: here (``agent`` on ``backend``), or on a Ray ``pool``.

    ``show_progress`` asks for the live display (drawn only on a terminal); ``every`` is the
    period of the plain figures line otherwise (0: none).
    """
    stats = LiveStats(len(mds), trio.current_time())
    live_display = show_progress and console.is_terminal
    progress = Progress(
        TextColumn("[bold]episodes"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    bar = progress.add_task("episodes", total=len(mds))
    results: list[EpisodeResult] = []

    def render() -> Group:
        return Group(progress, *stats.lines(trio.current_time()))

    live = Live(render(), console=console, refresh_per_second=4, get_renderable=render)
    if pool is not None:
        # Workers send each result as the frame a results file stores: append it as it is.
        stream_cm: Any = pool.rollouts(
            mds,
            network=network,
            on_start=stats.on_start,
            on_frame=(lambda frame, _: writer.write_frame(frame)) if writer else None,
        )
    else:
        assert agent is not None
        assert backend is not None
        stream_cm = run_rollouts(
            mds,
            agent,
            backend=backend,
            config=config,
            concurrency=concurrency,
            network=network,
            on_start=stats.on_start,
            keep_eval_artifacts=keep_eval_artifacts,
        )

    async def plain_lines() -> None:
        while True:
            await trio.sleep(every)
            console.print(stats.line(trio.current_time()), highlight=False, soft_wrap=True)

    with live if live_display else contextlib.nullcontext(live):
        async with trio.open_nursery() as nursery:
            if not live_display and every > 0:
                nursery.start_soon(plain_lines)
            async with stream_cm as stream:
                async for result in stream:
                    if writer is not None and pool is None:
                        writer.write(result)
                    results.append(result)
                    stats.on_result(result)
                    progress.update(bar, advance=1)
                    if not live_display:
                        console.print(
                            f"done {result.instance_id} {result.status} reward {result.reward:g}",
                            highlight=False,
                        )
                    if on_result is not None:
                        on_result(result)
            nursery.cancel_scope.cancel()
    if not live_display:
        console.print(stats.line(trio.current_time()), highlight=False, soft_wrap=True)
    return results
