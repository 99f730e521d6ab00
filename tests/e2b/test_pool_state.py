"""A connection whose first request was cancelled right after the HTTP/2 preface (httpx's HTTP/2,
which the REST API speaks).

httpcore 1.0 sets a new HTTP/2 connection's stream semaphore up in a loop of checkpoints after
sending the preface; a request cancelled there leaves the semaphore over-full, and once the
server's SETTINGS are read the next request on that connection fails with ``ValueError:
semaphore released too many times`` (and the events of other streams in that read are lost).
The retry table must take that for a broken connection: replace it and try again.
"""

from __future__ import annotations

import random
from typing import Any

import httpcore
import trio

from trio_swe.sandbox.e2b._envd import EnvdClient
from trio_swe.sandbox.e2b._httpxpool import ConnectionPool
from trio_swe.sandbox.e2b._retry import RetryStats
from trio_swe.testing import open_envd_server

from .helpers import TEST_POLICY


class _CancelAfterPreface(httpcore.AsyncNetworkBackend):
    """Network fault: the first write on a connection (the preface) cancels ``scope``."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend, scope: trio.CancelScope) -> None:
        self._inner = inner
        self._scope: trio.CancelScope | None = scope

    async def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(*args, **kwargs)
        backend = self

        class Stream(httpcore.AsyncNetworkStream):
            async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
                return await stream.read(max_bytes, timeout)

            async def write(self, buffer: bytes, timeout: float | None = None) -> None:
                await stream.write(buffer, timeout)
                if backend._scope is not None:
                    backend._scope.cancel()  # lands in httpcore's semaphore set-up loop
                    backend._scope = None

            async def aclose(self) -> None:
                await stream.aclose()

            def get_extra_info(self, info: str) -> Any:
                return stream.get_extra_info(info)

        return Stream()

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


async def test_a_connection_left_broken_by_a_cancel_is_replaced() -> None:
    with trio.fail_after(60):  # a hang guard only
        async with open_envd_server() as server:
            pool = ConnectionPool(server.api_url, h2c=True)
            stats = RetryStats()
            client = EnvdClient(pool, {}, policy=TEST_POLICY, stats=stats, rng=random.Random(1))
            with trio.CancelScope() as scope:
                async with pool.slot() as lane:
                    transport: Any = lane._transport
                    inner = transport._pool._network_backend
                    transport._pool._network_backend = _CancelAfterPreface(inner, scope)
                    await lane.get("/health")
            assert scope.cancelled_caught
            # The same (least loaded) connection is picked: it fails, is replaced, and the
            # idempotent call is retried on a fresh one.
            resp = await client.request(
                "GET", "/sandboxes", headers={"x-api-key": "test-key"}, idempotent=True
            )
            assert resp.status_code == 200
            assert stats.by_kind == {"pool_state": 1}
            assert pool.resets == 1
            await pool.aclose()
