"""``LocalSandbox``: one bubblewrap sandbox, entered with nsenter for every command."""

from __future__ import annotations

import logging
import os
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import trio

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxNotAFileError,
    SandboxNotRunningError,
    SandboxPermissionError,
)
from .._base import RunSandboxBase
from .._bounds import file_time_bound
from .._types import DEFAULT_FILE_TIMEOUT_SEC, DEFAULT_READ_MAX_BYTES, SandboxStatistics
from .._validate import check_abs_path, check_env, check_read_args, check_user
from .._writes import DENIED_STATUS, NOT_A_FILE_STATUS, WRITE_SCRIPT, write_args, write_error
from ._process import LocalProcess, nsenter_argv, start_local_process
from ._reap import children_of, comm_of, parent_of, reap_adopted_zombies, reap_pidfd
from ._trash import Trash
from ._users import ROOT, SandboxUser

logger = logging.getLogger("trio_swe.sandbox")

#: ``exec`` keeps at most this much output (the tail), so a runaway command cannot eat memory.
MAX_EXEC_OUTPUT = 8 * 1024 * 1024
_NOT_FOUND_STATUS = 44
_DRAIN_AFTER_EXIT_SEC = 1.0
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Reads a file, telling "missing" apart from other failures by a reserved status.
_TOO_LARGE_STATUS = 46
# Reads a file: $1 path, $2 max bytes ("" for no cap), $3 "1" to read what is not a regular file.
# Reserved statuses tell "missing", "not a file" (its kind on stderr) and "too large" (the size
# on stderr) apart from other failures; `head` never reads more than the cap + 1.
_READ_SCRIPT = """p=$1
if [ ! -e "$p" ]; then
  d=$p
  while d=$(dirname -- "$d"); [ "$d" != / ]; do
    if [ -d "$d" ] && [ ! -x "$d" ]; then echo "cannot enter $d" >&2; exit 47; fi
  done
  exit 44
fi
if [ -d "$p" ]; then echo directory >&2; exit 45; fi
if [ ! -f "$p" ] && [ "$3" != 1 ]; then
  if [ -p "$p" ]; then k=fifo; elif [ -c "$p" ]; then k="character device"
  elif [ -b "$p" ]; then k="block device"; elif [ -S "$p" ]; then k=socket
  else k="special file"; fi
  echo "$k" >&2; exit 45
fi
if [ ! -r "$p" ]; then echo "not readable" >&2; exit 47; fi
if [ -z "$2" ]; then exec cat -- "$p"; fi
if [ -f "$p" ] && s=$(stat -L -c %s -- "$p" 2>/dev/null) && [ "$s" -gt "$2" ]; then
  echo "$s" >&2; exit 46
fi
exec head -c "$(($2 + 1))" -- "$p"
"""


def _is_dir(path: str) -> bool:
    # One stat on procfs: cheaper inline than a thread hop per process start.
    return os.path.isdir(path)


