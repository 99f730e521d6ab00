"""``trio-swe results FILE``: a results file's summary, or its export (JSONL, predictions)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from .._errors import ConfigError
from ..results import predictions_jsonl, read_results, results_jsonl
from ._render import SUMMARY_ROWS, aggregate_table, summary_table

__all__ = ["cmd_results"]


def cmd_results(args: argparse.Namespace, console: Console) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"results file {str(path)!r} does not exist")
    results, intact = read_results(path)
    if intact < path.stat().st_size:
        console.print(
            f"[yellow]{path}: the last {path.stat().st_size - intact} bytes are a frame cut "
            "short (an interrupted writer); reading the intact part"
        )
    if args.format == "table":
        if len(results) <= SUMMARY_ROWS or args.all:
            console.print(summary_table(results))
        console.print(aggregate_table(results))
        return 0
    if args.format == "jsonl":
        lines = results_jsonl(results, samples=args.samples)
    else:
        lines = predictions_jsonl(results, model=args.model)
    data = b"".join(lines)
    if args.output in (None, "-"):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        Path(args.output).write_bytes(data)
        console.print(f"wrote {len(lines)} lines to {args.output}")
    return 0
