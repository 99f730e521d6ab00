"""Synthetic sandboxes for the envd test server: commands are timers, files live in memory.

``open_envd_server(backend=SyntheticBackend())`` serves the same REST and envd APIs, but no
process is ever started: a sandbox recognises the few command shapes that
:func:`trio_swe.exec_and_wait` sends (the spawn, wait, kill and cleanup scripts of
:mod:`trio_swe.sandbox._launcher`) and a tiny command language (``sleep N``, ``exit K``,
``echo WORDS``, ``true``, ``false``, ``:``, separated by ``;`` or newlines), and answers them
with timers. A detached ``sleep 30; exit 3`` costs the server a timer and a few dictionary
entries, so the client side can be measured at 10,000 concurrent sandboxes (``bench/bench_e2b_scale.py``).

Anything else fails with status 127 and says so on stderr: a synthetic sandbox never pretends
to have run what it does not understand.

Every detached command's scheduled end (``time.monotonic()``, comparable across processes on
one machine) is recorded by nonce in :attr:`SyntheticBackend.ends`, so a benchmark can measure
"command ended -> caller has its exit code" without trusting the client's own clock.
"""

from __future__ import annotations

import itertools
import math
import re
import shlex
import signal as _signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import msgspec
import trio

from ..._errors import SandboxFileNotFoundError, SandboxNotRunningError
from ...sandbox._background import PosArgs, start_in
from ...sandbox._launcher import REPLY_PREFIX, RUN_ENV, unwrap_exec_record
from ...sandbox._types import (
    DEFAULT_READ_MAX_BYTES,
    BackendStatistics,
    ExecResult,
    SandboxSpec,
    SandboxStatistics,
)

#: Status of what a synthetic sandbox does not understand (the shell's "command not found").
UNSUPPORTED: Final = 127

_pids = itertools.count(1000)


class SyntheticSandboxStatistics(SandboxStatistics, frozen=True, kw_only=True):
    """A synthetic sandbox's counters: files and detached calls held in memory now."""

    files: int
    calls: int


class SyntheticBackendStatistics(BackendStatistics, frozen=True, kw_only=True):
    """The synthetic backend's counters.

    Attributes:
        processes: "processes" started (each answered by a timer or at once).
        file_writes: files written.
        by_shape: commands started, by recognised shape (``spawn``, ``wait``, ``kill``,
            ``cleanup``, ``probe``, ``program``, ``unsupported``).
    """

    processes: int
    file_writes: int
    by_shape: dict[str, int]


class Program(msgspec.Struct, frozen=True):
    """A parsed synthetic command: how long it takes, what it prints, how it ends."""

    duration: float
    status: int
    output: bytes


_SLEEP = re.compile(r"^sleep\s+([0-9]+(?:\.[0-9]+)?)$")
_EXIT = re.compile(r"^exit(?:\s+([0-9]+))?$")


def parse_program(text: str) -> Program | None:
    """The :class:`Program` of a command in the tiny language, or None (not understood).

    The preamble of a detached command file (``cd WORKDIR || exit 126``, ``export NAME=...``)
    is skipped.
    """
    duration, status, out = 0.0, 0, bytearray()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export ") or (line.startswith("cd ") and line.endswith("|| exit 126")):
            continue
        for stmt in line.split(";"):
            stmt = stmt.strip()
            if not stmt:
                continue
            if m := _SLEEP.match(stmt):
                duration += float(m.group(1))
                status = 0
            elif m := _EXIT.match(stmt):
                return Program(duration, int(m.group(1) or status) & 0xFF, bytes(out))
            elif stmt in ("true", ":"):
                status = 0
            elif stmt == "false":
                status = 1
            elif stmt == "echo" or stmt.startswith("echo "):
                try:
                    words = shlex.split(stmt[4:])
                except ValueError:
                    return None
                out += (" ".join(words) + "\n").encode()
                status = 0
            else:
                return None
    return Program(duration, status, bytes(out))


