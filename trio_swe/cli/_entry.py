"""Where the ``trio-swe`` command starts: Ctrl-C (and SIGTERM) are handled before anything else.

Importing the commands takes most of a second (trio, httpx, rich, msgspec...). A Ctrl-C in that
time used to raise KeyboardInterrupt wherever the import was: a traceback, and an exit by the
signal (-2) instead of 130 (issue 27). So this module imports only the standard library's cheap
parts, and :func:`console` takes SIGINT and SIGTERM over before importing the rest: until the
run's own receiver takes them (:func:`._main._interruptible`, which cancels the run and cleans
up), and again once it has let go, a signal ends the process at once with 128 + its number and
one line: there is nothing to clean up then (no episode runs outside that receiver). That covers
the imports, the argument parsing, ``results``/``report``, trio's own start and end and the
interpreter's shutdown, where a KeyboardInterrupt would print "Exception ignored" and a traceback.

Only what Python does before this module runs is left: its start-up (~8 ms here; a Ctrl-C ends
the process by the signal, silently) then ``site`` and the import of this package (~8 ms; a Ctrl-C
there is a KeyboardInterrupt with a traceback). ``trio_swe/__init__.py`` and ``cli/__init__.py``
import nothing else for that reason.
"""

from __future__ import annotations

import os
import signal
import sys

TYPE_CHECKING = False  # not from typing: importing it costs more than this whole module
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import FrameType
    from typing import Any, NoReturn

__all__ = ["console", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``trio-swe`` command in this process; its exit code (130 on Ctrl-C)."""
    try:
        from ._main import main as run_command

        return run_command(argv)
    except KeyboardInterrupt:  # in this process, Python's own handler raises it
        print("interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def console() -> NoReturn:
    """The ``trio-swe`` console script (``[project.scripts]``) and ``python -m trio_swe.cli``."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        # Python's (or the default) handler only: one that ignores the signal (``nohup``, a
        # shell's background job) keeps ignoring it.
        if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL):
            signal.signal(signum, _exit_at_once)
    sys.exit(main())


def _exit_at_once(signum: int, frame: FrameType | None, _os: Any = os, _sys: Any = sys) -> None:
    """End the process with 128 + ``signum``, output flushed, no traceback.

    The modules are bound as defaults: in the interpreter's shutdown, module globals are gone.
    """
    for stream in (_sys.stdout, _sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # closed, a broken pipe, or the very write this signal interrupted
            pass
    _os.write(2, b"interrupted\n")
    _os._exit(128 + signum)
