"""E2B client at scale: 1,000 and 10,000 concurrent detached commands, one client process.

The server is the envd test server in its synthetic mode (``trio_swe.testing.SyntheticBackend``:
commands are timers, files are in memory) in a subprocess of its own, over TLS + HTTP/2 on
loopback, so what is measured here is the client: ``E2BBackend`` + ``exec_and_wait`` on one trio
thread.

Each of N sandboxes is created on a ramp (``N / RATE`` s at most; at most ``INFLIGHT`` between
create and spawn, so a slow machine ramps slower), runs one detached ``sleep D; exit K``, and is
killed. The commands are long timers: once all run, the steady state is measured for ``HOLD`` s,
then the server is told to end them (``reschedule``), spread evenly at ``END_RATE`` per second.
Reported:

* errors (exceptions or wrong exit codes; must be 0);
* client peak RSS;
* client CPU % of one core in steady state: all N spawned, none ended (sampled every second);
  the server's in the same window, to show it is not the bottleneck;
* end -> caller has the exit code: the server's scheduled end of each command
  (``time.monotonic()``, one clock for both processes) to the return of ``exec_and_wait``;
  p50 / p99 / max;
* connections and streams per connection (the client pool's, and the server's count).

Run: ``python -m bench e2b_scale`` (1,000 only, about 2 minutes on a quiet machine);
``TRIO_SWE_SCALE_N=1000,10000 python -m bench e2b_scale`` for both (10,000: the ramp alone is
~170 s of client CPU). ``TRIO_SWE_SCALE_POLL`` sets ``poll_interval_sec`` (default 120, the
library's), ``_HOLD`` the steady window (40 s), ``_RATE`` / ``_END_RATE`` (100 / 50 per s),
``_INFLIGHT`` (64), ``_KEEPALIVE`` the backend's keepalive interval (default: the backend's,
50 s on the h2 client), ``_STREAMS`` / ``_CONNS``
the pool's caps, ``_LEAN=0`` hypercorn instead of the lean HTTP/2 server,
``_PROFILE=ramp|steady|end`` (``...2``: top functions too) a cProfile of that phase.
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from typing import Any

import trio

RATE = float(os.environ.get("TRIO_SWE_SCALE_RATE", "100"))  # sandboxes started per second
END_RATE = float(os.environ.get("TRIO_SWE_SCALE_END_RATE", "50"))  # command ends per second
POLL = float(os.environ.get("TRIO_SWE_SCALE_POLL", "120"))
#: Synthetic commands' length: they end when the server is told (``reschedule``), not on it.
_LONG = 100000.0
#: Serve with the test server's lean HTTP/2 server (1) or hypercorn (0).
LEAN = os.environ.get("TRIO_SWE_SCALE_LEAN", "1") == "1"
#: At most this many sandboxes between "create sent" and "spawn returned" (the ramp slows down
#: to what the machine can do instead of piling up requests).
INFLIGHT = int(os.environ.get("TRIO_SWE_SCALE_INFLIGHT", "64"))


def _pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _uptime() -> str:
    with open("/proc/loadavg") as f:
        return "load average " + " ".join(f.read().split()[:3])


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pool_figures(stats: Any) -> list[dict[str, Any]]:
    pools = stats["pools"] if isinstance(stats, dict) else getattr(stats, "pools", [])
    out = []
    for p in pools:
        get = p.get if isinstance(p, dict) else lambda k, p=p: getattr(p, k)
        out.append(
            {
                k: get(k)
                for k in (
                    "connections",
                    "connections_opened",
                    "active_streams",
                    "peak_streams",
                    "slot_waits",
                    "streams_per_connection",
                )
            }
        )
    return out


def run_one(n: int, srv: Any) -> dict[str, Any]:
    from trio_swe import exec_and_wait, open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend

    info = srv.info
    hold = float(os.environ.get("TRIO_SWE_SCALE_HOLD", "40"))
    spread = n / END_RATE
    kw: dict[str, Any] = {}
    if "TRIO_SWE_SCALE_STREAMS" in os.environ:
        kw["streams_per_connection"] = int(os.environ["TRIO_SWE_SCALE_STREAMS"])
    if "TRIO_SWE_SCALE_KEEPALIVE" in os.environ:
        kw["keepalive_interval"] = float(os.environ["TRIO_SWE_SCALE_KEEPALIVE"])
    if "TRIO_SWE_SCALE_CONNS" in os.environ:
        kw["max_connections"] = int(os.environ["TRIO_SWE_SCALE_CONNS"])

    async def main() -> dict[str, Any]:
        errors: list[str] = []
        returned: dict[str, float] = {}
        seen: dict[str, float] = {}  # tag -> when the wait RPC's "done" reply was in hand
        # (t, client cpu, server cpu, spawns, waits) every second
        samples: list[tuple[float, float, float, int, int]] = []
        cpu0 = _cpu()
        query_lock = trio.Lock()  # one question at a time on the server's stdin

        async def query(line: str) -> Any:
            async with query_lock:
                return await trio.to_thread.run_sync(srv.query, line)

        async with E2BBackend(
            api_key=info["api_key"],
            api_url=info["api_url"],
            sandbox_url=info["sandbox_url"],
            verify=info["ca_path"],
            **kw,
        ) as backend:
            t0 = time.monotonic()
            starting = trio.Semaphore(INFLIGHT)
            spawned: list[float] = []
            all_spawned = trio.Event()
            marks: dict[str, float] = {}  # steady_start, steady_end, first_end
            ending = trio.Event()  # the server was told to end them

            failed_early = 0  # calls that failed before their spawn returned

            def settled() -> None:
                if len(spawned) + failed_early >= n:
                    all_spawned.set()

            def on_spawned(sem: list[trio.Semaphore]) -> None:
                spawned.append(time.monotonic())
                settled()
                if sem:
                    sem.pop().release()

            async def one(i: int) -> None:
                await trio.sleep_until(trio.current_time() + i / RATE - (time.monotonic() - t0))
                code = i % 7
                held = [starting]
                await starting.acquire()  # at most INFLIGHT sandboxes between create and spawn
                try:
                    async with open_sandbox(backend, "base", workdir="/tmp", ttl_sec=7200) as raw:
                        sb = _WaitClock(raw, seen, lambda: on_spawned(held))
                        # Ended by the server's reschedule once all run (see controller).
                        r = await exec_and_wait(
                            sb,
                            f"sleep {_LONG:g}; exit {code}",
                            time_budget_sec=_LONG + 600,
                            poll_interval_sec=POLL,
                        )
                        returned[r.tag or ""] = time.monotonic()
                        if r.exit_code != code:
                            errors.append(f"{i}: {r}")
                except Exception as exc:
                    errors.append(f"{i}: {exc!r}")
                    if held:  # never spawned: do not wait for it
                        nonlocal failed_early
                        failed_early += 1
                        settled()
                finally:
                    if held:
                        held.pop().release()

            async def monitor() -> None:
                while True:
                    stats = await query("stats")
                    shapes = stats["synthetic"]["by_shape"]
                    samples.append(
                        (
                            time.monotonic(),
                            _cpu(),
                            stats["cpu_sec"],
                            shapes["spawn"],
                            shapes["wait"],
                        )
                    )
                    await trio.sleep(1.0)

            pools_steady: list[dict[str, Any]] = []

            async def controller() -> None:
                """Steady state once all run (HOLD s), then the server ends them, spread."""
                await all_spawned.wait()
                marks["steady_start"] = time.monotonic() + 5.0
                marks["steady_end"] = marks["steady_start"] + hold
                await trio.sleep_until(trio.current_time() + 5.0 + hold)
                pools_steady.extend(_pool_figures(backend.statistics()))
                window = [x for x in samples if x[0] >= marks["steady_start"]]
                if len(window) >= 2:  # printed now: a run stopped later keeps this figure
                    span = window[-1][0] - window[0][0]
                    print(
                        f"    (steady state: client {(window[-1][1] - window[0][1]) / span:.1%}, "
                        f"server {(window[-1][2] - window[0][2]) / span:.1%} of a core over "
                        f"{span:.0f} s, {len(spawned)} running, ramp "
                        f"{max(spawned) - t0:.0f} s, RSS {_rss_mb():.0f} MB; {_uptime()})",
                        flush=True,
                    )
                marks["first_end"] = time.monotonic() + 1.0
                await query(f"reschedule {marks['first_end']!r} {spread!r}")
                ending.set()

            lags: list[tuple[float, float]] = []  # (when, how late a 10 ms sleep woke)

            async def loop_lag() -> None:
                while True:
                    t = trio.current_time()
                    await trio.sleep(0.01)
                    lags.append((time.monotonic(), trio.current_time() - t - 0.01))

            async def profile() -> None:
                which = os.environ.get("TRIO_SWE_SCALE_PROFILE", "")
                if not which:
                    return
                import cProfile

                async def at(when: float) -> None:
                    await trio.sleep_until(trio.current_time() + when - time.monotonic())

                prof = cProfile.Profile(time.thread_time)
                if which.startswith("ramp"):
                    start = time.monotonic()
                    c0 = _cpu()
                    prof.enable()
                    await all_spawned.wait()
                else:
                    await all_spawned.wait()
                    if which.startswith("steady"):
                        await at(marks["steady_start"])
                    else:  # "end": while the commands end
                        await ending.wait()
                        await at(marks["first_end"])
                    start = time.monotonic()
                    c0 = _cpu()
                    prof.enable()
                    await at(start + (hold if which.startswith("steady") else spread))
                prof.disable()
                stop = time.monotonic()
                profiles.append((which, stop - start, _cpu() - c0, prof))

            profiles: list[tuple[str, float, float, Any]] = []
            async with trio.open_nursery() as outer:
                outer.start_soon(monitor)
                outer.start_soon(controller)
                outer.start_soon(loop_lag)
                outer.start_soon(profile)
                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(one, i)
                outer.cancel_scope.cancel()
            wall = time.monotonic() - t0
            pools_end = _pool_figures(backend.statistics())
            failures = dict(backend.statistics().failures)
        return {
            "failures": failures,
            "cpu_total": _cpu() - cpu0,
            "errors": errors,
            "returned": returned,
            "samples": samples,
            "first_end": marks.get("first_end", math.inf),
            "steady": (marks.get("steady_start", math.inf), marks.get("steady_end", math.inf)),
            "wall": wall,
            "ramp_actual": (max(spawned) - t0) if spawned else math.nan,
            "pools_steady": pools_steady,
            "pools_end": pools_end,
            "lags": lags,
            "seen": seen,
            "profiles": profiles,
        }

    out = trio.run(main)
    for which, window, cpu_used, prof in out["profiles"]:
        from bench.bench_e2b import _profile_report

        print(
            f"    profile '{which}': {window:.0f} s, {cpu_used:.1f} CPU s "
            f"({cpu_used / window * 100:.0f} % of a core, profiler-inflated)",
            file=sys.stderr,
        )
        os.environ.setdefault("TRIO_SWE_BENCH_PROFILE", "2" if which.endswith("2") else "1")
        _profile_report(prof, 1)
    ends: dict[str, float] = srv.query("ends")
    stats = srv.query("stats")
    replied: dict[str, float] = srv.query("replied")
    srv_lags: list[list[float]] = srv.query("lags")
    srv_lag_end = [lag for t, lag in srv_lags if t >= out["first_end"]]
    lat = [out["returned"][t] - ends[t] for t in out["returned"] if t in ends]
    srv_lat = [replied[t] - ends[t] for t in out["returned"] if t in ends and t in replied]
    seen = out["seen"]
    rpc_lat = [seen[t] - replied[t] for t in out["returned"] if t in seen and t in replied]
    wake_lat = [out["returned"][t] - seen[t] for t in out["returned"] if t in seen]
    # Steady state: every command spawned, none ended yet.
    lo, hi = out["steady"]
    steady = [s for s in out["samples"] if lo <= s[0] <= hi]
    cpu = srv_cpu = math.nan
    window = 0.0
    waits = 0
    if len(steady) >= 2:
        window = steady[-1][0] - steady[0][0]
        cpu = (steady[-1][1] - steady[0][1]) / window * 100
        srv_cpu = (steady[-1][2] - steady[0][2]) / window * 100
        waits = steady[-1][4] - steady[0][4]
    lag_steady = [lag for t, lag in out["lags"] if lo <= t < hi]
    lag_end = [lag for t, lag in out["lags"] if t >= out["first_end"]]
    end_cpu = end_srv_cpu = math.nan
    ending = [s for s in out["samples"] if s[0] >= out["first_end"]]
    if len(ending) >= 2:
        span = ending[-1][0] - ending[0][0]
        end_cpu = (ending[-1][1] - ending[0][1]) / span * 100
        end_srv_cpu = (ending[-1][2] - ending[0][2]) / span * 100
    return {
        "n": n,
        "uptime": _uptime(),
        "lag_steady": (_pct(lag_steady, 0.5) * 1e3, _pct(lag_steady, 0.99) * 1e3),
        "lag_end": (_pct(lag_end, 0.5) * 1e3, _pct(lag_end, 0.99) * 1e3),
        "end_cpu_pct": end_cpu,
        "srv_lag_end": (_pct(srv_lag_end, 0.5) * 1e3, _pct(srv_lag_end, 0.99) * 1e3),
        "end_server_cpu_pct": end_srv_cpu,
        "errors": out["errors"],
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "cpu_pct": cpu,
        "server_cpu_pct": srv_cpu,
        "window": window,
        "failures": out["failures"],
        "waits": waits,
        "cpu_per_call_ms": out["cpu_total"] / n * 1e3,
        "load": os.getloadavg()[0],
        "p50": _pct(lat, 0.5) * 1e3,
        "p99": _pct(lat, 0.99) * 1e3,
        "max": max(lat) * 1e3 if lat else math.nan,
        "measured": len(lat),
        "rpc_p50": _pct(rpc_lat, 0.5) * 1e3,
        "rpc_p99": _pct(rpc_lat, 0.99) * 1e3,
        "wake_p50": _pct(wake_lat, 0.5) * 1e3,
        "wake_p99": _pct(wake_lat, 0.99) * 1e3,
        "server_p50": _pct(srv_lat, 0.5) * 1e3,
        "server_p99": _pct(srv_lat, 0.99) * 1e3,
        "wall": out["wall"],
        "pools_steady": out["pools_steady"],
        "pools_end": out["pools_end"],
        "server_connections": stats["server"]["connections"],
        "server_peak_rss_mb": stats["peak_rss_mb"],
        "ramp": n / RATE,
        "ramp_actual": out["ramp_actual"],
        "hold": hold,
        "spread": n / END_RATE,
    }


def _report(r: dict[str, Any]) -> None:
    n = r["n"]
    print(
        f"  N = {n:,} concurrent detached `sleep D; exit K` (ramp {r['ramp']:.0f} s, ends spread "
        f"over {r['spread']:.0f} s, poll {POLL:g} s), wall {r['wall']:.0f} s"
    )
    keepalive = os.environ.get("TRIO_SWE_SCALE_KEEPALIVE", "default")
    print(f"    {r['uptime']} at the end; keepalive {keepalive}")
    print(f"    errors                         {len(r['errors'])}  {r['errors'][:3]}")
    print(
        f"    ramp                           {r['ramp_actual']:.0f} s (planned {r['ramp']:.0f} s, "
        f"then all ran for {r['hold']:.0f} s + 5 s before their ends began)"
    )
    print(f"    transient failures (retried)   {r['failures']}")
    print(f"    client peak RSS                {r['rss_mb']:.0f} MB")
    print(
        f"    client CPU, steady state       {r['cpu_pct']:.1f} % of one core "
        f"(over {r['window']:.0f} s; server {r['server_cpu_pct']:.1f} %; {r['waits']} wait "
        f"RPCs, {r['waits'] / max(r['window'], 1e-9):.0f}/s)"
    )
    print(
        f"    client CPU per sandbox, whole  {r['cpu_per_call_ms']:.1f} ms (create, write, "
        f"spawn, waits, cleanup, kill); load average at the end {r['load']:.1f}"
    )
    print(
        f"    client CPU while ending        {r['end_cpu_pct']:.1f} % of one core (server "
        f"{r['end_server_cpu_pct']:.1f} %); event loop "
        f"lag (10 ms sleep) p50/p99 steady {r['lag_steady'][0]:.1f}/{r['lag_steady'][1]:.1f} ms, "
        f"ending {r['lag_end'][0]:.1f}/{r['lag_end'][1]:.1f} ms (server's "
        f"{r['srv_lag_end'][0]:.1f}/{r['srv_lag_end'][1]:.1f} ms)"
    )
    print(
        f"    end -> caller has exit code    p50 {r['p50']:.0f} ms, p99 {r['p99']:.0f} ms, "
        f"max {r['max']:.0f} ms ({r['measured']} calls)"
    )
    print(
        f"      of which the server's reply  p50 {r['server_p50']:.0f} ms, "
        f"p99 {r['server_p99']:.0f} ms (end -> its wait reply is ready)"
    )
    print(
        f"      reply ready -> wait RPC back p50 {r['rpc_p50']:.0f} ms, p99 {r['rpc_p99']:.0f} ms; "
        f"wait RPC back -> call returns p50 {r['wake_p50']:.0f} ms, p99 {r['wake_p99']:.0f} ms"
    )
    for p in r["pools_steady"]:
        conns = max(1, p["connections"])
        print(
            f"    steady: {p['connections']} connections, {p['active_streams']} streams "
            f"({p['active_streams'] / conns:.0f} per connection, cap "
            f"{p['streams_per_connection']}), slot waits {p['slot_waits']}"
        )
    for p in r["pools_end"]:
        print(
            f"    end: {p['connections_opened']} connections opened, peak {p['peak_streams']} "
            f"streams; server saw {r['server_connections']} connections "
            f"(server peak RSS {r['server_peak_rss_mb']:.0f} MB)"
        )


def main() -> None:
    from trio_swe.testing import EnvdServerProcess

    if os.environ.get("TRIO_SWE_SCALE_STALL", "1") == "1":
        main_stall()
    sizes = [int(x) for x in os.environ.get("TRIO_SWE_SCALE_N", "1000").split(",") if x]
    print("E2B client at scale, synthetic envd server in a subprocess (TLS h2, loopback)")
    for n in sizes:
        print(f"  start: {_uptime()}; server {'lean h2' if LEAN else 'hypercorn'}", flush=True)
        with EnvdServerProcess(synthetic=True, tls=True, lean_http2=LEAN) as srv:
            _report(run_one(n, srv))
    print(
        "  goals (issue 13): 0 errors; at 10,000 RSS < 1 GB and CPU < 50 %; "
        "end -> exit code p50 <= 100 ms, p99 <= 300 ms at 1,000"
    )


if __name__ == "__main__":
    main()


class _WaitClock:
    """Wraps a sandbox; records when a detached wait RPC's "done" reply was in hand (by tag),
    and calls ``on_spawned`` when the spawn RPC returned."""

    def __init__(self, sb: Any, seen: dict[str, float], on_spawned: Any) -> None:
        self._sb = sb
        self._seen = seen
        self._on_spawned = on_spawned

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sb, name)

    async def exec(self, cmd: str, **kw: Any) -> Any:
        result = await self._sb.exec(cmd, **kw)
        if "trio-swe-launcher" in cmd and self._on_spawned is not None:
            on_spawned, self._on_spawned = self._on_spawned, None  # once (a replayed spawn)
            on_spawned()
        if "flock -s -w" in cmd and " done " in result.output:
            tag = cmd.split("cd ", 1)[1].split(" ", 1)[0].rsplit("/", 1)[-1]
            self._seen.setdefault(tag, time.monotonic())
        return result


# --- the 200-sandbox spawn stall (issue 13) ---------------------------------------------------


class _SpawnClock:
    """Wraps a sandbox; records, by the detached call's tag, when its command file write began
    and when its spawn RPC began and returned."""

    def __init__(self, sb: Any, times: dict[str, list[float]]) -> None:
        self._sb = sb
        self._times = times

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sb, name)

    async def write_file(self, path: str, data: Any, **kw: Any) -> Any:
        if "/.trio_swe/" in path:
            tag = path.rsplit("/", 2)[-2]
            self._times.setdefault(tag, [time.monotonic(), math.nan, math.nan])
        return await self._sb.write_file(path, data, **kw)

    async def exec(self, cmd: str, **kw: Any) -> Any:
        spawn = "trio-swe-launcher" in cmd
        t0 = time.monotonic()
        result = await self._sb.exec(cmd, **kw)
        if spawn:
            tag = cmd.split("cd ", 1)[1].split(" ", 1)[0].rsplit("/", 1)[-1]
            rec = self._times.setdefault(tag, [t0, t0, t0])
            rec[1:] = [t0, time.monotonic()]
        return result


def run_stall(
    n: int, srv: Any, *, together: bool, sec: float, poll: float, real: bool
) -> dict[str, Any]:
    """N sandboxes boot and each runs one detached ``sleep sec``: booted and run together, or
    all booted first. Figures: write + spawn (the command file write began -> the spawn RPC
    returned), the spawn RPC alone, and (synthetic server) spawn lag = spawn RPC returned -
    command started on the server; the server's event-loop lag over the run."""
    from trio_swe import exec_and_wait, open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend

    info = srv.info

    async def main() -> dict[str, Any]:
        times: dict[str, list[float]] = {}
        durations: dict[str, float] = {}
        errors: list[str] = []
        booted = trio.Event()
        count = 0
        async with E2BBackend(
            api_key=info["api_key"],
            api_url=info["api_url"],
            sandbox_url=info["sandbox_url"],
            verify=info["ca_path"],
        ) as backend:

            async def one(i: int) -> None:
                nonlocal count
                try:
                    async with open_sandbox(backend, "base", workdir="/tmp") as raw:
                        count += 1
                        if count == n:
                            booted.set()
                        if not together:
                            await booted.wait()
                        sb = _SpawnClock(raw, times)
                        r = await exec_and_wait(
                            sb, f"sleep {sec}", time_budget_sec=sec + 600, poll_interval_sec=poll
                        )
                        durations[r.tag or ""] = sec
                        if r.exit_code != 0:
                            errors.append(f"{i}: {r}")
                except Exception as exc:
                    errors.append(f"{i}: {exc!r}")

            t0 = time.monotonic()
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(one, i)
            failures = dict(backend.statistics().failures)
        return {
            "times": times,
            "durations": durations,
            "errors": errors,
            "t0": t0,
            "failures": failures,
        }

    out = trio.run(main)
    ends: dict[str, float] = {} if real else srv.query("ends")
    lags = [lag for t, lag in srv.query("lags") if t >= out["t0"]]
    times = out["times"]
    both = [times[t][2] - times[t][0] for t in out["durations"] if t in times]
    spawn = [times[t][2] - times[t][1] for t in out["durations"] if t in times]
    late = [
        times[t][2] - (ends[t] - out["durations"][t])
        for t in out["durations"]
        if t in ends and t in times
    ]
    return {
        "both": both,
        "spawn": spawn,
        "late": late,
        "errors": out["errors"],
        "failures": out["failures"],
        "server_lag": (_pct(lags, 0.5), _pct(lags, 0.99), max(lags) if lags else math.nan),
    }