class LocalSandbox(RunSandboxBase):
    """A running local sandbox. Create it with ``open_sandbox(LocalBackend(), image)``."""

    def __init__(
        self,
        *,
        sandbox_id: str,
        workdir: str,
        nursery: trio.Nursery,
        bwrap: trio.Process,
        init_pid: int,
        state_dir: Path,
        users: Mapping[str, SandboxUser],
        base_env: Mapping[str, str],
        network: bool,
        workspace_mode: str,
        image_root: bool = False,
        boot_sec: float,
        on_close: Any = None,
        trash: Trash | None = None,
    ) -> None:
        super().__init__(
            sandbox_id=sandbox_id,
            workdir=workdir,
            nursery=nursery,
            boot_sec=boot_sec,
            on_close=on_close,
            workspace_mode=workspace_mode,
            processes_started=0,
        )
        self._bwrap = bwrap
        self._init_pid = init_pid
        self._state_dir = state_dir
        self._users = dict(users)
        self._base_env = dict(base_env)
        self._own_netns = not network
        self._workspace_mode = workspace_mode
        self._image_root = image_root
        self._trash = trash
        self._dead = trio.Event()
        self._processes: set[LocalProcess] = set()
        nursery.start_soon(self._watch_init)

    # -- identity ---------------------------------------------------------------------------
    @property
    def init_pid(self) -> int:
        """Host pid of the sandbox's pid-namespace init; every process in it dies with it."""
        return self._init_pid

    @property
    def alive(self) -> bool:
        return not self._dead.is_set()

    @property
    def network(self) -> bool:
        """Whether the sandbox shares the host's network (False: its own, loopback only)."""
        return not self._own_netns

    def statistics(self) -> LocalSandboxStatistics:
        return LocalSandboxStatistics(
            **self._counts, live_processes=len(self._processes), alive=self.alive
        )

    async def _watch_init(self) -> None:
        # Only a real exit marks the sandbox dead: being cancelled (the owner leaving
        # open_sandbox) must not turn a racing call's Cancelled into SandboxNotRunningError.
        await self._bwrap.wait()
        self._dead.set()

    # -- processes --------------------------------------------------------------------------
    def _user(self, user: str | None) -> SandboxUser:
        if user is None:
            return ROOT
        check_user(user)
        try:
            return self._users[user]
        except KeyError:
            raise InvalidArgumentError(
                f"unknown user {user!r} in local sandbox (known: {sorted(self._users)})"
            ) from None

    def _env(self, who: SandboxUser, env: Mapping[str, str] | None) -> dict[str, str]:
        merged = {"HOME": who.home, "USER": who.name, "LOGNAME": who.name}
        merged.update(self._base_env)
        merged.update(check_env(env))
        merged.setdefault("PATH", _DEFAULT_PATH)
        return merged

    def _require_alive(self) -> None:
        if self._dead.is_set():
            raise SandboxNotRunningError(f"local sandbox {self._id} is not running")

    async def start_process(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        merge_stderr: bool = False,
    ) -> LocalProcess:
        """Start ``argv`` in the sandbox and return it with its streams, without waiting.

        The caller owns the process: ``await proc.aclose()`` kills and reaps it. Killing the
        sandbox kills it too.
        """
        self._require_alive()
        if not argv:
            raise InvalidArgumentError("argv must not be empty")
        if "=" in argv[0]:
            # `env` would take it for a variable assignment.
            raise InvalidArgumentError(f"argv[0] must not contain '=': {argv[0]!r}")
        who = self._user(user)
        workdir = check_abs_path(cwd or self._workdir, what="cwd")
        # As envd: a missing working directory is the caller's error, not the command's exit 1
        # (nsenter's "cannot change directory"). Seen from the host through the init's root.
        if not _is_dir(f"/proc/{self._init_pid}/root{workdir}"):
            self._require_alive()
            raise InvalidArgumentError(
                f"cwd {workdir!r} is not a directory in local sandbox {self._id}"
            )
        host_argv = nsenter_argv(
            self._init_pid,
            argv,
            user=who,
            cwd=workdir,
            network_ns=self._own_netns,
            image_root=self._image_root,
            env=self._env(who, env),
        )
        proc = await start_local_process(
            host_argv,
            stdin=stdin,
            merge_stderr=merge_stderr,
            on_close=self._processes.discard,
        )
        self._counts["processes_started"] += 1
        self._processes.add(proc)
        return proc

    async def _run(
        self,
        argv: list[str],
        *,
        user: str | None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        data: bytes | None = None,
        merge_stderr: bool = True,
        max_output: int | None = MAX_EXEC_OUTPUT,
    ) -> tuple[int, bytes, bytes, bool]:
        """Run to completion: (status, stdout, stderr, truncated). Cancel kills the group."""
        proc = await self.start_process(
            argv, user=user, env=env, cwd=cwd, stdin=data is not None, merge_stderr=merge_stderr
        )
        out = bytearray()
        err = bytearray()
        truncated = False
        try:

            async def pump(stream: trio.abc.ReceiveStream | None, buf: bytearray) -> None:
                nonlocal truncated
                if stream is None:
                    return
                while chunk := await stream.receive_some(65536):
                    buf += chunk
                    if max_output is not None and len(buf) > max_output:
                        del buf[: len(buf) - max_output]
                        truncated = True

            async def feed() -> None:
                assert proc.stdin is not None
                assert data is not None
                try:
                    await proc.stdin.send_all(data)
                except trio.BrokenResourceError:
                    # The process stopped reading (a write it refused, e.g. a denied path, ends
                    # before reading its input): its exit status says why.
                    pass
                finally:
                    await proc.stdin.aclose()

            async with trio.open_nursery() as nursery:
                if data is not None:
                    nursery.start_soon(feed)
                nursery.start_soon(pump, proc.stdout, out)
                nursery.start_soon(pump, proc.stderr, err)
                status = await proc.wait()
                # A background child that kept our pipe open must not hold the caller hostage:
                # give the pipes a moment to drain, then stop reading.
                nursery.cancel_scope.deadline = trio.current_time() + _DRAIN_AFTER_EXIT_SEC
        finally:
            await proc.aclose()
        if self._dead.is_set() or not self._init_alive():
            raise SandboxNotRunningError(f"local sandbox {self._id} died while running {argv[:3]}")
        return status, bytes(out), bytes(err), truncated

    def _init_alive(self) -> bool:
        try:
            with open(f"/proc/{self._init_pid}/stat", "rb") as f:
                return f.read().split(b") ", 1)[1][:1] != b"Z"
        except (FileNotFoundError, IndexError):
            return False

    # -- files ------------------------------------------------------------------------------
    async def write_file(
        self,
        path: str,
        data: bytes | str,
        *,
        user: str | None = None,
        mode: int | None = None,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> None:
        """Create or replace ``path`` as ``user`` (parents created), within ``timeout``."""
        check_abs_path(path)
        payload = data.encode() if isinstance(data, str) else bytes(data)
        with file_time_bound("write", path, timeout):
            status, _, err, _ = await self._run(
                ["/bin/sh", "-c", WRITE_SCRIPT, "write_file", *write_args(path, mode)],
                user=user,
                cwd="/",
                data=payload,
                merge_stderr=False,
            )
        error = write_error(status, path, user, err.decode(errors="replace").strip())
        if error is not None:
            raise error
        self._counts["files_written"] += 1

    async def read_file(
        self,
        path: str,
        *,
        user: str | None = None,
        max_bytes: int | None = DEFAULT_READ_MAX_BYTES,
        special: bool = False,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> bytes:
        """The bytes of ``path``; see :meth:`trio_swe.Sandbox.read_file` for the caps."""
        check_abs_path(path)
        check_read_args(max_bytes, special)
        with file_time_bound("read", path, timeout):
            status, out, err, _ = await self._run(
                [
                    "/bin/sh",
                    "-c",
                    _READ_SCRIPT,
                    "read_file",
                    path,
                    "" if max_bytes is None else str(max_bytes),
                    "1" if special else "",
                ],
                user=user,
                cwd="/",
                merge_stderr=False,
                max_output=None,  # a file is returned whole or not at all; `head` bounds it
            )
        detail = err.decode(errors="replace").strip()
        if status == _NOT_FOUND_STATUS:
            raise SandboxFileNotFoundError(f"{path}: no such file in sandbox {self._id}")
        if status == NOT_A_FILE_STATUS:
            raise SandboxNotAFileError(path, detail or "special file")
        if status == DENIED_STATUS:
            raise SandboxPermissionError(
                f"read_file {path!r}: not permitted for user {user or 'root'}: {detail}"
            )
        if status == _TOO_LARGE_STATUS and max_bytes is not None:
            raise SandboxFileTooLargeError(
                path, max_bytes, int(detail) if detail.isascii() and detail.isdigit() else None
            )
        if status != 0:
            raise SandboxError(f"read_file {path!r} failed ({status}): {detail}")
        if max_bytes is not None and len(out) > max_bytes:
            raise SandboxFileTooLargeError(path, max_bytes)
        self._counts["files_read"] += 1
        return out

    # -- lifecycle --------------------------------------------------------------------------
    async def _destroy(self) -> None:
        """Kill every process in the sandbox and remove its files on the host (:meth:`kill`).

        Every process is gone when this returns; the state directory is moved into the
        backend's trash, removed in the background (see :mod:`._trash`).
        """
        try:
            # The pid namespace's init: when it dies the kernel kills every process in the
            # namespace, including daemons that called setsid.
            outcome = await kill_namespace(
                self._init_pid, self._bwrap, what=f"local sandbox {self._id}"
            )
            self._counts["kill_reaped"] = outcome.reaped
            self._counts["kill_timed_out"] = outcome.timed_out
            for proc in list(self._processes):
                await proc.aclose()
            if self._trash is not None:
                self._trash.discard(self._state_dir)
            else:
                await trio.to_thread.run_sync(shutil.rmtree, self._state_dir, True)
        finally:
            self._dead.set()


class LocalSandboxStatistics(SandboxStatistics, frozen=True, kw_only=True):
    """A local sandbox's counters.

    Attributes:
        workspace_mode: ``"overlay"`` (copy-on-write over the image) or ``"copy"``.
        boot_sec: wall time of the boot.
        exec_timeouts: ``exec`` calls that overran their ``timeout``.
        files_written: ``write_file`` calls.
        files_read: ``read_file`` calls.
        processes_started: processes started (``exec`` and ``start_process``).
        live_processes: processes started and not yet reaped.
        alive: the sandbox's init still runs.
        kill_sec: how long ``kill`` took, once it ran.
        kill_reaped: processes of the sandbox that the kernel handed to us (we are a child
            subreaper, or PID 1) and that the kill reaped.
        kill_timed_out: the kill's wait for the namespace to be empty ran out (logged).
    """

    workspace_mode: str
    boot_sec: float
    exec_timeouts: int
    files_written: int
    files_read: int
    processes_started: int
    live_processes: int
    alive: bool
    kill_sec: float | None = None
    kill_reaped: int | None = None
    kill_timed_out: bool | None = None


#: How long a kill waits for the namespace's processes to be gone (one stuck in the kernel,
#: e.g. on a dead network file system, must not hang the kill forever).
_NAMESPACE_EXIT_SEC = 30.0
#: The longest pause between two looks for adopted zombies while a kill waits.
_REAP_STEP_MAX_SEC = 0.25


def _bwrap_pidfds(leader: int, init_pid: int | None) -> list[int]:
    """Pidfds of the outer ``bwrap`` (the boot shell's child, the init's parent), opened before
    anything is killed: once its parent shell is killed it may become ours (see :mod:`._reap`)."""
    pids = set(children_of(leader))
    if init_pid is not None:
        pids.add(parent_of(init_pid))
    pids -= {0, 1, os.getpid(), leader}
    fds = []
    for pid in sorted(pids):
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            continue
        # Opened on the pid we read: if it was recycled meanwhile, it is not bwrap.
        if comm_of(pid) == "bwrap":
            fds.append(fd)
        else:
            os.close(fd)
    return fds


async def kill_namespace(init_pid: int | None, leader: trio.Process, *, what: str) -> KillOutcome:
    """SIGKILL a sandbox's pid-namespace init and its boot's process group (``leader``: the
    shell that runs bwrap), wait until the namespace is empty, and reap what the kernel handed
    to us (:mod:`._reap`). Already gone is fine.

    The kernel holds the init's exit until every other process of its namespace has been
    reaped, and a pidfd turns readable on that exit: so once it is readable, no daemon of the
    sandbox is left. Killing the init's parent (bwrap) returns sooner than that, so waiting on
    bwrap alone leaves dying daemons behind for a moment. A process of the namespace that was
    handed to us (we are a child subreaper, or PID 1) is reaped while we wait, or the init
    would wait for it forever. The wait is bounded; running out of it is logged.
    """
    fds = _bwrap_pidfds(leader.pid, init_pid)
    init_fd = None
    if init_pid is not None:
        try:
            init_fd = os.pidfd_open(init_pid)
        except ProcessLookupError:
            pass
    waits = [fd for fd in (init_fd, *fds) if fd is not None]
    reaped = 0
    expired = False
    try:
        if init_fd is not None:
            try:
                signal.pidfd_send_signal(init_fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        kill_process_group(leader.pid)
        deadline = trio.current_time() + _NAMESPACE_EXIT_SEC
        step = 0.005
        for fd in waits:
            while not expired:
                reaped += reap_adopted_zombies()
                with trio.move_on_at(min(deadline, trio.current_time() + step)) as scope:
                    await trio.lowlevel.wait_readable(fd)
                if not scope.cancelled_caught:
                    break
                expired = trio.current_time() >= deadline
                step = min(2 * step, _REAP_STEP_MAX_SEC)
        # The outer bwrap may exit before its parent shell does; it is handed to us when the
        # shell exits, which has happened once the shell is reaped, so the last sweep is after.
        await leader.wait()
        reaped += sum(reap_pidfd(fd) for fd in waits) + reap_adopted_zombies()
    finally:
        for fd in waits:
            os.close(fd)
    if expired:
        left = children_of(init_pid) if init_pid is not None else []
        logger.warning(
            "%s: its pid namespace was not empty %.0f s after the kill (init %s, its children "
            "%s); going on without waiting longer",
            what,
            _NAMESPACE_EXIT_SEC,
            init_pid,
            left,
        )
    await close_process_streams(leader)
    return KillOutcome(reaped=reaped, timed_out=expired)


class KillOutcome(NamedTuple):
    """What a :func:`kill_namespace` did: processes handed to us and reaped; whether the wait
    for the namespace to empty ran out."""

    reaped: int
    timed_out: bool


def kill_process_group(pgid: int) -> None:
    """SIGKILL a whole process group; already gone is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def close_process_streams(process: trio.Process) -> None:
    """Close our ends of a finished process's pipes (the init's lifeline among them)."""
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            await stream.aclose()
