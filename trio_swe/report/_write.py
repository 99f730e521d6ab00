"""The report's one I/O step: results in, an HTML file out."""

from __future__ import annotations

import os

from ..episode import EpisodeResult
from ..trajectories import load_turn_text
from ._data import report_data
from ._html import render_html

__all__ = ["write_report"]


def write_report(
    results: list[EpisodeResult],
    out: str | os.PathLike[str],
    *,
    title: str = "trio-swe run",
    tokenizer: str | None = None,
    tool_parser: str = "auto",
    max_trajectories: int = 500,
) -> tuple[int, int]:
    """Render the report of ``results`` into the file ``out`` (written whole, then renamed into
    place); returns its size in bytes and how many episodes' trajectories it embeds. ``tokenizer``: ``bytes`` or a checkpoint folder to decode
    the trajectories' token ids (see :func:`~trio_swe.trajectories.load_turn_text`).

    Raises:
        ConfigError: plotly is missing, or the tokenizer does not load.
    """
    text = load_turn_text(tokenizer, tool_parser=tool_parser) if tokenizer else None
    data = report_data(
        results, title=title, text=text, tokenizer=tokenizer, max_trajectories=max_trajectories
    )
    page = render_html(data).encode("utf-8")
    path = os.fspath(out)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(page)
    os.replace(tmp, path)
    return len(page), len(data.episodes)
