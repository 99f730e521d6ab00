"""The E2B backend with envd over its HTTP/2 client (:mod:`trio_swe.sandbox.e2b._h2conn`).

The rest of ``tests/e2b`` runs over it too (envd on h2c or TLS goes nowhere else). Here: the paths it must get right on its own (a big upload within
flow-control windows, streams spread over capped connections, a connection fault on a Start).
"""

from __future__ import annotations

import base64
import os

import pytest
import trio

from trio_swe import SandboxUnreachableError, open_sandbox
from trio_swe.testing import Fault, FaultPlan, open_envd_server

from .helpers import e2b_backend_for


async def test_files_and_exec_over_the_h2_client() -> None:
    async with (
        open_envd_server() as server,
        e2b_backend_for(server) as backend,
        open_sandbox(backend, "base") as sb,
    ):
        big = os.urandom(300_000)  # several 65,535-byte stream windows each way
        await sb.write_file("/tmp/big.bin", big)
        assert await sb.read_file("/tmp/big.bin") == big
        res = await sb.exec("base64 -w0 /tmp/big.bin; exit 3")  # 400 KB of output events
        assert (res.exit_code, res.output) == (3, base64.b64encode(big).decode())
        (pool,) = (p for p in backend.statistics().pools if p.client == "h2")
        assert pool.connections_opened == 1
        assert pool.active_streams == 0


async def test_streams_spread_over_capped_h2_connections() -> None:
    async with (
        open_envd_server() as server,
        e2b_backend_for(server, streams_per_connection=8, max_connections=4) as backend,
        open_sandbox(backend, "base") as sb,
    ):
        results: list[int] = []

        async def one(i: int) -> None:
            results.append((await sb.exec(f"sleep 0.5; exit {i % 7}")).exit_code)

        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(one, i)
        assert sorted(results) == sorted(i % 7 for i in range(40))
        (pool,) = (p for p in backend.statistics().pools if p.client == "h2")
        assert pool.peak_streams == 32  # 4 connections x 8 streams, the rest waited
        assert pool.connections_opened == 4
        assert pool.slot_waits > 0


@pytest.mark.parametrize(
    "fault",
    [
        Fault(kind="rst", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="goaway", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="goaway", route="/process.Process/Start", before_request=True, times=1),
        Fault(kind="tcp_close", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="hang", route="/process.Process/Start", after_sec=0.5, times=1),
    ],
    ids=lambda f: f"{f.kind}-{'before' if f.before_request else f.after_sec}",
)
async def test_one_fault_on_start_runs_the_command_once_over_h2(fault: Fault) -> None:
    async with (
        open_envd_server(faults=FaultPlan([fault], seed=0)) as server,
        e2b_backend_for(server) as backend,
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec("echo x >> /tmp/log; echo out; sleep 1.5; exit 5")
        assert (res.exit_code, res.reason) == (5, "exit")
        assert (await sb.read_file("/tmp/log")) == b"x\n"
        assert server.statistics().faults_injected == {fault.kind: 1}


async def test_envd_on_tls_without_h2_is_a_clear_error() -> None:
    # envd on https:// is spoken to in HTTP/2 only (no httpx fallback any more): an origin
    # whose ALPN refuses h2 fails at once with a reason that names it, not after retries.
    async with (
        open_envd_server(tls=True, http2=False) as server,
        e2b_backend_for(server, h2c=False, verify=server.ca_path) as backend,
        open_sandbox(backend, "base") as sb,
    ):
        with pytest.raises(SandboxUnreachableError, match="envd on https:// must speak HTTP/2"):
            await sb.exec("true")
        assert backend.statistics().retries == 0
