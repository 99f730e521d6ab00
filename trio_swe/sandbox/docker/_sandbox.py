"""``DockerSandbox``: one container; commands through the exec API, files through the archive API."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable, Mapping
from typing import Final

import trio

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxFileTooLargeError,
    SandboxNotAFileError,
    SandboxPermissionError,
)
from .._base import RunSandboxBase
from .._bounds import file_time_bound
from .._types import DEFAULT_FILE_TIMEOUT_SEC, DEFAULT_READ_MAX_BYTES, SandboxStatistics
from .._validate import check_abs_path, check_env, check_read_args, check_user
from .._writes import WRITE_SCRIPT, write_args, write_error
from ._engine import Engine, EngineError
from ._wire import env_list, file_archive, first_member, resolve_link, staged_archive

#: ``exec`` keeps at most this much output (the tail), as the local backend does.
MAX_EXEC_OUTPUT: Final = 8 * 1024 * 1024
#: Marks every process an ``exec`` starts, so a timeout or cancellation can find and kill them
#: all (the exec API has no kill): the value is a nonce per call.
EXEC_MARK: Final = "TRIO_SWE_EXEC"
_KILL_SEC: Final = 15.0
#: WRITE_SCRIPT on the bytes staged at ``$4`` (``<stage>/f``), then the stage removed.
_STAGED_WRITE: Final = f'( {WRITE_SCRIPT}) < "$4"; s=$?; rm -rf -- "${{4%/f}}"; exit $s'

# Freezes then kills every process whose environment holds the call's mark; repeats until none.
_KILL_SCRIPT: Final = (
    'm="TRIO_SWE_EXEC=$1"; for round in 1 2 3 4 5; do found=; '
    "for e in /proc/[0-9]*/environ; do p=${e#/proc/}; p=${p%/environ}; "
    '[ "$p" = "$$" ] && continue; '
    "if tr '\\000' '\\n' < \"$e\" 2>/dev/null | grep -qxF \"$m\"; then "
    'kill -STOP "$p" 2>/dev/null; found="$found $p"; fi; done; '
    '[ -z "$found" ] && exit 0; kill -KILL $found 2>/dev/null; done'
)


class DockerSandboxStatistics(SandboxStatistics, frozen=True, kw_only=True):
    """A docker sandbox's counters.

    Attributes:
        boot_sec: create + start + tree copy, measured by the backend.
        exec_timeouts: ``exec`` calls that overran their ``timeout``.
        exec_kills: commands killed in the container (timeouts, cancellations).
        files_written: ``write_file`` calls.
        files_read: ``read_file`` calls.
        kill_sec: how long ``kill`` took, once it ran.
    """

    boot_sec: float
    exec_timeouts: int
    exec_kills: int
    files_written: int
    files_read: int
    kill_sec: float | None = None


class DockerSandbox(RunSandboxBase):
    """A running container. Create it with ``open_sandbox(DockerBackend(), image)``."""

    def __init__(
        self,
        *,
        engine: Engine,
        container_id: str,
        name: str,
        workdir: str,
        nursery: trio.Nursery,
        env: Mapping[str, str],
        boot_sec: float,
        on_close: Callable[[DockerSandbox], None] | None = None,
    ) -> None:
        super().__init__(
            sandbox_id=container_id,
            workdir=workdir,
            nursery=nursery,
            boot_sec=boot_sec,
            on_close=on_close,
            exec_kills=0,
        )
        self._engine = engine
        self.name = name
        self._env = dict(env)
        self._ids: dict[str, tuple[int, int]] = {"root": (0, 0)}

    def statistics(self) -> DockerSandboxStatistics:
        return DockerSandboxStatistics(**self._counts)

    def record_boot(self, seconds: float) -> None:
        """Set the boot time (create + start + tree copy), measured by the backend."""
        self._counts["boot_sec"] = seconds

    # -- processes ----------------------------------------------------------------------------
    async def _start(
        self, argv: list[str], *, user: str | None, env: Mapping[str, str] | None, cwd: str | None
    ) -> tuple[str, str]:
        if user is not None:
            check_user(user)
        workdir = check_abs_path(cwd or self._workdir, what="cwd")
        mark = uuid.uuid4().hex
        merged = {**self._env, **check_env(env), EXEC_MARK: mark}
        body = {
            "Cmd": argv,
            "AttachStdin": False,
            "AttachStdout": True,
            "AttachStderr": True,
            "Tty": False,
            "Env": env_list(merged),
            "WorkingDir": workdir,
            "User": user or "",
        }
        return await self._engine.exec_create(self._id, body), mark

    async def _run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        max_output: int = MAX_EXEC_OUTPUT,
    ) -> tuple[int, bytes, bytes, bool]:
        """Run to completion: (status, merged output, stderr, truncated). Cancel kills it."""
        exec_id, mark = await self._start(argv, user=user, env=env, cwd=cwd)
        merged = bytearray()
        err = bytearray()
        truncated = False

        def on_frame(stream: int, data: bytes) -> None:
            nonlocal truncated
            merged.extend(data)
            if len(merged) > max_output:
                del merged[: len(merged) - max_output]
                truncated = True
            if stream == 2 and len(err) < 65536:
                err.extend(data[: 65536 - len(err)])

        finished = False
        try:
            await self._engine.exec_stream(exec_id, on_frame)
            info = await self._engine.exec_inspect(exec_id)
            while info.get("Running"):  # the stream ended just before the exit was recorded
                await trio.sleep(0.01)
                info = await self._engine.exec_inspect(exec_id)
            finished = True
        finally:
            if not finished:
                await self._kill_marked(mark)
        code = info.get("ExitCode")
        if code is None:
            raise SandboxError(f"exec {argv[:3]}: the daemon reported no exit code")
        # The runtime's refusals, before the command ran: its exit status and its one line.
        if isinstance(code, int) and code == 126 and b"unable to find user" in bytes(merged):
            raise InvalidArgumentError(f"unknown user {user!r} in container {self._id[:12]}")
        if isinstance(code, int) and code == 126 and b"chdir to cwd" in bytes(merged):
            raise InvalidArgumentError(
                f"cwd {cwd!r} is not a directory the user can enter in container {self._id[:12]}"
            )
        if code == 1 and bytes(merged) == f"exec {argv[0]}: argument list too long\n".encode():
            raise InvalidArgumentError(
                "the command and its environment together exceed the kernel's limit on "
                "arguments (E2BIG): write big inputs to a file instead"
            )
        return int(code), bytes(merged), bytes(err), truncated

    async def _kill_marked(self, mark: str) -> None:
        """Kill what one exec started (shielded, bounded): the exec API has no kill call."""
        self._counts["exec_kills"] += 1
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + _KILL_SEC
            try:
                kill_id, _ = await self._start(
                    ["/bin/sh", "-c", _KILL_SCRIPT, "kill", mark], user=None, env=None, cwd="/"
                )
                await self._engine.exec_stream(kill_id, lambda s, d: None)
            except SandboxError:
                pass  # the container is gone or going: its processes went with it

    # -- files --------------------------------------------------------------------------------
    async def _ids_of(self, user: str) -> tuple[int, int]:
        if user not in self._ids:
            check_user(user)
            status, out, _, _ = await self._run(
                ["/bin/sh", "-c", 'id -u "$1" && id -g "$1"', "id", user], cwd="/"
            )
            nums = out.split()
            if status != 0 or len(nums) != 2 or not all(n.isascii() and n.isdigit() for n in nums):
                raise InvalidArgumentError(f"unknown user {user!r} in container {self._id[:12]}")
            self._ids[user] = (int(nums[0]), int(nums[1]))
        return self._ids[user]

    async def write_file(
        self,
        path: str,
        data: bytes | str,
        *,
        user: str | None = None,
        mode: int | None = None,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> None:
        """Create or replace ``path`` as ``user`` (parents created as that user), within
        ``timeout``; see :meth:`_write_file`."""
        with file_time_bound("write", path, timeout):
            await self._write_file(path, data, user=user, mode=mode)

    async def _write_file(
        self, path: str, data: bytes | str, *, user: str | None, mode: int | None
    ) -> None:
        """Create or replace ``path`` as ``user`` (parents created as that user).

        The archive API writes with the daemon's rights, whoever owns the result: root's files
        go that way (one request); any other user's bytes are staged in a directory of its own
        and written by :data:`~trio_swe.sandbox._writes.WRITE_SCRIPT` run as that user, so the
        kernel decides what it may write, as on the other backends.
        """
        check_abs_path(path)
        if path.endswith("/"):
            raise InvalidArgumentError(f"write_file: {path!r} names a directory")
        payload = data.encode() if isinstance(data, str) else bytes(data)
        uid, gid = await self._ids_of(user or "root")
        if uid != 0:
            await self._write_as(path, payload, user, uid, gid, mode)
            self._counts["files_written"] += 1
            return
        parent, name = posixpath.split(posixpath.normpath(path))
        tar = file_archive(name, payload, mode=0o644 if mode is None else mode, uid=uid, gid=gid)
        for attempt in (0, 1):
            try:
                await self._put_archive(parent, tar, path)
                break
            except EngineError as exc:
                if "cannot overwrite directory" in exc.message:  # moby's pkg/archive says so
                    raise InvalidArgumentError(
                        f"write_file {path!r}: a directory, not a file path"
                    ) from exc
                if exc.status != 404 or attempt:
                    raise SandboxError(f"write_file {path!r} failed: {exc.message}") from exc
            # The parent is missing: make it as the user (so it owns what it creates), then retry.
            status, out, _, _ = await self._run(
                ["/bin/sh", "-c", 'mkdir -p -- "$1"', "mkdir", parent], user=user, cwd="/"
            )
            if status != 0:
                raise SandboxError(f"write_file {path!r}: cannot create {parent}: {out!r}")
        self._counts["files_written"] += 1

    async def _put_archive(self, directory: str, tar: bytes, path: str) -> None:
        """Extract ``tar`` at ``directory`` with the daemon's rights (for ``write_file path``).

        Raises:
            EngineError: the daemon refused (404: ``directory`` is missing).
        """
        await self._engine.request(
            "PUT",
            f"/containers/{self._id}/archive",
            params={"path": directory, "noOverwriteDirNonDir": "true"},
            content=tar,
            headers={"content-type": "application/x-tar"},
            what=f"write_file {path}",
        )

    async def _write_as(
        self, path: str, payload: bytes, user: str | None, uid: int, gid: int, mode: int | None
    ) -> None:
        stage = f".trio_swe-write-{uuid.uuid4().hex}"
        ran = False
        try:
            try:
                # In /tmp (sticky): the user may remove its own stage there, not from /.
                await self._put_archive(
                    "/tmp", staged_archive(stage, payload, uid=uid, gid=gid), path
                )
            except EngineError as exc:
                raise SandboxError(f"write_file {path!r} failed: {exc.message}") from exc
            argv = [*write_args(path, mode), f"/tmp/{stage}/f"]
            status, _, err, _ = await self._run(
                ["/bin/sh", "-c", _STAGED_WRITE, "write_file", *argv], user=user, cwd="/"
            )
            ran = True  # the script removed the stage
        finally:
            if not ran:  # cancelled or failed midway: the stage holds the bytes, remove it
                with trio.CancelScope(shield=True) as scope:
                    scope.deadline = trio.current_time() + _KILL_SEC
                    try:
                        await self._run(["rm", "-rf", "--", f"/tmp/{stage}"], cwd="/")
                    except SandboxError:
                        pass  # the container is gone or going, and its files with it
        error = write_error(status, path, user, err.decode(errors="replace").strip())
        if error is not None:
            raise error

    async def read_file(
        self,
        path: str,
        *,
        user: str | None = None,
        max_bytes: int | None = DEFAULT_READ_MAX_BYTES,
        special: bool = False,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> bytes:
        """The bytes of ``path`` (symlinks followed); :class:`SandboxFileNotFoundError` if missing.

        The archive API gives regular files only (``special`` changes nothing) and the whole
        archive is read before ``max_bytes`` is checked. All within ``timeout``.
        """
        check_abs_path(path)
        check_read_args(max_bytes, special)
        if user is not None:
            check_user(user)
        with file_time_bound("read", path, timeout):
            return await self._read_file(path, user, max_bytes)

    async def _read_file(self, path: str, user: str | None, max_bytes: int | None) -> bytes:
        asked = path
        for _hop in range(40):
            async with self._engine.get_archive(self._id, path) as response:
                body = await response.aread()
            if response.status_code == 404:
                raise SandboxFileNotFoundError(f"{path}: no such file in container {self._id[:12]}")
            if response.status_code != 200:
                raise SandboxError(
                    f"read_file {path!r} failed ({response.status_code}): {body[:300]!r}"
                )
            member = first_member(body)
            if member.kind == "file":
                if max_bytes is not None and len(member.data) > max_bytes:
                    raise SandboxFileTooLargeError(path, max_bytes, len(member.data))
                await self._check_readable(asked, user)
                self._counts["files_read"] += 1
                return member.data
            if member.kind != "symlink":
                raise SandboxNotAFileError(
                    path, "directory" if member.kind == "dir" else "special file"
                )
            path = resolve_link(path, member.linkname)
        raise SandboxError(f"read_file {path!r}: too many levels of symbolic links")

    async def _check_readable(self, path: str, user: str | None) -> None:
        """The archive API reads with the daemon's rights: a user other than root gets the
        bytes only if it may read them itself (``access(2)`` as that user, which also says
        no for a directory on the way that it cannot enter)."""
        if user is None or (await self._ids_of(user))[0] == 0:
            return
        status, _, _, _ = await self._run(
            ["/bin/sh", "-c", '[ -r "$1" ]', "read_file", path], user=user, cwd="/"
        )
        if status != 0:
            raise SandboxPermissionError(f"read_file {path!r}: not permitted for user {user}")

    # -- lifecycle ----------------------------------------------------------------------------
    async def _destroy(self) -> None:
        """Force-remove the container (and every process in it), for :meth:`kill`."""
        await remove_container(self._engine, self._id)


async def remove_container(engine: Engine, name_or_id: str) -> None:
    """``DELETE /containers/{id}?force=true&v=true``; a container already gone is fine."""
    try:
        await engine.request(
            "DELETE",
            f"/containers/{name_or_id}",
            params={"force": "true", "v": "true"},
            what=f"remove container {name_or_id[:24]}",
            ok=(200, 204, 404),
        )
    except EngineError as exc:
        if exc.status == 409 and "in progress" in exc.message:
            return  # another remove of it is under way
        raise
