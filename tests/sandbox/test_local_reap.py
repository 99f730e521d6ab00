"""A child subreaper (or PID 1 of a container) owning local sandboxes: what the kernel hands it
is reaped, and a kill never waits out its bound for a zombie nobody reaps."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trio_swe import open_sandbox
from trio_swe.sandbox.local import LocalBackend
from trio_swe.sandbox.local import _process as local_process
from trio_swe.sandbox.local._reap import reap_adopted_zombies

# Runs as a child subreaper: a command's nsenter dies before the command (so the command is
# handed to us), cancelled execs race their kills, then each sandbox is killed. Prints the
# kills' statistics and the zombies left among our children.
_OWNER = """
import ctypes, json, os, signal, sys
import trio
from trio_swe import open_sandbox
from trio_swe.sandbox.local import LocalBackend
from trio_swe.sandbox.local._reap import children_of

PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0

def zombies():
    out = []
    for pid in children_of():
        with open(f"/proc/{pid}/stat", "rb") as f:
            if f.read().rsplit(b") ", 1)[1][:1] == b"Z":
                out.append(pid)
    return out

async def main():
    stats = []
    async with LocalBackend() as backend:
        for _ in range(3):
            async with open_sandbox(backend, sys.argv[1]) as sb:
                proc = await sb.start_process(["sleep", "1000"])
                os.kill(proc.pid, signal.SIGKILL)  # nsenter only: `sleep` is handed to us
                await proc.wait()
                async with trio.open_nursery() as nursery:
                    for _ in range(4):
                        nursery.start_soon(sb.exec, "sleep 1000")
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.cancel_scope.cancel()
            s = sb.statistics()
            stats.append([s.kill_timed_out, s.kill_reaped])
    print(json.dumps({"kills": stats, "zombies": zombies()}))

import trio.testing
trio.run(main)
"""


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir()
    (img / "hello.txt").write_text("hello\n")
    return img


def _run_script(script: str, image: Path) -> Any:
    """Run ``script`` (it makes itself a child subreaper) in a process of its own; the JSON it
    prints."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(image)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_subreaper_reaps_what_it_is_handed_and_kills_without_waiting_out_the_bound(
    image: Path,
) -> None:
    report = _run_script(_OWNER, image)
    assert report["zombies"] == []
    for timed_out, reaped in report["kills"]:
        assert timed_out is False
        # At least the orphaned `sleep`; the outer bwrap and the init when their parents died first.
        assert reaped >= 1


# Runs as a child subreaper: execs cancelled mid-run. Each command must be reaped by its own
# nsenter, not handed to us (or to the host's PID 1, which reaps when it gets round to it: until
# then the sandbox's init cannot exit and a kill of the sandbox waits).
_CANCELS = """
import ctypes, json, sys
import trio, trio.testing
from trio_swe import open_sandbox
from trio_swe.sandbox.local import LocalBackend
from trio_swe.sandbox.local._reap import reap_adopted_zombies

assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER

async def main():
    handed = 0
    async with LocalBackend() as backend:
        for _ in range(4):
            async with open_sandbox(backend, sys.argv[1]) as sb:
                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(sb.exec, "sleep 1000")
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.cancel_scope.cancel()
                # Every exec's process is closed; the sandbox itself is still up. Zombies of
                # ours from the sandbox's pid namespace were handed to us.
                handed += reap_adopted_zombies()
    print(json.dumps(handed))

trio.run(main)
"""


def test_a_cancelled_command_is_reaped_by_its_nsenter_not_handed_up(image: Path) -> None:
    assert _run_script(_CANCELS, image) == 0


def test_children_we_started_are_never_reaped_by_the_sweep() -> None:
    """Reaping a process that Python waits for would steal its exit status."""
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    # Wait for its exit without reaping it: a zombie of ours, which the sweep must leave alone.
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert reap_adopted_zombies() == 0
    assert child.wait() == 7


async def test_a_stuck_nsenter_is_killed_after_its_bound_and_logged(
    image: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An nsenter that does not exit once its child is killed (here: stopped) is not waited
    for past the bound: its group is killed, and the wait that ran out is logged."""
    monkeypatch.setattr(local_process, "_NSENTER_EXIT_SEC", 0.2)
    async with LocalBackend() as backend, open_sandbox(backend, str(image)) as sb:
        proc = await sb.start_process(["sh", "-c", "echo up; exec sleep 1000"])
        assert proc.stdout is not None
        assert await proc.stdout.receive_some() == b"up\n"  # nsenter's child runs
        os.kill(proc.pid, signal.SIGSTOP)
        with caplog.at_level(logging.WARNING, logger="trio_swe.sandbox"):
            await proc.aclose()
        assert proc.returncode == -signal.SIGKILL
    assert f"nsenter {proc.pid} did not exit" in caplog.text
