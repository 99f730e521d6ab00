"""A worker killed in the middle of a boot leaves nothing behind, its direct children killed too
or not.

bwrap clones the namespace's first process and lets it run only after writing its pid to
``--info-fd``; killed in between, it leaves that process waiting forever, holding its namespaces
and mounts. Two ways that happened:

* the worker died (OOM, SIGKILL) before bwrap wrote the pid: the write to a pipe whose reader
  was gone killed bwrap (SIGPIPE). The pid now goes to a memory file.
* Ray kills a dead worker's direct children (``RAY_kill_child_processes_on_worker_exit``, on by
  default), and that child was bwrap. It is now a shell that runs bwrap, so the kill lands there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trio_swe.sandbox.local._backend import _PARENT

from ..conftest import host_pids_gone

# Boots sandboxes one after another; prints "spawned" as soon as each boot's process exists.
WORKER = r"""
import sys, trio
import trio_swe.sandbox.local._backend as B
from trio_swe import open_sandbox
from trio_swe.sandbox.local import LocalBackend

spawn = trio.lowlevel.open_process
async def noisy(argv, **kw):
    proc = await spawn(argv, **kw)
    if "--info-fd" in argv:
        print("spawned", flush=True)
    return proc
B.trio.lowlevel.open_process = noisy

async def main():
    backend = LocalBackend(state_dir=sys.argv[1])
    while True:
        async with open_sandbox(backend, sys.argv[2]) as sb:
            await sb.exec("true")
trio.run(main)
"""


def _children(pid: int) -> list[int]:
    """The children of every thread of ``pid`` (a worker's threads come and go)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.parametrize("children_too", [False, True])
async def test_a_worker_killed_mid_boot_leaves_nothing(tmp_path: Path, children_too: bool) -> None:
    image = tmp_path / "image"
    image.mkdir()
    state = tmp_path / "state"
    for nth in range(1, 7):  # the kill lands at a different point of the boot each time
        worker = await trio.lowlevel.open_process(
            [sys.executable, "-c", WORKER, str(state), str(image)],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert worker.stdout is not None
        seen = 0
        with trio.fail_after(60):  # a hang guard only
            buf = b""
            while seen < nth:
                chunk = await worker.stdout.receive_some(64)
                assert chunk, "the worker exited on its own"
                buf += chunk
                seen = buf.count(b"spawned")
        # Killed right as a boot starts, before bwrap writes the pid; as Ray does, its direct
        # children too, or (a crash) not.
        children = _children(worker.pid) if children_too else []
        worker.kill()
        for child in children:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await worker.wait()
        await worker.stdout.aclose()
        # A bound for a process that never goes, not a timing (returns as soon as none is left).
        # The boot goes on after the kill (bwrap finishes, then the init sees its stdin closed),
        # so its processes come and go meanwhile: host_pids_gone lists until none is left.
        left = await host_pids_gone(str(state), within=180)
        assert left == [], [_describe(p) for p in left]


def _full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full: a writer blocks until it is drained."""
    r, w = os.pipe()
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 4096)
    os.set_blocking(w, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(w, b"x" * 512)
    os.set_blocking(w, True)
    return r, w


@pytest.mark.parametrize("parent", ["bwrap", "shell"])
async def test_killing_the_boots_process_in_bwraps_window(parent: str) -> None:
    """The window itself, held open: bwrap has cloned the namespace's first process and blocks
    writing ``--info-fd`` (a full pipe) before it lets that process run. The process a boot
    starts is killed there, as Ray kills a dead worker's children. With bwrap that process,
    the namespace's first process is left waiting forever (what the shell parent is for);
    with the shell (:data:`_PARENT`), bwrap goes on once the pipe drains, and all ends."""
    r, w = _full_pipe()
    bwrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid"]
    bwrap += ["--info-fd", str(w), "--", "true"]
    argv = bwrap if parent == "bwrap" else [*_PARENT, *bwrap]
    proc = await trio.lowlevel.open_process(argv, pass_fds=(w,), start_new_session=True)
    os.close(w)
    first = 0
    try:
        with trio.fail_after(30):  # a hang guard only
            while True:  # until bwrap has cloned the namespace's first process
                outer = proc.pid if parent == "bwrap" else next(iter(_children(proc.pid)), 0)
                inner = _children(outer) if outer else []
                if inner:
                    break
                await trio.sleep(0.001)
        (first,) = inner
        proc.kill()
        await proc.wait()
        # Drained to its end (bwrap closes it once written): an orphaned bwrap goes on. Closed
        # earlier, bwrap's write would find no reader and kill it, the very thing tested here.
        stream = trio.lowlevel.FdStream(r)
        r = -1
        with trio.fail_after(30):
            while await stream.receive_some(1 << 16):
                pass
        await stream.aclose()
        pidfd = os.pidfd_open(first)
        # It ends within milliseconds; the one left waiting never does (2 s show it).
        with trio.move_on_after(30 if parent == "shell" else 2):
            await trio.lowlevel.wait_readable(pidfd)  # readable once it has exited
        os.close(pidfd)
        assert (_state(first) in ("gone", "Z")) == (parent == "shell"), (parent, _state(first))
    finally:
        if r != -1:
            os.close(r)
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if first:
            with contextlib.suppress(ProcessLookupError):
                os.kill(first, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()[:200]
    except OSError:
        return b"(gone)"


def _describe(pid: int) -> dict[str, object]:
    """What a process left over is doing: its command, state, where it waits in the kernel,
    and its children's commands (so that a failure says why, not only what)."""
    out: dict[str, object] = {"pid": pid, "cmdline": _cmdline(pid), "state": _state(pid)}
    for name in ("wchan", "stack"):
        try:
            out[name] = Path(f"/proc/{pid}/{name}").read_text()[:400]
        except OSError:
            pass
    with contextlib.suppress(OSError):
        out["children"] = [(c, _state(c), _cmdline(c)[:80]) for c in _children(pid)]
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