def _dist(values: list[float]) -> str:
    if not values:
        return "n/a"
    return (
        f"p50 {_pct(values, 0.5) * 1e3:6.0f}  p90 {_pct(values, 0.9) * 1e3:6.0f}  "
        f"max {max(values) * 1e3:6.0f} ms"
    )


def main_stall() -> None:
    """The 200-sandbox spawn stall of issue 13: booted and run together vs booted first.

    ``TRIO_SWE_STALL_REAL=1``: the real local server (local sandboxes, real processes, in a
    subprocess, hypercorn as in the issue's runs); otherwise the synthetic one with
    ``TRIO_SWE_STALL_BOOT`` s boots. ``TRIO_SWE_STALL_N`` sandboxes (200).
    """
    from trio_swe.testing import EnvdServerProcess

    n = int(os.environ.get("TRIO_SWE_STALL_N", "200"))
    boot = float(os.environ.get("TRIO_SWE_STALL_BOOT", "3"))
    real = os.environ.get("TRIO_SWE_STALL_REAL", "0") == "1"
    lean = os.environ.get("TRIO_SWE_STALL_LEAN", "0") == "1"
    sec, poll = 20.0, 5.0
    where = "real local sandboxes" if real else f"synthetic, boot {boot:g} s"
    print(
        f"spawn stall: {n} sandboxes ({where}; server {'lean h2' if lean else 'hypercorn'}), "
        f"detached `sleep {sec:g}`, poll {poll:g} s"
    )
    for together in (True, False):
        print(f"  start: {_uptime()}", flush=True)
        with EnvdServerProcess(
            synthetic=not real, tls=True, boot_sec=0.0 if real else boot, lean_http2=lean
        ) as srv:
            r = run_stall(n, srv, together=together, sec=sec, poll=poll, real=real)
        how = "booted and run together" if together else "all booted first"
        lag = r["server_lag"]
        print(f"  {how}: {len(r['errors'])} errors {r['errors'][:2]}, retried {r['failures']}")
        print(f"    write + spawn        {_dist(r['both'])}")
        print(f"    spawn RPC            {_dist(r['spawn'])}")
        if r["late"]:
            print(f"    spawn returned - command started {_dist(r['late'])}")
        print(
            f"    server loop lag      p50 {lag[0] * 1e3:.0f}  p99 {lag[1] * 1e3:.0f}  "
            f"max {lag[2] * 1e3:.0f} ms; {_uptime()}"
        )
