"""E2B backend benchmark: client CPU per command vs the official SDK, and many sandboxes.

The server (``trio_swe.testing.open_envd_server``, TLS + HTTP/2, real local sandboxes) runs in a
subprocess, so the CPU and RSS measured here are the client's alone.

(a) Client CPU per call, each client in its own interpreter against the same server, medians of
    ``TRIO_SWE_BENCH_RUNS`` (3) interleaved runs, as ratios: short ``exec("true")`` sequential
    and 64 concurrent, ours (``E2BBackend`` on trio) vs the official SDK's ``AsyncSandbox`` on
    asyncio; a detached 1 s command (16 concurrent), ours (``exec_and_wait``) vs slime's own
    ``exec_and_wait`` over its ``E2BSandbox``, loaded at run time from the slime checkout named
    by ``TRIO_SWE_SLIME_DIR`` (skipped with the reason when unset). Both clients are configured
    from ``E2B_*`` and ``SSL_CERT_FILE``. ``TRIO_SWE_BENCH_PROFILE=1`` prints a cProfile of each
    child by library (``=2``: plus the top functions).
(c) The cost of a plain exec's end record (issue 27 item 6): ``exec("true")`` sequential, with
    its record (``idempotent=False``, the default: the wrapper script) vs bare (``idempotent=True``:
    ``/bin/sh -c`` as every exec ran before the record), blocks interleaved in one client, medians
    of per-call latency and of client CPU per call over ``TRIO_SWE_BENCH_RUNS`` clients.
(b) N sandboxes at once, each running one detached command through ``exec_and_wait``: wall
    time, client peak RSS, client CPU, RPCs per command, errors. Default N=100 x 10 s (fits
    ~3 min on 2 cores); ``TRIO_SWE_BENCH_FULL=1`` runs the issue's 1,000 x 30 s.

Run: ``python -m bench e2b`` (``TRIO_SWE_BENCH_E2B_CPU_ONLY=1``: only (a) and (c);
``TRIO_SWE_BENCH_E2B_RECORD_ONLY=1``: only (c)).
"""

from __future__ import annotations

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
RUNS = 3


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


# --- (a) client CPU per call: ours vs the SDK's AsyncSandbox and slime's exec_and_wait ----------
#
# Each measurement runs in a fresh interpreter (``python -c "...; b._child(...)"``), so one
# client's threads, pools and garbage never land in another's figure; the child prints the CPU
# seconds per call (``time.process_time``: every thread of the process, so the SDK's Rust
# runtime counts too).

SEQ_N = 150  # sequential short execs per run
CONC = 64  # concurrent short-exec callers
CONC_N = 320  # short execs per run at CONC concurrent
DETACHED_N = 16  # concurrent detached calls per run
DETACHED_SEC = 1.0