# -- the scripts of trio_swe.sandbox._launcher, recognised by their fixed parts ---------------

_SCRIPT_DIR = re.compile(r"^(?:if )?cd (\S+) 2>/dev/null", re.MULTILINE)
_SPAWN_NONCE = re.compile(r"ln -s (\S+) spawned")
_SPAWN_CMD = re.compile(r"^chmod 600 (\S+) 2>/dev/null$", re.MULTILINE)
_WAIT_SEC = re.compile(r"\{ flock -s -w ([0-9.]+) 9; \} 9<lock")
_TAIL = re.compile(r"if (.+?); then tail -c ([0-9]+) out")
_KILL_NONCE = re.compile(r"run=" + RUN_ENV + r"=(\S+); ")
_CLEANUP = re.compile(r"^rm -rf -- (\S+)\n?$")
_PROBE = re.compile(r"^\[ -e (\S+) \] \|\| exit 44;")


def _unquote(word: str) -> str:
    parts = shlex.split(word)
    return parts[0] if parts else ""


class _Call:
    """The state of one detached call's directory."""

    __slots__ = ("done", "end", "killed", "nonce", "owner", "pid", "program", "scope", "status")

    def __init__(self) -> None:
        self.owner: str | None = None  # the ``spawned`` symlink: a nonce or ``killed.<nonce>``
        self.nonce: str | None = None
        self.pid: int | None = None
        self.program: Program | None = None
        self.end = math.inf  # trio time of the end
        self.status: int | None = None  # set once done
        self.done = trio.Event()
        self.killed = False
        self.scope: trio.CancelScope | None = None  # the timer's (see reschedule)


class _Stream(trio.abc.ReceiveStream):
    """stdout of a synthetic process: its bytes once the process is done, then EOF."""

    def __init__(self, proc: SyntheticProcess) -> None:
        self._proc = proc
        self._sent = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await self._proc.finished.wait()
        if self._sent:
            return b""
        self._sent = True
        return self._proc.output

    async def aclose(self) -> None:
        self._sent = True


class SyntheticProcess:
    """What the server's process table needs of a process (``StreamingProcess``)."""

    def __init__(self) -> None:
        self.pid = next(_pids)
        self.finished = trio.Event()
        self.returncode = 0
        self.output = b""
        self.stdout: trio.abc.ReceiveStream | None = _Stream(self)
        self.stderr: trio.abc.ReceiveStream | None = None
        self.stdin: trio.abc.SendStream | None = None

    def finish(self, returncode: int, output: bytes = b"") -> None:
        if not self.finished.is_set():
            self.returncode, self.output = returncode, output
            self.finished.set()

    async def wait(self) -> int:
        await self.finished.wait()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.finish(-sig)

    async def aclose(self) -> None:
        return None


