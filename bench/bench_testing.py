"""Cost of the local envd server (``trio_swe.testing``): server CPU and wall time per RPC.

The server runs in its own process so its CPU is measured apart from the client's. Each figure
is given for the server serving directly (hypercorn; what benchmarks should use) and behind the
HTTP/2 fault proxy (what fault tests use), over h2c, as a ratio against the direct server.

* ``List``: a unary RPC that starts no process (pure HTTP/2 + app overhead).
* ``Start true``: a server-streaming RPC that runs a real process in the sandbox.
* ``create+kill``: one sandbox through the REST API (local bubblewrap boot and teardown).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import httpx
import trio

from trio_swe.sandbox.e2b import _connect as connect
from trio_swe.sandbox.e2b import _wire as wire

ROUNDS = 3
LIST_CALLS = 600
START_CALLS = 60
SANDBOXES = 8
CONCURRENCY = 30

_SERVER = """
import sys, trio
from trio_swe.testing import open_envd_server
async def main():
    async with open_envd_server(fault_proxy=sys.argv[1] == "proxy") as s:
        print(s.api_url, flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
trio.run(main)
"""


def cpu_sec(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def fan_out(n: int, call: Callable[[], Awaitable[None]]) -> None:
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async def one() -> None:
        async with limiter:
            await call()

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)


async def measure(mode: str) -> dict[str, list[tuple[float, float]]]:
    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before any measurement
        [sys.executable, "-c", _SERVER, mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    url = proc.stdout.readline().strip()
    out: dict[str, list[tuple[float, float]]] = {"Start true": [], "List": [], "create+kill": []}
    key = {"x-api-key": "test-key"}
    try:
        async with httpx.AsyncClient(http1=False, http2=True, timeout=120) as client:
            list_body = wire.encode(wire.ListRequest())
            start = connect.encode_envelope(
                wire.encode(
                    wire.StartRequest(process=wire.ProcessConfig(cmd="/bin/true"), stdin=False)
                )
            )

            async def list_call() -> None:
                resp = await client.post(
                    f"{url}/process.Process/List",
                    content=list_body,
                    headers={**hdrs, "content-type": "application/json"},
                )
                assert resp.status_code == 200

            async def start_call() -> None:
                resp = await client.post(
                    f"{url}/process.Process/Start",
                    content=start,
                    headers={**hdrs, "content-type": "application/connect+json"},
                )
                assert resp.status_code == 200
                assert b"exit status 0" in resp.content, resp.content

            async def sandbox_call() -> None:
                resp = await client.post(
                    f"{url}/v2/sandboxes", json={"templateID": "b"}, headers=key
                )
                sid = resp.json()["sandboxID"]
                await client.delete(f"{url}/sandboxes/{sid}", headers=key)

            hdrs: dict[str, str] = {}
            for _ in range(ROUNDS):
                # A fresh sandbox per round (the local backend's sandboxes are not the subject).
                r = await client.post(f"{url}/v2/sandboxes", json={"templateID": "b"}, headers=key)
                info = r.json()
                hdrs.update(
                    {
                        "e2b-sandbox-id": info["sandboxID"],
                        "x-access-token": info["envdAccessToken"],
                        "connect-protocol-version": "1",
                    }
                )
                for name, n, call in (
                    ("Start true", START_CALLS, start_call),
                    ("List", LIST_CALLS, list_call),
                    ("create+kill", SANDBOXES, sandbox_call),
                ):
                    c0, t0 = cpu_sec(proc.pid), time.perf_counter()
                    await fan_out(n, call)
                    wall = time.perf_counter() - t0
                    out[name].append(((cpu_sec(proc.pid) - c0) / n, wall / n))
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return out


def main() -> None:
    results = {mode: trio.run(measure, mode) for mode in ("direct", "proxy")}
    print(
        f"server in its own process, h2c client, concurrency {CONCURRENCY}, "
        f"median of {ROUNDS} rounds; per call"
    )
    print(
        f"{'call':<12} {'direct CPU ms':>14} {'proxy CPU ms':>13} {'ratio':>6}"
        f" {'direct wall ms':>15} {'proxy wall ms':>14}"
    )
    for name in results["direct"]:
        d_cpu = statistics.median(c for c, _ in results["direct"][name]) * 1000
        p_cpu = statistics.median(c for c, _ in results["proxy"][name]) * 1000
        d_wall = statistics.median(w for _, w in results["direct"][name]) * 1000
        p_wall = statistics.median(w for _, w in results["proxy"][name]) * 1000
        print(
            f"{name:<12} {d_cpu:>14.2f} {p_cpu:>13.2f} {p_cpu / d_cpu:>6.2f}"
            f" {d_wall:>15.2f} {p_wall:>14.2f}"
        )
