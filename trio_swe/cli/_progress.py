"""A run's episodes with a live display: here (an agent on a backend) or on a Ray pool."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..agents import Agent
from ..config import SweConfig
from ..episode import EpisodeResult
from ..grading import InstanceMetadata
from ..results import ResultsWriter
from ..rollout import run_rollouts
from ..sandbox import Backend
from ._render import Tally

__all__ = ["run_with_progress"]


async def run_with_progress(
    console: Console,
    mds: list[InstanceMetadata],
    agent: Agent | None,
    *,
    backend: Backend | None,
    config: SweConfig,
    concurrency: int,
    writer: ResultsWriter | None,
    network: bool,
    show_progress: bool,
    on_result: Callable[[EpisodeResult], None] | None = None,
    pool: Any = None,
    keep_eval_artifacts: bool = False,
) -> list[EpisodeResult]:
    """Run ``mds`` with a live display: here (``agent`` on ``backend``), or on a Ray ``pool``."""
    tally = Tally(len(mds))
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
        return Group(progress, tally.line())

    live = Live(render(), console=console, refresh_per_second=8, auto_refresh=show_progress)
    if pool is not None:
        # Workers send each result as the frame a results file stores: append it as it is.
        stream_cm: Any = pool.rollouts(
            mds,
            network=network,
            on_start=tally.started,
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
            on_start=tally.started,
            keep_eval_artifacts=keep_eval_artifacts,
        )
    with live if show_progress else contextlib.nullcontext(live):
        async with stream_cm as stream:
            async for result in stream:
                if writer is not None and pool is None:
                    writer.write(result)
                results.append(result)
                tally.finished(result)
                progress.update(bar, advance=1)
                live.update(render())
                if not show_progress:
                    console.print(
                        f"done {result.instance_id} {result.status} reward {result.reward:g}"
                    )
                if on_result is not None:
                    on_result(result)
    if not show_progress:
        console.print(tally.line())
    return results
