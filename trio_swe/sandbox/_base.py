"""What every backend's sandbox shares, written once: its id and workdir, background tasks in
the nursery that ``open_sandbox`` owns, and the counters behind ``statistics()``.

:class:`SandboxBase` is that plumbing (every backend). :class:`RunSandboxBase` adds what the
backends share that run each command to its end and time it out themselves (local, docker; for
e2b, envd does): ``exec`` itself, and a kill that runs once and is timed.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from ._background import PosArgs, start_in
from ._types import ExecReason, ExecResult
from ._validate import check_command


class SandboxBase:
    """A sandbox's identity, background tasks and counters.

    Args:
        sandbox_id: the backend's identifier of the sandbox.
        workdir: absolute path of the repository inside it.
        nursery: where its background tasks run (the one ``open_sandbox`` owns).
        counters: the backend's own counters and their initial values, beside ``execs``.
    """

    def __init__(
        self, *, sandbox_id: str, workdir: str, nursery: trio.Nursery, **counters: Any
    ) -> None:
        self._id = sandbox_id
        self._workdir = workdir
        self._nursery = nursery
        #: The fields of the backend's :class:`~trio_swe.sandbox.SandboxStatistics` that are
        #: counted as calls go (``statistics()`` adds what it reads at the moment).
        self._counts: dict[str, Any] = {"execs": 0, **counters}

    @property
    def id(self) -> str:
        return self._id

    @property
    def workdir(self) -> str:
        return self._workdir

    def start_background(
        self, async_fn: Callable[[*PosArgs], Awaitable[object]], *args: *PosArgs
    ) -> None:
        start_in(self._nursery, self._id, async_fn, *args)


class RunSandboxBase(SandboxBase):
    """A sandbox that runs each command to its end itself (:meth:`_run`), under a client-side
    timeout, and whose kill runs once and is timed (local, docker).

    Counts, besides ``execs``: ``boot_sec``, ``exec_timeouts``, ``files_written``,
    ``files_read`` and, once killed, ``kill_sec``.

    Args:
        on_close: called with the sandbox once its kill has run (the backend's bookkeeping).
    """

    def __init__(
        self,
        *,
        sandbox_id: str,
        workdir: str,
        nursery: trio.Nursery,
        boot_sec: float,
        on_close: Callable[[Any], None] | None = None,
        **counters: Any,
    ) -> None:
        super().__init__(
            sandbox_id=sandbox_id,
            workdir=workdir,
            nursery=nursery,
            boot_sec=boot_sec,
            exec_timeouts=0,
            files_written=0,
            files_read=0,
            **counters,
        )
        self._on_close = on_close
        self._killed = False

    async def _run(
        self,
        argv: list[str],
        *,
        user: str | None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> tuple[int, bytes, bytes, bool]:
        """Run ``argv`` to its end: (status, output, stderr, truncated); a negative status is
        a kill by that signal (as trio reports it). Cancelled, it kills what it started."""
        raise NotImplementedError

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
        """Run ``cmd`` with ``/bin/sh -c``; see :meth:`trio_swe.Sandbox.exec`."""
        del idempotent  # a child process, a unix socket: no reply is lost, nothing to retry
        check_command(cmd)
        self._counts["execs"] += 1
        start = trio.current_time()
        with trio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
            status, out, _, truncated = await self._run(
                ["/bin/sh", "-c", cmd], user=user, env=env, cwd=cwd
            )
        duration = trio.current_time() - start
        if scope.cancelled_caught:
            self._counts["exec_timeouts"] += 1
            return ExecResult(exit_code=-1, reason="timeout", duration_sec=duration)
        reason: ExecReason = "exit"
        if status < 0:
            status, reason = 128 - status, "signal"
        return ExecResult(
            exit_code=status,
            output=out.decode("utf-8", errors="replace"),
            reason=reason,
            duration_sec=duration,
            output_truncated=truncated,
        )

    async def kill(self) -> None:
        """Destroy the sandbox (:meth:`_destroy`, shielded) once; later calls return at once.
        Its time is counted as ``kill_sec``, and ``on_close`` is told, whatever happened."""
        if self._killed:
            return
        self._killed = True
        t0 = time.monotonic()
        with trio.CancelScope(shield=True):
            try:
                await self._destroy()
            finally:
                self._counts["kill_sec"] = time.monotonic() - t0
                if self._on_close is not None:
                    self._on_close(self)

    async def _destroy(self) -> None:
        """Kill every process of the sandbox and release what it holds."""
        raise NotImplementedError
