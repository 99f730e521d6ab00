"""``open_sandbox``: the one way to get a sandbox, and the guarantee that it is killed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import trio

from .._groups import collapse, note_cleanup_failure
from ._protocol import Backend, Sandbox
from ._types import ResourceLimits, SandboxSpec

#: Upper bound on the shielded kill at exit, so a hung provider cannot hang the caller forever.
DEFAULT_KILL_TIMEOUT_SEC = 30.0


@asynccontextmanager
async def open_sandbox(
    backend: Backend,
    image: str,
    *,
    workdir: str = "/testbed",
    env: Mapping[str, str] | None = None,
    network: bool = True,
    ttl_sec: float = 3600.0,
    metadata: Mapping[str, str] | None = None,
    limits: ResourceLimits | None = None,
    kill_timeout_sec: float = DEFAULT_KILL_TIMEOUT_SEC,
) -> AsyncIterator[Sandbox]:
    """Boot a sandbox and kill it on every way out of the block.

    The block's nursery owns the sandbox's background tasks (keepalive pollers of
    :func:`trio_swe.exec_and_wait`). On exit, normal or not (exception, cancellation,
    ``KeyboardInterrupt``), those tasks are cancelled and the sandbox is killed inside a shielded
    cancel scope bounded by ``kill_timeout_sec``.

    Example::

        async with open_sandbox(LocalBackend(), "/path/to/repo@HEAD") as sb:
            result = await sb.exec("python -m pytest -q")
    """
    spec = SandboxSpec(
        image=image,
        workdir=workdir,
        env=dict(env or {}),
        network=network,
        ttl_sec=ttl_sec,
        metadata=dict(metadata or {}),
        limits=limits,
    )
    body_error: BaseException | None = None
    sandbox: Sandbox | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                sandbox = await backend.create_sandbox(spec, nursery)
                yield sandbox
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                nursery.cancel_scope.cancel()
                if sandbox is not None:
                    await _kill(sandbox, kill_timeout_sec, body_error)
    except BaseExceptionGroup as group:
        # The nursery is ours, not the caller's: the block's own error (or the boot's) comes
        # out as itself, so `except SandboxBootError` works as written; a failing kill is
        # attached to it as a note, never in its place.
        collapse(group, primary=body_error, what=f"killing sandbox {_id_of(sandbox)}")


async def _kill(sandbox: Sandbox, timeout_sec: float, body_error: BaseException | None) -> None:
    """Kill, shielded and bounded. A failure is the caller's error only if there is no other."""
    try:
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + timeout_sec
            await sandbox.kill()
    except Exception as exc:
        if body_error is None:
            raise
        note_cleanup_failure(body_error, exc, f"killing sandbox {_id_of(sandbox)}")


def _id_of(sandbox: Sandbox | None) -> str:
    try:
        return sandbox.id if sandbox is not None else "(not booted)"
    except Exception:
        return "(unknown id)"
