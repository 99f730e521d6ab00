"""The entry point: parse, dispatch to the command's module, turn errors and signals into exit
codes (2 for bad input, 130 on Ctrl-C, 143 on SIGTERM)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

import trio
from rich.console import Console
from rich.markup import escape

from .._errors import TrioSweError
from .._groups import leaves
from ._parser import build_parser
from .demo import cmd_demo
from .grade import cmd_grade
from .results import cmd_results
from .run import cmd_run

__all__ = ["main"]

Command = Callable[[argparse.Namespace, Console], Awaitable[int]]

#: The commands that run under trio, by name.
COMMANDS: dict[str, Command] = {"run": cmd_run, "grade": cmd_grade, "demo": cmd_demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trio-swe`` console script."""
    args = build_parser().parse_args(argv)
    # Importing swebench sets the root logger to INFO (logging.basicConfig): httpx would then
    # print a line per request (every policy call) through the live display.
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # A pipe or a file gets a wide, plain console (no cursor tricks, no wrapped ids).
    console = Console() if sys.stdout.isatty() else Console(width=140, no_color=True)
    if args.command == "results":
        try:
            return cmd_results(args, console)
        except TrioSweError as exc:
            console.print(f"[red]error: {escape(str(exc))}")
            return 2
    if getattr(args, "concurrency", 1) < 1:
        console.print("[red]--concurrency must be >= 1")
        return 2
    command = COMMANDS[args.command]
    try:
        code = trio.run(_interruptible, command, args, console)
    except BaseException as exc:
        if _only(exc, KeyboardInterrupt) is not None:  # a Ctrl-C before the receiver was open
            code = 128 + signal.SIGINT
        else:
            error = _only(exc, TrioSweError)
            if error is not None:
                console.print(f"[red]error: {escape(str(error))}")  # `[swebench]` is not markup
                return 2
            raise
    if code in _SIGNALLED:
        console.print(
            "[yellow]interrupted: every finished episode is in the results file; "
            "rerun the same command to resume"
        )
    return code


#: Exit codes of a run stopped by a signal, as a shell reports them (128 + the signal).
_SIGNALLED = {128 + signal.SIGINT, 128 + signal.SIGTERM}


async def _interruptible(command: Command, args: argparse.Namespace, console: Console) -> int:
    """Run ``command`` with Ctrl-C and SIGTERM turned into a cancellation of it (exit 130, 143).

    Left to itself, trio raises KeyboardInterrupt wherever the code happens to be, possibly
    halfway through a lock or a TLS stream's state; the cleanup that follows then meets that
    broken state (a sandbox kill that never goes out, a shielded close waiting out its bound).
    A cancellation instead runs every cleanup as any other does. A second signal exits at once.
    """
    received: list[int] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    if received:
                        console.print("[red]interrupted again: exiting without cleanup")
                        sys.stdout.flush()
                        os._exit(128 + signum)
                    received.append(signum)
                    console.print("[yellow]interrupted: cleaning up (Ctrl-C again to skip)")
                    nursery.cancel_scope.cancel()

            nursery.start_soon(watch)
            code: int = await command(args, console)
            nursery.cancel_scope.cancel()
    return 128 + received[0] if received else code


def _only(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """``exc`` if it is a ``kind``, or the first ``kind`` of a group made only of them."""
    members = leaves(exc)
    return members[0] if all(isinstance(m, kind) for m in members) else None
