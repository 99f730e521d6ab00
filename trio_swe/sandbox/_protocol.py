"""The contracts every backend implements: :class:`Sandbox` and :class:`Backend`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol, runtime_checkable

import trio

from ._background import PosArgs
from ._types import (
    DEFAULT_FILE_TIMEOUT_SEC,
    DEFAULT_READ_MAX_BYTES,
    BackendStatistics,
    ExecResult,
    SandboxSpec,
    SandboxStatistics,
)


@runtime_checkable
class Sandbox(Protocol):
    """One running sandbox. Obtain it from :func:`trio_swe.open_sandbox`.

    Short commands go through :meth:`exec`; anything that may outlive an RPC stream (agent runs,
    test suites, installs) goes through :func:`trio_swe.exec_and_wait`, which is built on ``exec``
    and the file calls alone, so it works on every backend.
    """

    @property
    def id(self) -> str:
        """The backend's identifier of this sandbox."""
        ...

    @property
    def workdir(self) -> str:
        """Absolute path of the repository inside the sandbox."""
        ...

    def start_background(
        self, async_fn: Callable[[*PosArgs], Awaitable[object]], *args: *PosArgs
    ) -> None:
        """Run ``async_fn(*args)`` as a background task of this sandbox.

        It runs in the nursery that :func:`~trio_swe.open_sandbox` owns, so it outlives the
        caller's cancel scope (a poller whose caller was cancelled, a cleanup RPC sent after
        the call has returned) and is cancelled when the sandbox closes. A task that raises
        takes the sandbox's block down with it: catch what is not fatal inside ``async_fn``.

        Raises:
            SandboxNotRunningError: the sandbox is closing (its nursery takes no new tasks).
        """
        ...

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
        """Run a short shell command and wait for it.

        Args:
            cmd: a shell command, run with ``/bin/sh -c``.
            user: the user to run as (default root).
            env: extra environment variables.
            cwd: working directory (default: the sandbox's workdir).
            timeout: seconds before the command is killed and ``exit_code=-1``,
                ``reason="timeout"`` is returned. ``None`` waits forever.
            idempotent: the command may safely run twice, so a transport failure after the
                request was sent may be retried. Backends without retries ignore it.

        Raises:
            SandboxError: an infrastructure failure; never for a non-zero exit.
        """
        ...

    async def write_file(
        self,
        path: str,
        data: bytes | str,
        *,
        user: str | None = None,
        mode: int | None = None,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> None:
        """Create or replace the file at ``path`` (parents are created).

        Raises:
            SandboxFileTimeoutError: not done within ``timeout`` seconds (None: no bound).
        """
        ...

    async def read_file(
        self,
        path: str,
        *,
        user: str | None = None,
        max_bytes: int | None = DEFAULT_READ_MAX_BYTES,
        special: bool = False,
        timeout: float | None = DEFAULT_FILE_TIMEOUT_SEC,
    ) -> bytes:
        """Return the file's bytes, whole. Cancellable at any point.

        Args:
            path: an absolute path.
            user: who reads it (default root).
            max_bytes: a larger file raises :class:`SandboxFileTooLargeError` (at most
                ``max_bytes + 1`` bytes are ever read); None reads any size.
            special: also read what is not a regular file (a device, a FIFO): up to
                ``max_bytes``, blocking as the file does (a FIFO waits for a writer).
            timeout: seconds the whole read may take (None: no bound), so a file that blocks
                when read (``/proc/kmsg``, a FIFO) ends in an error, not a hang.

        Raises:
            SandboxFileNotFoundError: the file does not exist.
            SandboxNotAFileError: not a regular file (a directory; without ``special``, any
                other kind).
            SandboxFileTooLargeError: more than ``max_bytes``.
            SandboxFileTimeoutError: not done within ``timeout``.
            SandboxError: any other failure. Never returns ``b""`` for a failure.
        """
        ...

    async def kill(self) -> None:
        """Destroy the sandbox and every process in it. Idempotent; killing a gone sandbox is fine."""
        ...

    def statistics(self) -> SandboxStatistics:
        """A frozen snapshot of this sandbox's counters; each backend returns its subclass
        (RPCs, retries, workspace mode...)."""
        ...


class Backend(Protocol):
    """A place where sandboxes come from (local bubblewrap, E2B, ...).

    A backend is a :class:`trio.abc.AsyncResource`: ``aclose()`` releases its connections
    (E2B's HTTP/2 pools; nothing for the local backend), and ``async with backend:`` does it on
    the way out. Sandboxes are not killed by ``aclose``: :func:`~trio_swe.open_sandbox` does that.
    """

    name: str

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        """Boot one sandbox whose background tasks run in ``nursery``.

        If cancelled or failing midway, the backend must release whatever it already created.
        """
        ...

    def statistics(self) -> BackendStatistics:
        """A frozen snapshot of the backend's counters (sandboxes created/killed/live, and each
        backend's own in its subclass: retries, pools, pulls...)."""
        ...

    async def aclose(self) -> None:
        """Release the backend's connections. Idempotent."""
        ...