class SyntheticSandbox:
    """One synthetic sandbox (see the module docstring)."""

    def __init__(self, backend: SyntheticBackend, spec: SandboxSpec, nursery: trio.Nursery) -> None:
        self._backend = backend
        self._spec = spec
        self._nursery = nursery
        self._id = f"synth-{next(_pids)}"
        self.files: dict[str, bytes] = {}
        self.calls: dict[str, _Call] = {}
        self.killed = False
        self.execs = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def workdir(self) -> str:
        return self._spec.workdir

    def start_background(
        self, async_fn: Callable[[*PosArgs], Awaitable[object]], *args: *PosArgs
    ) -> None:
        start_in(self._nursery, self._id, async_fn, *args)

    def _alive(self) -> None:
        if self.killed:
            raise SandboxNotRunningError(f"synthetic sandbox {self._id} was killed")

    # -- the Sandbox protocol, as far as the server uses it ----------------------------------

    async def exec(
        self,
        cmd: str,
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = 60.0,
        idempotent: bool = False,
    ) -> ExecResult:
        self.execs += 1
        proc = await self.start_process(["/bin/sh", "-c", cmd])
        status = await proc.wait()
        return ExecResult(exit_code=status, output=proc.output.decode(errors="replace"))

    async def write_file(
        self,
        path: str,
        data: bytes | str,
        *,
        user: str | None = None,
        mode: int | None = None,
        timeout: float | None = None,
    ) -> None:
        self._alive()
        self.files[path] = data.encode() if isinstance(data, str) else bytes(data)
        self._backend.file_writes += 1

    async def read_file(
        self,
        path: str,
        *,
        user: str | None = None,
        max_bytes: int | None = DEFAULT_READ_MAX_BYTES,
        special: bool = False,
        timeout: float | None = None,
    ) -> bytes:
        self._alive()
        data = self._lookup(path)
        if data is None:
            raise SandboxFileNotFoundError(f"{path}: no such file in synthetic sandbox")
        return data

    async def kill(self) -> None:
        if not self.killed:
            self._backend.killed += 1
        self.killed = True
        for call in self.calls.values():
            call.done.set()
        self.calls.clear()
        self.files.clear()

    def statistics(self) -> SyntheticSandboxStatistics:
        return SyntheticSandboxStatistics(
            execs=self.execs, files=len(self.files), calls=len(self.calls)
        )

    # -- processes ---------------------------------------------------------------------------

    async def start_process(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
    ) -> SyntheticProcess:
        """Start a "process": one of the recognised shapes, or status 127."""
        self._alive()
        proc = SyntheticProcess()
        backend = self._backend
        backend.processes += 1
        if len(argv) == 5 and argv[:2] == ["head", "-c"] and argv[3] == "--":
            data = self._lookup(argv[4])
            if data is None:
                proc.finish(1, b"")
            else:
                proc.finish(0, data[: int(argv[2])])
            return proc
        # A plain exec's end-record wrapper: interpret the command inside (no records here, so
        # a settle script after a fault is "unsupported", never a made-up answer).
        argv = unwrap_exec_record(argv)
        if len(argv) != 3 or argv[1] != "-c":
            proc.finish(UNSUPPORTED, f"synthetic sandbox: unsupported argv {argv[:2]}\n".encode())
            return proc
        script = argv[2]
        if "trio-swe-launcher" in script:
            backend.by_shape["spawn"] += 1
            proc.finish(0, self._spawn(script))
        elif "kill -STOP" in script:
            backend.by_shape["kill"] += 1
            proc.finish(0, self._kill(script))
        elif "flock -s -w" in script:
            backend.by_shape["wait"] += 1
            self._nursery.start_soon(self._wait, script, proc)
        elif m := _CLEANUP.match(script):
            backend.by_shape["cleanup"] += 1
            self._remove(_unquote(m.group(1)))
            proc.finish(0)
        elif m := _PROBE.match(script):
            backend.by_shape["probe"] += 1
            proc.finish(0 if self._lookup(_unquote(m.group(1))) is not None else 44)
        else:
            program = parse_program(script)
            if program is None:
                backend.by_shape["unsupported"] += 1
                proc.finish(
                    UNSUPPORTED, f"synthetic sandbox: unsupported: {script[:200]!r}\n".encode()
                )
            else:
                backend.by_shape["program"] += 1
                self._nursery.start_soon(self._run_program, program, proc)
        return proc

    async def _run_program(self, program: Program, proc: SyntheticProcess) -> None:
        with trio.move_on_after(program.duration):
            await proc.finished.wait()  # a signal ends it early
        proc.finish(program.status, program.output)

    def _lookup(self, path: str) -> bytes | None:
        data = self.files.get(path)
        if data is not None:
            return data
        head, _, name = path.rpartition("/")
        call = self.calls.get(head)
        if name == "out" and call is not None:
            return self._output(call)
        return None

    def _dir_exists(self, directory: str) -> bool:
        if directory in self.calls:
            return True
        prefix = directory.rstrip("/") + "/"
        return any(p.startswith(prefix) for p in self.files)

    def _remove(self, directory: str) -> None:
        self.calls.pop(directory, None)
        prefix = directory.rstrip("/") + "/"
        for path in [p for p in self.files if p.startswith(prefix)]:
            del self.files[path]

    @staticmethod
    def _output(call: _Call) -> bytes:
        if call.status is None or call.program is None:
            return b""  # output appears at the end, all at once
        return call.program.output

    def _report(self, call: _Call, script: str) -> bytes:
        out = self._output(call)
        head = f"{REPLY_PREFIX} done {call.nonce} {call.status} {len(out)}\n".encode()
        m = _TAIL.search(script)
        if m is None:
            return head
        cond, tail = m.group(1), int(m.group(2))
        if cond == "true" or (cond == '[ "$2" != 0 ]' and call.status != 0):
            return head + out[-tail:] if tail else head
        return head

    def _spawn(self, script: str) -> bytes:
        d, n, c = _SCRIPT_DIR.search(script), _SPAWN_NONCE.search(script), _SPAWN_CMD.search(script)
        if d is None or n is None or c is None:
            return f"{REPLY_PREFIX} failed\nsynthetic: spawn script not understood\n".encode()
        directory, nonce, cmd_path = _unquote(d.group(1)), n.group(1), _unquote(c.group(1))
        if not self._dir_exists(directory):
            return f"{REPLY_PREFIX} gone\n".encode()
        call = self.calls.get(directory)
        if call is None:
            call = self.calls[directory] = _Call()
        if call.owner is not None:
            state = "replay" if call.owner == nonce else f"busy {call.owner}"
            return f"{REPLY_PREFIX} {state}\n".encode()
        text = self.files.get(cmd_path)
        program = None if text is None else parse_program(text.decode(errors="replace"))
        call.owner = call.nonce = nonce
        call.pid = next(_pids)
        if program is None:
            program = Program(0.0, UNSUPPORTED, b"synthetic sandbox: unsupported command\n")
        call.program = program
        call.end = trio.current_time() + program.duration
        self._backend.ends[nonce] = time.monotonic() + program.duration
        self._backend._running.append(call)
        self._nursery.start_soon(self._timer, call)
        self._backend._spawn_seen()
        return f"{REPLY_PREFIX} started {call.pid}\n".encode()

    async def _timer(self, call: _Call) -> None:
        with trio.move_on_at(call.end) as call.scope:
            await call.done.wait()  # killed first
        if call.status is None and call.program is not None:
            call.status = call.program.status
        call.done.set()

    async def _wait(self, script: str, proc: SyntheticProcess) -> None:
        d, w = _SCRIPT_DIR.search(script), _WAIT_SEC.search(script)
        if d is None or w is None:
            proc.finish(1, b"synthetic: wait script not understood\n")
            return
        call = self.calls.get(_unquote(d.group(1)))
        if call is None:
            proc.finish(0, f"{REPLY_PREFIX} gone\n".encode())
            return
        if call.pid is None:
            state = "lost" if call.owner is not None else "unspawned"
            proc.finish(0, f"{REPLY_PREFIX} {state}\n".encode())
            return
        with trio.move_on_after(float(w.group(1))):
            # Ends when the command does, or when the wait RPC is signalled (cancelled).
            async with trio.open_nursery() as either:

                async def ended() -> None:
                    await call.done.wait()
                    either.cancel_scope.cancel()

                either.start_soon(ended)
                await proc.finished.wait()
                either.cancel_scope.cancel()
        if proc.finished.is_set():
            return
        if call.status is not None:
            proc.finish(0, self._report(call, script))
            if call.nonce is not None:
                self._backend.replied.setdefault(call.nonce, time.monotonic())
        elif self.killed:
            proc.finish(-_signal.SIGKILL)
        else:
            proc.finish(0, f"{REPLY_PREFIX} running\n".encode())

    def _kill(self, script: str) -> bytes:
        d, n = _SCRIPT_DIR.search(script), _KILL_NONCE.search(script)
        if d is None or n is None:
            return f"{REPLY_PREFIX} failed\nsynthetic: kill script not understood\n".encode()
        directory, nonce = _unquote(d.group(1)), n.group(1)
        call = self.calls.get(directory)
        if call is None:
            if not self._dir_exists(directory):
                return f"{REPLY_PREFIX} gone 0\n".encode()
            call = self.calls[directory] = _Call()  # written, never spawned: prevent a spawn
        if call.owner is None:
            call.owner = f"killed.{nonce}"
        elif call.owner not in (nonce, f"killed.{nonce}"):
            return f"{REPLY_PREFIX} notmine\n".encode()
        if call.status is not None:
            reply = self._report(call, script)
        else:
            if call.pid is not None:
                call.status = 128 + _signal.SIGKILL
                call.killed = True
                call.done.set()
            reply = f"{REPLY_PREFIX} killed 0 0\n".encode()
        if "rm -rf -- " in script:
            self._remove(directory)
        return reply


