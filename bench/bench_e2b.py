"""E2B backend benchmark: client CPU per command vs the official SDK, and many sandboxes.

The server (``trio_swe.testing.open_envd_server``, TLS + HTTP/2, real local sandboxes) runs in a
subprocess, so the CPU and RSS measured here are the client's alone.

(a) Client CPU seconds per short ``exec`` and per long command, ours (``E2BBackend`` on trio)
    vs the official ``e2b`` SDK's sync ``Sandbox`` in threads, both through the REST API
    (``api_url``/``sandbox_url``) of the same server in the same run; medians of 3 runs; ratio
    ours/SDK. (Debug mode is not used: the server's lazily created debug sandbox does not
    survive many concurrent first requests.)
(b) N sandboxes at once, each running one detached command through ``exec_and_wait``: wall
    time, client peak RSS, client CPU, RPCs per command, errors. Default N=100 x 10 s (fits
    ~3 min on 2 cores); ``TRIO_SWE_BENCH_FULL=1`` runs the issue's 1,000 x 30 s.

Run: ``python -m bench e2b``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
SHORT_N = 200  # short execs per run
LONG_N = 20  # long commands per run
LONG_CMD_SEC = 1.0
CONCURRENCY = 20
RUNS = 3
#: Commands that failed (the server's local sandboxes occasionally die on a loaded machine).
ERRORS = {"ours": 0, "sdk": 0}


# --- the server, in a subprocess -----------------------------------------------------------


def _serve_main() -> None:
    """Subprocess entry: serve until stdin closes; print the connection facts as one JSON line."""
    from trio_swe.testing import open_envd_server

    async def main() -> None:
        async with open_envd_server(tls=True, api_key="bench-key", sandbox_ttl_sec=3600) as server:
            print(
                json.dumps(
                    {
                        "api_url": server.api_url,
                        "sandbox_url": server.sandbox_url,
                        "ca_path": server.ca_path,
                        "api_key": server.api_key,
                    }
                ),
                flush=True,
            )
            await trio.to_thread.run_sync(sys.stdin.read)

    trio.run(main)


class Server:
    def __enter__(self) -> dict[str, str]:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import bench.bench_e2b as b; b._serve_main()"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        info: dict[str, str] = json.loads(self.proc.stdout.readline())
        return info

    def __exit__(self, *exc: object) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _cpu() -> float:
    return time.process_time()


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# --- (a) ours vs the SDK ------------------------------------------------------------------------


def ours_cpu(info: dict[str, str]) -> tuple[float, float, float]:
    """CPU seconds per short exec, per exec_and_wait and per one-stream long exec, ours."""
    from trio_swe import exec_and_wait, open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend

    async def main() -> tuple[float, float, float]:
        async with (
            E2BBackend(
                api_key=info["api_key"],
                api_url=info["api_url"],
                sandbox_url=info["sandbox_url"],
                verify=info["ca_path"],
            ) as backend,
            open_sandbox(backend, "base", workdir="/tmp") as sb,
        ):
            await sb.exec("true")  # warm the connection

            async def shorts(k: int) -> None:
                for _ in range(SHORT_N // CONCURRENCY):
                    try:
                        ERRORS["ours"] += (await sb.exec("true")).exit_code != 0
                    except Exception:
                        ERRORS["ours"] += 1

            c0 = _cpu()
            async with trio.open_nursery() as n:
                for k in range(CONCURRENCY):
                    n.start_soon(shorts, k)
            short = (_cpu() - c0) / SHORT_N

            async def detached(k: int) -> None:
                try:
                    r = await exec_and_wait(sb, f"sleep {LONG_CMD_SEC}", time_budget_sec=60)
                    ERRORS["ours"] += r.exit_code != 0
                except Exception:
                    ERRORS["ours"] += 1

            c0 = _cpu()
            async with trio.open_nursery() as n:
                for k in range(LONG_N):
                    n.start_soon(detached, k)
            long_detached = (_cpu() - c0) / LONG_N

            async def streamed(k: int) -> None:
                try:
                    r = await sb.exec(f"sleep {LONG_CMD_SEC}", timeout=60)
                    ERRORS["ours"] += r.exit_code != 0
                except Exception:
                    ERRORS["ours"] += 1

            c0 = _cpu()
            async with trio.open_nursery() as n:
                for k in range(LONG_N):
                    n.start_soon(streamed, k)
            return short, long_detached, (_cpu() - c0) / LONG_N

    return trio.run(main)


def sdk_cpu(info: dict[str, str]) -> tuple[float, float]:
    """The same with the official SDK's sync Sandbox in threads (TLS h2)."""
    os.environ["SSL_CERT_FILE"] = info["ca_path"]
    from e2b import Sandbox

    sb = Sandbox.create(
        "base", api_key=info["api_key"], api_url=info["api_url"], sandbox_url=info["sandbox_url"]
    )
    sb.commands.run("true", cwd="/tmp")
    with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:

        def shorts(k: int) -> None:
            for _ in range(SHORT_N // CONCURRENCY):
                try:
                    sb.commands.run("true", cwd="/tmp")
                except Exception:
                    ERRORS["sdk"] += 1

        c0 = _cpu()
        list(pool.map(shorts, range(CONCURRENCY)))
        short = (_cpu() - c0) / SHORT_N

        def long(k: int) -> None:
            # The SDK's way to wait for a long command: one stream, no deadline.
            try:
                sb.commands.run(f"sleep {LONG_CMD_SEC}", cwd="/tmp", timeout=0)
            except Exception:
                ERRORS["sdk"] += 1

        c0 = _cpu()
        list(pool.map(long, range(LONG_N)))
        result = short, (_cpu() - c0) / LONG_N
    sb.kill()
    return result


def bench_cpu(info: dict[str, str]) -> None:
    ours: list[tuple[float, float, float]] = []
    sdk: list[tuple[float, float]] = []
    for _ in range(RUNS):
        ours.append(ours_cpu(info))
        sdk.append(sdk_cpu(info))
    o_short = statistics.median(x[0] for x in ours)
    o_long = statistics.median(x[1] for x in ours)
    o_stream = statistics.median(x[2] for x in ours)
    s_short = statistics.median(x[0] for x in sdk)
    s_long = statistics.median(x[1] for x in sdk)
    print(f"(a) client CPU per command, median of {RUNS} runs, {CONCURRENCY} concurrent, TLS h2")
    print(f"    {'':34} {'trio_swe':>10} {'e2b SDK':>10} {'ratio':>7}")
    print(
        f"    {'short exec (true), ms CPU':34} {o_short * 1e3:10.2f} {s_short * 1e3:10.2f} "
        f"{o_short / s_short:7.2f}"
    )
    print(
        f"    {f'long command ({LONG_CMD_SEC:.0f} s), exec_and_wait':34} {o_long * 1e3:10.2f} "
        f"{s_long * 1e3:10.2f} {o_long / s_long:7.2f}"
    )
    print(
        f"    {f'long command ({LONG_CMD_SEC:.0f} s), one stream':34} {o_stream * 1e3:10.2f} "
        f"{s_long * 1e3:10.2f} {o_stream / s_long:7.2f}"
    )
    print(
        "    (ours: exec_and_wait = write + spawn + long-poll + cleanup RPCs, or one "
        "exec stream; SDK: commands.run(timeout=0), one stream)"
    )
    print(f"    failed commands: ours {ERRORS['ours']}, SDK {ERRORS['sdk']}")


# --- (b) many sandboxes -----------------------------------------------------------------------


def bench_many(info: dict[str, str]) -> None:
    from trio_swe import exec_and_wait, open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend

    full = os.environ.get("TRIO_SWE_BENCH_FULL") == "1"
    n, sec = (1000, 30.0) if full else (100, 10.0)

    async def main() -> dict[str, Any]:
        errors: list[str] = []
        rpcs: list[int] = []
        async with E2BBackend(
            api_key=info["api_key"],
            api_url=info["api_url"],
            sandbox_url=info["sandbox_url"],
            verify=info["ca_path"],
        ) as backend:

            async def one(i: int) -> None:
                try:
                    async with open_sandbox(backend, "base", workdir="/tmp") as sb:
                        r = await exec_and_wait(sb, f"sleep {sec}", time_budget_sec=sec + 120)
                        if r.exit_code != 0:
                            errors.append(f"{i}: {r}")
                        rpcs.append(int(sb.statistics()["rpcs"]))
                except Exception as exc:
                    errors.append(f"{i}: {exc!r}")

            rss0, c0, t0 = _rss_mb(), _cpu(), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(one, i)
            wall = time.perf_counter() - t0
            stats = backend.statistics()
            return {
                "wall": wall,
                "cpu": _cpu() - c0,
                "rss": _rss_mb(),
                "rss0": rss0,
                "errors": errors,
                "rpcs": rpcs,
                "stats": stats,
            }

    out = trio.run(main)
    rest_calls = 2  # create + kill per sandbox
    per_cmd = statistics.mean(out["rpcs"]) + rest_calls if out["rpcs"] else float("nan")
    pools = out["stats"]["pools"]
    print(f"(b) {n} sandboxes x one detached `sleep {sec:.0f}` (exec_and_wait), TLS h2, one origin")
    print(f"    wall time          {out['wall']:8.1f} s   (ideal {sec:.0f} s)")
    print(
        f"    client CPU         {out['cpu']:8.2f} s   ({out['cpu'] / n * 1e3:.1f} ms per sandbox)"
    )
    print(f"    client peak RSS    {out['rss']:8.1f} MB  (before: {out['rss0']:.1f} MB)")
    print(f"    RPCs per command   {per_cmd:8.1f}     (envd mean + REST create/kill)")
    print(f"    errors             {len(out['errors']):8d}     {out['errors'][:3]}")
    print(
        f"    retries {out['stats']['retries']}, resets {out['stats']['resets']}, connections "
        + ", ".join(f"{p['connections_opened']} (peak {p['peak_streams']} streams)" for p in pools)
    )


def main() -> None:
    with Server() as info:
        bench_cpu(info)
    with Server() as info:
        bench_many(info)


if __name__ == "__main__":
    main()