def _child_env(info: dict[str, str]) -> dict[str, str]:
    return {
        **os.environ,
        "E2B_API_KEY": info["api_key"],
        "E2B_API_URL": info["api_url"],
        "E2B_SANDBOX_URL": info["sandbox_url"],
        "E2B_DOMAIN": "localhost",
        "SSL_CERT_FILE": info["ca_path"],
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _run_child(info: dict[str, str], who: str, what: str, *, tries: int = 2) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", f"import bench.bench_e2b as b; b._child({who!r}, {what!r})"],
        cwd=ROOT,
        env=_child_env(info),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        # A client that dies under a loaded machine is reported and measured again, once.
        print(f"    ({who}/{what} exited {proc.returncode}: {proc.stderr[-500:]!r})", flush=True)
        if tries > 1:
            return _run_child(info, who, what, tries=tries - 1)
        raise RuntimeError(f"{who}/{what} failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if proc.stderr.strip() and (os.environ.get("TRIO_SWE_BENCH_PROFILE") or out["errors"]):
        print(proc.stderr[-3000:], end="")
    return out


def _profiled() -> Any:
    """A cProfile.Profile when ``TRIO_SWE_BENCH_PROFILE=1`` (the profile goes to stderr)."""
    if not os.environ.get("TRIO_SWE_BENCH_PROFILE"):
        return None
    import cProfile

    return cProfile.Profile(time.thread_time)  # CPU of this thread, not time spent waiting


_FAMILIES = [
    ("trio_swe._h2", "trio_swe/sandbox/e2b/_h2"),
    ("trio_swe (ours, rest)", "trio_swe/"),
    ("httpx", "/httpx/"),
    ("httpcore", "/httpcore/"),
    ("h2 (state machine)", "/h2/"),
    ("hpack", "/hpack/"),
    ("hyperframe", "/hyperframe/"),
    ("trio", "/trio/"),
    ("ssl", "ssl.py"),
    ("msgspec", "msgspec"),
    ("e2b SDK", "/e2b/"),
    ("connectrpc", "/connectrpc/"),
    ("pyqwest", "/pyqwest/"),
    ("asyncio", "/asyncio/"),
]


def _profile_report(prof: Any, calls: int) -> None:
    """Own time (tottime) per library family, in ms per call, to stderr."""
    import pstats

    stats = pstats.Stats(prof, stream=sys.stderr)
    if dump := os.environ.get("TRIO_SWE_BENCH_PROFILE_DUMP"):  # for pstats/snakeviz: a prefix
        stats.dump_stats(f"{dump}-{os.getpid()}.pstats")
    fams: dict[str, float] = {}
    total = 0.0
    for (path, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        total += tt
        fam = "other (builtins, stdlib)"
        if path == "~":  # a builtin: charge it to itself ("<method 'send' of '_ssl..'>")
            fam = "ssl" if "_ssl" in name or "SSL" in name else fam
        for label, needle in _FAMILIES:
            if needle in path:
                fam = label
                break
        fams[fam] = fams.get(fam, 0.0) + tt
    print(
        f"    profile (own time per library, ms per call; total {total / calls * 1e3:.2f})",
        file=sys.stderr,
    )
    for fam, tt in sorted(fams.items(), key=lambda kv: -kv[1]):
        print(f"      {fam:28} {tt / calls * 1e3:7.3f}  {tt / total:6.1%}", file=sys.stderr)
    if os.environ.get("TRIO_SWE_BENCH_PROFILE") == "2":
        stats.sort_stats("tottime").print_stats(70)


def _child(who: str, what: str) -> None:
    fn = {
        "ours": _ours,
        "sdk": _sdk,
        "slime": _slime,
        "record": _record_cost,
    }[who]
    print(json.dumps(fn(what)), flush=True)


def _ours(what: str) -> dict[str, Any]:
    from trio_swe import exec_and_wait, open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend

    async def main() -> dict[str, Any]:
        errors = 0
        async with (
            E2BBackend() as backend,  # configured from E2B_* and SSL_CERT_FILE, like the SDK
            open_sandbox(backend, "base", workdir="/tmp") as sb,
        ):
            for _ in range(3):
                await sb.exec("true")  # warm the connection

            async def short(n: int) -> None:
                nonlocal errors
                for _ in range(n):
                    try:
                        r = await sb.exec("true")
                        if r.exit_code != 0:
                            errors += 1
                            print(f"error: {r!r}", file=sys.stderr)
                    except Exception as exc:
                        errors += 1
                        print(f"error: {exc!r}", file=sys.stderr)

            async def detached() -> None:
                nonlocal errors
                try:
                    r = await exec_and_wait(sb, f"sleep {DETACHED_SEC}", time_budget_sec=120)
                    errors += r.exit_code != 0
                except Exception:
                    errors += 1

            prof = _profiled()
            c0 = _cpu()
            if prof is not None:
                prof.enable()
            if what == "seq":
                calls = SEQ_N
                await short(SEQ_N)
            elif what == "conc":
                calls = CONC_N
                async with trio.open_nursery() as n:
                    for _ in range(CONC):
                        n.start_soon(short, CONC_N // CONC)
            else:
                calls = DETACHED_N
                async with trio.open_nursery() as n:
                    for _ in range(DETACHED_N):
                        n.start_soon(detached)
            if prof is not None:
                prof.disable()
            cpu = (_cpu() - c0) / calls
        if prof is not None:
            _profile_report(prof, calls)
        return {"cpu": cpu, "errors": errors}

    return trio.run(main)


RECORD_BLOCK = 40  # calls per block
RECORD_BLOCKS = 5  # blocks per kind, interleaved


def _record_cost(what: str) -> dict[str, Any]:
    """Per-call latency and client CPU of ``exec("true")``: recorded vs bare, interleaved."""
    from trio_swe import open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend

    async def main() -> dict[str, Any]:
        errors = 0
        lat: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}
        async with E2BBackend() as backend, open_sandbox(backend, "base", workdir="/tmp") as sb:
            for _ in range(5):  # warm the connection and the record directory
                await sb.exec("true")
                await sb.exec("true", idempotent=True)
            for _ in range(RECORD_BLOCKS):
                for bare in (True, False):
                    c0 = _cpu()
                    for _ in range(RECORD_BLOCK):
                        t0 = time.perf_counter()
                        r = await sb.exec("true", idempotent=bare)
                        lat[bare].append(time.perf_counter() - t0)
                        errors += r.exit_code != 0
                    cpu[bare].append((_cpu() - c0) / RECORD_BLOCK)
        return {
            "lat_bare": statistics.median(lat[True]),
            "lat_rec": statistics.median(lat[False]),
            "cpu_bare": statistics.median(cpu[True]),
            "cpu_rec": statistics.median(cpu[False]),
            "errors": errors,
        }

    return trio.run(main)


def bench_record(info: dict[str, str]) -> None:
    runs = int(os.environ.get("TRIO_SWE_BENCH_RUNS", RUNS))
    got = [_run_child(info, "record", "seq") for _ in range(runs)]

    def med(key: str) -> float:
        return float(statistics.median(g[key] for g in got))

    print(
        f'(c) plain exec("true"), sequential, {RECORD_BLOCKS}x{RECORD_BLOCK} calls per kind '
        f"interleaved; medians over {runs} clients (TLS h2, one local server)"
    )
    print(f"    {'':28} {'bare':>9} {'recorded':>9} {'ratio':>6}")
    for label, key in (("latency per call, ms", "lat"), ("client CPU per call, ms", "cpu")):
        bare, rec = med(f"{key}_bare"), med(f"{key}_rec")
        print(f"    {label:28} {bare * 1e3:9.3f} {rec * 1e3:9.3f} {rec / bare:6.2f}")
    print(f"    failed calls: {sum(g['errors'] for g in got)}")


def _sdk(what: str) -> dict[str, Any]:
    """The official SDK's AsyncSandbox under asyncio, the way its users drive it."""
    import asyncio

    from e2b import AsyncSandbox

    async def main() -> dict[str, Any]:
        errors = 0
        sb = await AsyncSandbox.create("base", timeout=600)
        try:
            for _ in range(3):
                await sb.commands.run("true", cwd="/tmp")

            async def short(n: int) -> None:
                nonlocal errors
                for _ in range(n):
                    try:
                        errors += (await sb.commands.run("true", cwd="/tmp")).exit_code != 0
                    except Exception:
                        errors += 1

            prof = _profiled()
            c0 = _cpu()
            if prof is not None:
                prof.enable()
            if what == "seq":
                calls = SEQ_N
                await short(SEQ_N)
            else:
                calls = CONC_N
                await asyncio.gather(*(short(CONC_N // CONC) for _ in range(CONC)))
            if prof is not None:
                prof.disable()
            cpu = (_cpu() - c0) / calls
        finally:
            await sb.kill()
        if prof is not None:
            _profile_report(prof, calls)
        return {"cpu": cpu, "errors": errors}

    return asyncio.run(main())


def _load_slime_sandbox() -> Any:
    """slime's own ``slime/agent/sandbox.py``, loaded from ``$TRIO_SWE_SLIME_DIR`` (not copied)."""
    import importlib.util

    root = os.environ.get("TRIO_SWE_SLIME_DIR")
    if not root:
        return None
    path = Path(root) / "slime" / "agent" / "sandbox.py"
    spec = importlib.util.spec_from_file_location("_slime_agent_sandbox", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _slime(what: str) -> dict[str, Any]:
    """slime's ``exec_and_wait`` over its ``E2BSandbox`` (the SDK's AsyncSandbox) on asyncio."""
    import asyncio
    import uuid

    slime = _load_slime_sandbox()
    os.environ.setdefault("SLIME_AGENT_SANDBOX_IMAGE_METADATA_KEY", "bench/image")

    async def main() -> dict[str, Any]:
        errors = 0
        async with slime.E2BSandbox("base", timeout=600) as sb:
            await sb.exec("true")

            async def detached() -> None:
                nonlocal errors
                try:
                    code, _ = await slime.exec_and_wait(
                        sb,
                        cmd=f"sleep {DETACHED_SEC}",
                        time_budget_sec=120,
                        tag=f"bench-{uuid.uuid4().hex}",
                    )
                    errors += code != 0
                except Exception:
                    errors += 1

            prof = _profiled()
            c0 = _cpu()
            if prof is not None:
                prof.enable()
            await asyncio.gather(*(detached() for _ in range(DETACHED_N)))
            if prof is not None:
                prof.disable()
            cpu = (_cpu() - c0) / DETACHED_N
        if prof is not None:
            _profile_report(prof, DETACHED_N)
        return {"cpu": cpu, "errors": errors}

    return asyncio.run(main())


def bench_cpu(info: dict[str, str]) -> None:
    runs = int(os.environ.get("TRIO_SWE_BENCH_RUNS", RUNS))
    slime_dir = os.environ.get("TRIO_SWE_SLIME_DIR")
    rows: list[tuple[str, str, str, str]] = [
        (f"short exec, sequential (x{SEQ_N})", "ours", "sdk", "seq"),
        (f"short exec, {CONC} concurrent (x{CONC_N})", "ours", "sdk", "conc"),
    ]
    print(
        f"(a) client CPU per call, ms, median of {runs} runs (each client in its own process), "
        "TLS + HTTP/2, one local server"
    )
    print(f"    {'':40} {'trio_swe':>9} {'peer':>9} {'ratio':>6}  peer")
    errors = {"ours": 0, "peer": 0}

    def row(label: str, peer: str, what: str, peer_name: str) -> None:
        ours, theirs = [], []
        for _ in range(runs):  # interleaved, so drifting machine load hits both alike
            o = _run_child(info, "ours", what)
            t = _run_child(info, peer, what)
            ours.append(o["cpu"])
            theirs.append(t["cpu"])
            errors["ours"] += o["errors"]
            errors["peer"] += t["errors"]
        mo, mt = statistics.median(ours), statistics.median(theirs)
        print(
            f"    {label:40} {mo * 1e3:9.3f} {mt * 1e3:9.3f} {mo / mt:6.2f}  {peer_name}",
            flush=True,
        )

    for label, _, peer, what in rows:
        row(label, peer, what, "e2b SDK AsyncSandbox (asyncio)")
    detached_label = f"detached `sleep {DETACHED_SEC:g}`, {DETACHED_N} concurrent"
    if slime_dir:
        row(detached_label, "slime", "detached", "slime exec_and_wait (AsyncSandbox)")
    else:
        print(f"    {detached_label:40} skipped: set TRIO_SWE_SLIME_DIR to a slime checkout")
    print(f"    failed calls: trio_swe {errors['ours']}, peers {errors['peer']}")
    print("    trio_swe: envd over the purpose-built HTTP/2 client (_h2conn)")
    print("    goal (issue 13.1): trio_swe's ratio <= 0.50 on every row")


# --- (b) many sandboxes -----------------------------------------------------------------------


def bench_many(info: dict[str, str]) -> None:
    from trio_swe import exec_and_wait, open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend, E2BSandboxStatistics

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
                        st = sb.statistics()
                        assert isinstance(st, E2BSandboxStatistics)
                        rpcs.append(st.rpcs)
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
    pools = out["stats"].pools
    print(f"(b) {n} sandboxes x one detached `sleep {sec:.0f}` (exec_and_wait), TLS h2, one origin")
    print(f"    wall time          {out['wall']:8.1f} s   (ideal {sec:.0f} s)")
    print(
        f"    client CPU         {out['cpu']:8.2f} s   ({out['cpu'] / n * 1e3:.1f} ms per sandbox)"
    )
    print(f"    client peak RSS    {out['rss']:8.1f} MB  (before: {out['rss0']:.1f} MB)")
    print(f"    RPCs per command   {per_cmd:8.1f}     (envd mean + REST create/kill)")
    print(f"    errors             {len(out['errors']):8d}     {out['errors'][:3]}")
    print(
        f"    retries {out['stats'].retries}, resets {out['stats'].resets}, connections "
        + ", ".join(f"{p.connections_opened} (peak {p.peak_streams} streams)" for p in pools)
    )


def main() -> None:
    with Server() as info:
        if os.environ.get("TRIO_SWE_BENCH_E2B_RECORD_ONLY") == "1":
            bench_record(info)
            return
        bench_cpu(info)
        bench_record(info)
    if os.environ.get("TRIO_SWE_BENCH_E2B_CPU_ONLY") == "1":
        return
    with Server() as info:
        bench_many(info)


if __name__ == "__main__":
    main()
