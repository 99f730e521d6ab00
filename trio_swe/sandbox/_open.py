"""``open_sandbox``: the one way to get a sandbox, and the guarantee that it is killed."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import trio

from ._protocol import Backend, Sandbox
from ._types import SandboxSpec

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
    )
    try:
        async with trio.open_nursery() as nursery:
            sandbox: Sandbox | None = None
            try:
                sandbox = await backend.create_sandbox(spec, nursery)
                yield sandbox
            finally:
                nursery.cancel_scope.cancel()
                if sandbox is not None:
                    with trio.CancelScope(shield=True) as scope:
                        scope.deadline = trio.current_time() + kill_timeout_sec
                        await sandbox.kill()
    except BaseExceptionGroup as group:
        # The nursery is ours, not the caller's: give back the one error it wrapped, so
        # `except SandboxBootError` (or the caller's own exception) works as written.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