class SyntheticBackend:
    """A backend of :class:`SyntheticSandbox` es for :func:`~trio_swe.testing.open_envd_server`.

    Args:
        boot_sec: how long a create takes (E2B: about a second; 0 here by default).

    Attributes:
        ends: detached command nonce -> its scheduled end, ``time.monotonic()`` seconds.
        replied: nonce -> when the first wait script that saw it done had its reply ready.
        by_shape: how many commands of each recognised shape were started.
    """

    name = "synthetic"

    def __init__(self, *, boot_sec: float = 0.0) -> None:
        self.boot_sec = boot_sec
        self.ends: dict[str, float] = {}
        self.replied: dict[str, float] = {}
        self.by_shape: dict[str, int] = dict.fromkeys(
            ("spawn", "wait", "kill", "cleanup", "probe", "program", "unsupported"), 0
        )
        self.processes = 0
        self.file_writes = 0
        self.created = 0
        self.killed = 0
        self._spawned = trio.Event()
        self._running: list[_Call] = []  # detached commands in spawn order (pruned lazily)

    def reschedule(self, first_end: float, spread_sec: float) -> int:
        """End every running detached command anew: the first at ``first_end``
        (``time.monotonic()``), the others spread evenly over ``spread_sec``, in spawn order.

        A load test spawns its commands with long timers, measures the steady state once all
        run, then ends them when it chooses (however long the ramp took). ``ends`` is updated.
        Returns how many were rescheduled.
        """
        running = [c for c in self._running if c.status is None and not c.done.is_set()]
        self._running = running
        offset = trio.current_time() - time.monotonic()
        for k, call in enumerate(running):
            end = first_end + spread_sec * k / max(1, len(running))
            call.end = end + offset
            if call.scope is not None:
                call.scope.deadline = call.end
            if call.nonce is not None:
                self.ends[call.nonce] = end
        return len(running)

    async def next_spawn(self) -> None:
        """Return after the next detached command is spawned (in-process servers only)."""
        await self._spawned.wait()

    def _spawn_seen(self) -> None:
        self._spawned.set()
        self._spawned = trio.Event()

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> SyntheticSandbox:
        await trio.sleep(self.boot_sec)  # a real boot takes time: the REST create waits
        self.created += 1
        return SyntheticSandbox(self, spec, nursery)

    def statistics(self) -> SyntheticBackendStatistics:
        return SyntheticBackendStatistics(
            created=self.created,
            killed=self.killed,
            live=self.created - self.killed,
            boot_failures=0,
            processes=self.processes,
            file_writes=self.file_writes,
            by_shape=dict(self.by_shape),
        )

    async def aclose(self) -> None:
        return None
