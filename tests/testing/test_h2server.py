"""The envd test server's lean HTTP/2 server (``open_envd_server(lean_http2=True)``).

The E2B backend against it (envd over its HTTP/2 client, the REST API over httpx's), with real
local sandboxes behind it: bodies bigger than the flow-control windows both ways, many concurrent
streams, a stream the client abandons, and HTTP/1.1 still served (by hypercorn).
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from trio_swe import InvalidArgumentError, exec_and_wait, open_sandbox
from trio_swe.sandbox.e2b import E2BBackend
from trio_swe.testing import EnvdServer, SyntheticBackend, open_envd_server

from ..e2b.helpers import TEST_POLICY


@asynccontextmanager
async def _lean(**server_kw: Any) -> AsyncIterator[tuple[EnvdServer, E2BBackend]]:
    async with open_envd_server(tls=True, lean_http2=True, **server_kw) as server:
        backend = E2BBackend(
            api_key=server.api_key,
            api_url=server.api_url,
            sandbox_url=server.sandbox_url,
            verify=server.ca_path,
            keepalive_interval=1.0,
            retry_policy=TEST_POLICY,
            seed=1,
        )
        async with backend:
            yield server, backend


async def test_big_bodies_and_output_through_flow_control() -> None:
    with trio.fail_after(120):  # a hang guard only
        async with _lean() as (server, backend), open_sandbox(backend, "base") as sb:
            big = os.urandom(300_000)  # several 65,535-byte windows each way
            await sb.write_file("/tmp/big.bin", big)
            assert await sb.read_file("/tmp/big.bin") == big
            res = await sb.exec("base64 -w0 /tmp/big.bin; exit 3")  # 400 KB of output events
            assert (res.exit_code, res.output) == (3, base64.b64encode(big).decode())
            stats = server.statistics()
            assert stats.lean_connections >= 1
            assert stats.connection_errors == 0


async def test_many_streams_and_an_abandoned_one() -> None:
    with trio.fail_after(120):
        async with _lean() as (_, backend), open_sandbox(backend, "base") as sb:
            codes: list[int] = []

            async def one(i: int) -> None:
                codes.append((await sb.exec(f"sleep 0.2; exit {i % 7}")).exit_code)

            async with trio.open_nursery() as nursery:
                for i in range(60):
                    nursery.start_soon(one, i)
            assert sorted(codes) == sorted(i % 7 for i in range(60))

            # A stream the client gives up on (cancelled: RST_STREAM or a closed response)
            # leaves the server serving the rest.
            with trio.move_on_after(0.5):
                await sb.exec("sleep 30")
            res = await sb.exec("echo still here")
            assert (res.exit_code, res.output) == (0, "still here\n")


async def test_detached_calls_on_synthetic_sandboxes() -> None:
    with trio.fail_after(120):
        async with (
            _lean(backend=SyntheticBackend()) as (_, backend),
            open_sandbox(backend, "base", workdir="/tmp") as sb,
        ):
            results = []

            async def one(code: int) -> None:
                results.append(
                    (
                        await exec_and_wait(sb, f"sleep 0.3; exit {code}", time_budget_sec=60)
                    ).exit_code
                )

            async with trio.open_nursery() as nursery:
                for code in range(20):
                    nursery.start_soon(one, code)
            assert sorted(results) == list(range(20))


async def test_http1_still_goes_to_hypercorn() -> None:
    with trio.fail_after(60):
        async with open_envd_server(tls=True, lean_http2=True) as server:
            async with httpx.AsyncClient(verify=server.client_ssl_context(), http2=False) as h1:
                resp = await h1.get(f"{server.sandbox_url}/health")
            assert resp.http_version == "HTTP/1.1"  # answered (502: no sandbox id given)
            stats = server.statistics()
            assert (stats.connections, stats.lean_connections) == (1, 0)


async def test_lean_needs_tls_and_no_proxy() -> None:
    with pytest.raises(InvalidArgumentError):
        async with open_envd_server(lean_http2=True):
            pass
