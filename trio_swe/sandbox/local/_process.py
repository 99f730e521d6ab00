"""Processes inside a local sandbox: ``nsenter`` into its namespaces, one process group each.

Each command is started through ``nsenter`` in a new session on the host, so the whole tree it
spawns (short of a deliberate ``setsid``) shares one process group that the host can signal,
whatever pid namespace its members live in.

``nsenter`` runs on the host (as root, before it enters the namespaces): it is found by absolute
path and started with :data:`HOST_ENV`, never with the command's environment, which ``env -i``
applies once inside the sandbox. Otherwise a ``PATH`` naming a host directory would pick the
``nsenter`` to run, and ``LD_PRELOAD`` would load a host library into it.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import trio

from ..._errors import BackendUnavailableError, InvalidArgumentError, SandboxError
from ._reap import children_of, parent_of
from ._users import SandboxUser

logger = logging.getLogger("trio_swe.sandbox")

#: Where the launcher's tools are looked up: system directories, which the sandbox sees too
#: (its root is the host's, read-only, except the private /tmp and /root).
_SYSTEM_PATH: Final = "/usr/sbin:/usr/bin:/sbin:/bin"
#: The whole environment of the host-side ``nsenter``.
HOST_ENV: Final[Mapping[str, str]] = {"PATH": _SYSTEM_PATH, "LC_ALL": "C"}


@functools.cache
def tool_path(name: str) -> str:
    """The absolute path of a launcher tool (``nsenter``, ``setpriv``, ``env``)."""
    found = shutil.which(name, path=_SYSTEM_PATH) or shutil.which(name)
    if found is None:
        raise BackendUnavailableError(f"the local backend needs `{name}` (util-linux/coreutils)")
    return os.path.abspath(found)


def nsenter_argv(
    init_pid: int,
    argv: Sequence[str],
    *,
    user: SandboxUser,
    cwd: str,
    network_ns: bool,
    env: Mapping[str, str],
    image_root: bool = False,
) -> list[str]:
    """The host command that runs ``argv`` as ``user`` in ``cwd`` inside the sandbox, with
    exactly the environment ``env`` (applied by ``env -i`` after the namespaces are entered).

    ``image_root``: the sandbox's root is an image, which may lack ``setpriv``; nsenter itself
    then drops to the user (primary group only, which is all the sandbox's users have).
    """
    out = [tool_path("nsenter"), "-t", str(init_pid), "-m", "-p", "-u", "-i"]
    if network_ns:
        out.append("-n")
    if image_root and user.uid != 0:
        out += [f"--setgid={user.gid}", f"--setuid={user.uid}"]
    out += ["-r", f"--wdns={cwd}", "--"]
    if user.uid != 0 and not image_root:
        out += [tool_path("setpriv"), f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups"]
    out += [tool_path("env"), "-i", *(f"{k}={v}" for k, v in env.items())]
    return out + list(argv)


#: How long a kill waits for ``nsenter`` to exit once its child is killed, before it kills
#: the whole group (the child's zombie then goes to the host's reaper; see ``_kill_group``).
_NSENTER_EXIT_SEC = 5.0


class LocalProcess:
    """A process running in a local sandbox, with streams (for servers such as envd's).

    Attributes:
        pid: the host pid of the ``nsenter`` leading the process group; unique on the host.
        stdout, stderr: the process's output streams (``stderr`` is None when merged).
        stdin: its input stream when requested, else None.
    """

    def __init__(
        self, process: trio.Process, on_close: Callable[[LocalProcess], None] | None = None
    ) -> None:
        self._process = process
        self._on_close = on_close
        self.pid: int = process.pid
        self.stdout: trio.abc.ReceiveStream | None = process.stdout
        self.stderr: trio.abc.ReceiveStream | None = process.stderr
        self.stdin: trio.abc.SendStream | None = process.stdin

    @property
    def returncode(self) -> int | None:
        """The exit status once finished (negative: killed by that signal), else None."""
        return self._process.returncode

    async def wait(self) -> int:
        """Wait for the exit and return the status (negative: killed by that signal)."""
        return await self._process.wait()

    async def _kill_group(self) -> None:
        """SIGKILL the process group, the command inside the sandbox before ``nsenter``.

        ``nsenter``'s child lives in the sandbox's pid namespace, its parent on the host.
        Killed together (one ``killpg``), the child's zombie goes to the host's reaper (PID 1
        or a subreaper), and until that one reaps it the sandbox's init cannot exit, so a kill
        of the sandbox waits for it (2 s on a machine whose PID 1 reaps every 2 s). Killed
        first, it is reaped by ``nsenter``, which then exits; then the rest of the group is
        killed. ``nsenter`` stays unreaped until then, so the group's id (its pid) cannot have
        been reused under the ``killpg``. (Not stopped first with SIGSTOP: ``nsenter`` answers
        a stopped child by stopping itself.)
        """
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            pidfd = None
        try:
            if pidfd is not None and _kill_children(self.pid):
                with trio.move_on_after(_NSENTER_EXIT_SEC) as waited:
                    await trio.lowlevel.wait_readable(pidfd)  # exited, not reaped
                if waited.cancelled_caught:
                    logger.warning(
                        "nsenter %d did not exit %.0f s after its child was killed; killing "
                        "its group (the child's zombie goes to the host's reaper)",
                        self.pid,
                        _NSENTER_EXIT_SEC,
                    )
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def send_signal(self, sig: int) -> None:
        """Signal the whole process group; a finished process is not an error."""
        if self._process.returncode is not None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    async def aclose(self) -> None:
        """Kill the process group (if still running), reap it, close the streams."""
        with trio.CancelScope(shield=True):
            if self._process.returncode is None:  # polls: reaps nsenter if it has exited
                await self._kill_group()
            await self._process.wait()
            for stream in (self.stdin, self.stdout, self.stderr):
                if stream is not None:
                    await stream.aclose()
        if self._on_close is not None:
            self._on_close(self)
            self._on_close = None


def _kill_children(pid: int) -> int:
    """SIGKILL the children of ``pid`` (opened by pidfd, checked to be its children still:
    a pid recycled meanwhile is left alone); how many were signalled."""
    killed = 0
    for child in children_of(pid):
        try:
            fd = os.pidfd_open(child)
        except OSError:
            continue
        try:
            if parent_of(child) == pid:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
                killed += 1
        except ProcessLookupError:
            pass
        finally:
            os.close(fd)
    return killed


async def start_local_process(
    argv: list[str],
    *,
    stdin: bool,
    merge_stderr: bool,
    on_close: Callable[[LocalProcess], None] | None = None,
) -> LocalProcess:
    """Start ``argv`` (an nsenter command) in a session of its own, with pipes and
    :data:`HOST_ENV`."""
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            env=dict(HOST_ENV),
            start_new_session=True,
        )
    except OSError as exc:
        if exc.errno == errno.E2BIG:
            # Each string is checked before (check_command, check_env): the total is too big.
            raise InvalidArgumentError(
                "the command and its environment together exceed the kernel's limit on "
                "arguments (E2BIG): write big inputs to a file instead"
            ) from exc
        raise SandboxError(f"cannot start {argv[0]}: {exc}") from exc
    return LocalProcess(process, on_close)
