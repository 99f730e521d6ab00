"""``trio-swe report FILE -o report.html``: a results file as one self-contained HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from .._errors import ConfigError
from ..results import read_results

__all__ = ["add_report_parser", "cmd_report"]


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from ..report import write_report

    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"results file {str(path)!r} does not exist")
    if args.max_trajectories < 0:
        raise ConfigError(f"--max-trajectories must be >= 0, not {args.max_trajectories}")
    results, intact = read_results(path)
    if not results:
        raise ConfigError(f"{str(path)!r} holds no results (not a results file of trio-swe run?)")
    if intact < path.stat().st_size:
        console.print(
            f"[yellow]{escape(str(path))}: the last {path.stat().st_size - intact} bytes are a "
            "frame cut short (an interrupted writer); reporting the intact part"
        )
    out = Path(args.output)
    if not out.parent.is_dir():
        raise ConfigError(f"-o {str(out)!r}: the folder {str(out.parent)!r} does not exist")
    size, embedded = write_report(
        results,
        out,
        title=args.title or f"trio-swe report: {path.name}",
        tokenizer=args.tokenizer,
        tool_parser=args.tool_parser,
        max_trajectories=args.max_trajectories,
    )
    console.print(
        f"wrote {escape(str(out))} ({size / 1e6:.1f} MB): {len(results)} episodes, "
        f"{embedded} with their trajectories"
    )
    return 0


def add_report_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``report`` command's flags."""
    report = sub.add_parser(
        "report",
        help="an HTML report of a results file (plots, trajectories)",
        description="Write one self-contained HTML page (no network needed to open it) with "
        "plots of a results file (reward by instance and by group, turns and tokens per "
        "episode, seconds per phase, outcomes and abort reasons over time) and a table to drill "
        "into each episode's trajectory. Needs the report extra: pip install 'trio-swe[report]'.",
    )
    report.add_argument("file", help="a results file (results.msgpack)")
    report.add_argument(
        "-o", "--output", default="report.html", help="the page to write (default: report.html)"
    )
    report.add_argument(
        "--tokenizer",
        default=None,
        help="decode token ids: 'bytes' (the demo; runs without SWE_TOKENIZER) or the run's "
        "checkpoint folder (default: show token ids)",
    )
    report.add_argument(
        "--tool-parser", default="auto", help="tool-call format with --tokenizer (default: auto)"
    )
    report.add_argument(
        "--max-trajectories",
        type=int,
        default=500,
        help="episodes whose trajectories the page embeds, the first ones (default: 500)",
    )
    report.add_argument("--title", default=None, help="the page's title")
