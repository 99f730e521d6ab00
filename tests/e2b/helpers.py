"""Helpers for E2B tests: a backend pointed at a server, and a server in its own thread.

A server in its own thread (its own ``trio.run``) keeps serving whatever trio run the client is
in, e.g. hypothesis examples that pytest-trio runs outside the fixtures' run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

from trio_swe.sandbox.e2b import E2BBackend, RetryPolicy
from trio_swe.testing import EnvdServer, EnvdServerStatistics, FaultPlan, open_envd_server

from ..trio_thread import TrioThread

T = TypeVar("T")

#: Fast retries and a short keepalive so that silent streams are found in ~3.5 s in tests.
TEST_POLICY = RetryPolicy(max_attempts=8, base_delay=0.05, max_delay=0.5, max_retry_after=1.0)


def e2b_backend_for(server: EnvdServer, **kw: Any) -> E2BBackend:
    """An E2BBackend speaking h2c to ``server`` (HTTP/2 without TLS)."""
    opts: dict[str, Any] = {
        "h2c": True,
        "keepalive_interval": 1.0,
        "retry_policy": TEST_POLICY,
        "seed": 1,
        "request_timeout": 20.0,
    }
    opts.update(kw)
    return E2BBackend(
        api_key=server.api_key, api_url=server.api_url, sandbox_url=server.sandbox_url, **opts
    )


@asynccontextmanager
async def open_server_and_backend(
    faults: FaultPlan | None = None, **server_kw: Any
) -> AsyncIterator[tuple[EnvdServer, E2BBackend]]:
    async with (
        open_envd_server(faults=faults, **server_kw) as server,
        e2b_backend_for(server) as backend,
    ):
        yield server, backend


class ThreadedServer:
    """An :class:`EnvdServer` running in its own thread and trio run."""

    def __init__(self, server: EnvdServer, token: trio.lowlevel.TrioToken) -> None:
        self.server = server
        self.token = token

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        """Run ``await fn()`` in the server's trio run."""
        return await trio.to_thread.run_sync(
            lambda: trio.from_thread.run(fn, trio_token=self.token)
        )

    async def live_sandbox_ids(self) -> list[str]:
        async def get() -> list[str]:
            return self.server.live_sandbox_ids()

        return await self.call(get)

    async def statistics(self) -> EnvdServerStatistics:
        async def get() -> EnvdServerStatistics:
            return self.server.statistics()

        return await self.call(get)


@asynccontextmanager
async def open_server_in_thread(**server_kw: Any) -> AsyncIterator[ThreadedServer]:
    """``open_envd_server(**server_kw)`` in a thread of its own, for the block's duration."""
    runner = TrioThread(lambda: open_envd_server(**server_kw), "envd-server")
    server = await trio.to_thread.run_sync(runner.started)
    try:
        yield ThreadedServer(server, runner.token)
    finally:
        runner.stop()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(runner.join)
