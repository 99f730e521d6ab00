"""``trio-swe results FILE``: a results file's summary, or its export (JSONL, predictions)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from .._errors import ConfigError
from ..results import predictions_jsonl, read_results, results_jsonl
from ._render import print_summary

__all__ = ["cmd_results"]


def check_results_flags(args: argparse.Namespace) -> None:
    """Refuse flags that would do nothing with the format asked for (a silent no-op misleads)."""
    useless = [
        flag
        for flag, given, formats in (
            ("--samples", args.samples, ("jsonl",)),
            ("--all", args.all, ("table",)),
            ("--model", args.model is not None, ("predictions",)),
            ("-o/--output", args.output is not None, ("jsonl", "predictions")),
        )
        if given and args.format not in formats
    ]
    if useless:
        raise ConfigError(
            f"{', '.join(useless)}: not used with --format {args.format} (see trio-swe results "
            "--help)"
        )


def cmd_results(args: argparse.Namespace, console: Console) -> int:
    check_results_flags(args)
    path = Path(args.file)
    if not path.is_file():
        raise ConfigError(f"results file {str(path)!r} does not exist")
    results, intact = read_results(path)
    size = path.stat().st_size
    if intact == 0 and size > 0:
        raise ConfigError(
            f"{str(path)!r} is not a results file (as `trio-swe run --out` writes): no result "
            "could be read from its start"
        )
    if intact < size:
        console.print(
            f"[yellow]{path}: the last {size - intact} bytes are a frame cut "
            "short (an interrupted writer); reading the intact part"
        )
    if args.format == "table":
        print_summary(console, results, every=args.all)
        return 0
    if args.format == "jsonl":
        lines = results_jsonl(results, samples=args.samples)
    else:
        lines = predictions_jsonl(results, model=args.model or "trio-swe")
    data = b"".join(lines)
    if args.output in (None, "-"):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        try:
            Path(args.output).write_bytes(data)
        except OSError as exc:
            raise ConfigError(f"-o {args.output!r}: {exc.strerror or exc}") from None
        console.print(f"wrote {len(lines)} lines to {args.output}")
    return 0
