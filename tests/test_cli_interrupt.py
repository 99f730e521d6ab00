"""Ctrl-C at any moment of ``trio-swe run``/``demo`` exits 130 without a traceback (issue 27).

Each case is a real process started as the console script starts it (``[project.scripts]`` in
pyproject.toml, so the entry point under test is this checkout's) and sent one SIGINT.

When: the moments are phases the process shows, not times after the spawn, so that a loaded
machine does not move them (MOMENTS): as soon as the entry has taken SIGINT over (seen in
``/proc/<pid>/status``: SigCgt has SIGTERM, which the entry takes with SIGINT and Python alone
never does); after ``trio`` is imported (``python -X importtime`` writes a line to stderr as
each import ends), which the old command did while nothing handled Ctrl-C (its first 0.4-0.8 s)
and the new one does after its entry took over; and after the command's first line of output
(the run has started). From each, a few delays (a schedule, not a race fix) cover the rest of
the imports, the parsing, trio's start, the run and its cleanup. The cases run at once.

Not covered, because no code of ours has run yet: Python's start-up (until it installs its
SIGINT handler, a SIGINT kills the process silently, -2) and ``site`` plus the console script's
first import (a SIGINT there is a KeyboardInterrupt with a traceback). Measured by polling
SigCgt: ~8 ms from exec to Python's handler, then a median ~8 ms to the entry's on an idle
machine (15 ms median, 0.2 s worst of 20 at load 6-11 on 2 cores).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from functools import partial
from pathlib import Path

import pytest
import trio

from trio_swe.demo import build_demo_set

ROOT = Path(__file__).resolve().parents[1]

#: The console script's entry, as pip writes the script: ``sys.exit(func())`` after the import.
_MODULE, _FUNC = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][
    "trio-swe"
].split(":")
SCRIPT = f"import sys; from {_MODULE} import {_FUNC}; sys.exit({_FUNC}())"

#: ``-X importtime``'s line for ``trio`` (indented by how deep the import nests).
TRIO_IMPORTED = re.compile(rb"\| +trio\n")

#: When to send the SIGINT: a phase the process shows, then a delay in seconds. ``entry``: the
#: entry has taken SIGINT over; ``trio``: trio is imported (the rest of the imports, the parsing
#: and trio's start follow); ``output``: the command's first line (the run has started).
MOMENTS = (
    ("entry", 0.0),
    *(("trio", delay) for delay in (0.0, 0.05, 0.1, 0.2, 0.4)),
    *(("output", delay) for delay in (0.0, 0.4, 1.2)),
)


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (the SigCgt mask of its status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:  # gone already
        pass
    return False


async def _interrupt(
    argv: list[str], cwd: Path, env: dict[str, str], anchor: str, delay: float
) -> tuple[int, str, bool]:
    """Start the command, SIGINT it ``delay`` s after the phase ``anchor`` (see MOMENTS); its
    exit code, its output, and whether the entry had taken over when the signal went."""
    cmd = [sys.executable, "-X", "importtime", "-c", SCRIPT, *argv]
    out, err = bytearray(), bytearray()
    seen = {"trio": trio.Event(), "output": trio.Event()}
    with trio.fail_after(120):  # a hang guard only
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    cmd,
                    cwd=str(cwd),
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    check=False,
                )
            )

            async def drain(stream: trio.abc.ReceiveStream, into: bytearray) -> None:
                async for chunk in stream:
                    into += chunk
                    if into is out or TRIO_IMPORTED.search(err):
                        seen["output" if into is out else "trio"].set()
                for event in seen.values():  # it ended before: the signal finds no one
                    event.set()

            assert proc.stdout is not None
            assert proc.stderr is not None
            nursery.start_soon(drain, proc.stdout, out)
            nursery.start_soon(drain, proc.stderr, err)
            if anchor == "entry":
                # /proc/<pid>/status has no change to wait on: polled.
                while not _catches(proc.pid, signal.SIGTERM) and proc.poll() is None:  # noqa: ASYNC110
                    await trio.sleep(0.001)
            else:
                await seen[anchor].wait()
            await trio.sleep(delay)
            took_over = _catches(proc.pid, signal.SIGTERM)
            proc.send_signal(signal.SIGINT)
            code = await proc.wait()
    return code, (out + err).decode(errors="replace"), took_over


def _env(tmp: Path) -> dict[str, str]:
    env = {**os.environ, "TMPDIR": str(tmp), "COLUMNS": "160"}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.mark.parametrize("command", ["run", "demo"])
async def test_ctrl_c_at_any_moment_exits_130_without_a_traceback(
    tmp_path: Path, command: str
) -> None:
    rows = build_demo_set(tmp_path / "repos").rows[:1]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    results: dict[tuple[str, float], tuple[int, str, bool]] = {}
    # The run's policy never answers (a socket that listens and never accepts): the episode
    # waits on it until the signal.
    with trio.socket.socket() as policy:
        await policy.bind(("127.0.0.1", 0))
        policy.listen()
        argv = [command, "--no-progress"]
        if command == "run":
            url = f"http://127.0.0.1:{policy.getsockname()[1]}"
            argv += [str(tmp_path / "rows.jsonl"), "--policy-url", url]

        async def one(anchor: str, delay: float) -> None:
            where = tmp_path / f"{anchor}-{delay}"
            where.mkdir()
            results[anchor, delay] = await _interrupt(argv, where, _env(where), anchor, delay)

        async with trio.open_nursery() as nursery:  # at once: the moments are phases, not times
            for anchor, delay in MOMENTS:
                nursery.start_soon(one, anchor, delay)
    wrong, tail = [], ""
    for (anchor, delay), (rc, text, took_over) in ((m, results[m]) for m in MOMENTS):
        when = f"{delay} s after {anchor}"
        if rc != 128 + signal.SIGINT or "Traceback" in text or "interrupted" not in text:
            wrong.append(
                f"SIGINT {when} (the entry had taken over: {took_over}): exit {rc}, "
                f"traceback: {'Traceback' in text}"
            )
            tail = tail or text[-2000:]
    assert not wrong, "\n".join([*wrong, "first wrong one's output:", tail])
