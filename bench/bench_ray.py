"""Rollouts through Ray against ``run_rollouts`` in one process, on a simulated two-node cluster.

All in one run, on :func:`trio_swe.testing.local_ray_cluster` (two Ray nodes on this machine,
loopback only), with the demo set (minus its slow instance), the bash agent and the scripted
policy server:

* episodes per minute: ``run_rollouts`` in this process (the baseline), one Ray worker, two
  workers (one per node) at the same total concurrency, and two workers at twice it;
* the overhead per episode of going through Ray, at concurrency 1: the time from dispatch to
  result as the driver sees it minus the episode's own ``timings.total`` as the worker measured
  it, beside the same difference for ``run_rollouts`` in this process;
* what crosses Ray per episode: encoding the job and decoding the result frame (msgpack, the
  samples as ``encode_sample`` buffers) against pickling the same objects;
* hosting trio in an actor: an async actor with trio as a guest of its loop (what the workers
  do) against a threaded actor running ``trio.run`` in a thread, per call;
* a dead worker's E2B sandboxes (against the local envd server): from ``ray.kill`` of a worker
  holding sandboxes to every one of them gone, against the driver listing and killing as many
  sandboxes itself (``E2BBackend.kill_sandboxes``), and the TTL they would otherwise live.

Run: ``python -m bench ray``. ``BENCH_RAY_CONCURRENCY`` (default 4, the total) and
``BENCH_RAY_EPISODES`` (default 14) set the throughput runs; ``BENCH_RAY_ROUNDS`` (default 3)
repeats them (medians are printed); ``BENCH_RAY_ONLY=orphans`` (or ``throughput``,
``hosting``) runs one section. The machine's 2 cores are shared by both simulated nodes,
so two workers cannot be faster than one here: the figures show what Ray costs, not a speed-up.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pickle
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlencode

import msgspec
import trio
import trio.lowlevel

from trio_swe import EpisodeResult, SweConfig, run_rollouts
from trio_swe.agents import BashAgent
from trio_swe.config import replace_option
from trio_swe.demo import build_demo_set, open_scripted_policy_server
from trio_swe.grading import InstanceMetadata, get_metadata
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.results import decode_result, encode_result
from trio_swe.sandbox.local import LocalBackend

CONCURRENCY = int(os.environ.get("BENCH_RAY_CONCURRENCY", "4"))
EPISODES = int(os.environ.get("BENCH_RAY_EPISODES", "14"))
ROUNDS = int(os.environ.get("BENCH_RAY_ROUNDS", "3"))
OVERHEAD_EPISODES = 7
ONLY = os.environ.get("BENCH_RAY_ONLY", "")


def _config(policy_url: str) -> SweConfig:
    config = SweConfig()
    for path, value in {
        "bash.policy_url": policy_url,
        "episode.agent_time_budget_sec": 120.0,
        "episode.eval_timeout_sec": 120.0,
        "episode.setup_timeout_sec": 120.0,
        "boot.concurrency": 16,
        "bash.max_turns": 10,
    }.items():
        config = replace_option(config, path, value)
    return config


Runner = Callable[[list[InstanceMetadata], Callable[[InstanceMetadata], None]], Awaitable[Any]]


async def _timed(
    run: Callable[..., Any], mds: list[InstanceMetadata]
) -> tuple[float, list[tuple[float, EpisodeResult]]]:
    """Wall time of one batch, and per result its dispatch-to-result latency."""
    started: dict[str, float] = {}
    out: list[tuple[float, EpisodeResult]] = []

    def on_start(md: InstanceMetadata) -> None:
        started[md.instance_id] = time.monotonic()

    t0 = time.monotonic()
    async with run(mds, on_start) as stream:
        async for result in stream:
            out.append((time.monotonic() - started[result.instance_id], result))
    wall = time.monotonic() - t0
    bad = [r for _, r in out if r.status == "aborted"]
    if bad:
        raise RuntimeError(f"aborted episodes in the benchmark: {bad[0].error}")
    return wall, out


async def _throughput_and_overhead(tmp: str) -> None:
    from trio_swe.ray import WorkerPool

    demo = build_demo_set(f"{tmp}/repos")
    rows = [r for r in demo.rows if r["metadata"]["instance_id"] not in demo.timeouts]
    mds = [get_metadata(r, "scaleswe") for r in rows]
    batch = [mds[i % len(mds)] for i in range(EPISODES)]
    backend_factory = functools.partial(LocalBackend, state_dir=f"{tmp}/state")
    local_backend = backend_factory()
    async with open_scripted_policy_server(demo.scripts) as server:
        config = _config(server.url)
        async with SGLangPolicy(server.url) as policy:
            agent = BashAgent(policy, ByteTokenizer(), max_turns=10)

            def local(concurrency: int) -> Callable[..., Any]:
                def run(m: list[InstanceMetadata], on_start: Any) -> Any:
                    return run_rollouts(
                        m,
                        agent,
                        backend=local_backend,
                        config=config,
                        concurrency=concurrency,
                        network=False,
                        on_start=on_start,
                    )

                return run

            def pool_opts(resources: list[dict[str, float]], concurrency: int) -> WorkerPool:
                return WorkerPool(
                    resources=resources,
                    concurrency=concurrency,
                    config=config,
                    backend=backend_factory,
                    limiter_name=None,
                    num_cpus=0,  # four pools at once on nodes of 2 CPUs
                )

            one = pool_opts([{"node_a": 1}], CONCURRENCY)
            two = pool_opts([{"node_a": 1}, {"node_b": 1}], max(1, CONCURRENCY // 2))
            two_x2 = pool_opts([{"node_a": 1}, {"node_b": 1}], CONCURRENCY)
            serial = pool_opts([{"node_a": 1}], 1)
            pools = [one, two, two_x2, serial]
            for p in pools:
                await p.start()
            try:

                def via(pool: WorkerPool) -> Callable[..., Any]:
                    def run(m: list[InstanceMetadata], on_start: Any) -> Any:
                        return pool.rollouts(m, network=False, on_start=on_start)

                    return run

                cases = [
                    (f"run_rollouts, one process, c={CONCURRENCY}", local(CONCURRENCY)),
                    (f"Ray, 1 worker x c={CONCURRENCY}", via(one)),
                    (f"Ray, 2 workers x c={max(1, CONCURRENCY // 2)}", via(two)),
                    (f"Ray, 2 workers x c={CONCURRENCY}", via(two_x2)),
                ]
                walls: dict[str, list[float]] = {name: [] for name, _ in cases}
                boots: dict[str, list[float]] = {name: [] for name, _ in cases}
                totals: dict[str, list[float]] = {name: [] for name, _ in cases}
                for _ in range(ROUNDS):
                    for name, run in cases:  # alternating, so load drifts hit every case
                        wall, got = await _timed(run, batch)
                        walls[name].append(wall)
                        boots[name] += [r.timings.boot for _, r in got]
                        totals[name] += [r.timings.total for _, r in got]
                base = EPISODES / statistics.median(walls[cases[0][0]]) * 60
                print(f"{EPISODES} episodes per run, median of {ROUNDS} round(s)")
                print(
                    f"{'':42} {'wall s':>8} {'episodes/min':>13} {'vs one process':>15}"
                    f" {'episode s':>10} {'boot s':>7}"
                )
                for name, _ in cases:
                    wall = statistics.median(walls[name])
                    rate = EPISODES / wall * 60
                    print(
                        f"{name:42} {wall:>8.1f} {rate:>13.1f} {rate / base:>14.2f}x"
                        f" {statistics.median(totals[name]):>10.2f}"
                        f" {statistics.median(boots[name]):>7.2f}"
                    )

                print()
                ser = mds[:OVERHEAD_EPISODES]
                _, in_process = await _timed(local(1), ser)
                _, through_ray = await _timed(via(serial), ser)
                local_extra = [lat - r.timings.total for lat, r in in_process]
                ray_extra = [lat - r.timings.total for lat, r in through_ray]
                print(f"per episode at concurrency 1, {len(ser)} episodes (ms)   median      max")
                print(
                    f"  dispatch-to-result minus the episode, run_rollouts "
                    f"{statistics.median(local_extra) * 1e3:>8.1f} {max(local_extra) * 1e3:>8.1f}"
                )
                print(
                    f"  dispatch-to-result minus the episode, Ray          "
                    f"{statistics.median(ray_extra) * 1e3:>8.1f} {max(ray_extra) * 1e3:>8.1f}"
                )
                from trio_swe.ray._bridge import wait_ref

                handle = serial.live_workers()[0].handle
                empty = []
                for _ in range(50):
                    t0 = time.monotonic()
                    await wait_ref(handle.ready.remote())
                    empty.append(time.monotonic() - t0)
                print(
                    f"  an empty call to the worker (ready), 50 calls      "
                    f"{statistics.median(empty) * 1e3:>8.1f} {max(empty) * 1e3:>8.1f}"
                )
                print(
                    f"  episode itself (worker's timings.total)            "
                    f"{statistics.median([r.timings.total for _, r in through_ray]) * 1e3:>8.1f}"
                )
                _serialisation(through_ray[0][1], ser[0])
            finally:
                for p in pools:
                    await p.aclose()


def _serialisation(result: EpisodeResult, md: InstanceMetadata) -> None:
    from trio_swe.ray._wire import Job, decode_job, encode_job

    job = Job(key="k" * 32, batch="b" * 32, md=md, sampling_params={"temperature": 1.0})
    frame = encode_result(result)
    loops = 2000

    def per_call(fn: Callable[[], object]) -> float:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(loops):
                fn()
            runs.append((time.perf_counter() - t0) / loops)
        return statistics.median(runs)

    msgpack_s = per_call(lambda: decode_job(encode_job(job))) + per_call(
        lambda: decode_result(encode_result(result))
    )
    # The alternative: the result with its samples as Python lists (slime's shape), pickled.
    as_lists = (
        msgspec.structs.replace(result, samples=[]),
        [s.to_slime_dict() for s in result.samples],
    )
    pickled = pickle.dumps(as_lists)
    pickle_s = per_call(lambda: pickle.loads(pickle.dumps(job))) + per_call(
        lambda: pickle.loads(pickle.dumps(as_lists))
    )
    tokens = sum(len(s.tokens) for s in result.samples)
    print()
    print(
        f"what crosses Ray per episode ({len(result.samples)} sample(s), {tokens} tokens): "
        f"result frame {len(frame)} B (pickle {len(pickled)} B)"
    )
    print(f"  msgpack job + result, encode and decode   {msgpack_s * 1e6:>8.1f} us")
    print(f"  pickle  job + result as lists, round trip {pickle_s * 1e6:>8.1f} us")
    print(f"  pickle / msgpack                          {pickle_s / msgpack_s:>8.2f}x")


# --- hosting trio in an actor ----------------------------------------------------------------


async def _tiny_work() -> bytes:
    for _ in range(5):
        await trio.lowlevel.checkpoint()
    await trio.run_process(["true"])
    return b"x" * 200


class _Threaded:
    """``trio.run`` in a thread for the actor's life; calls enter it with ``trio.from_thread``."""

    def __init__(self) -> None:
        ready = threading.Event()
        self.token: Any = None

        def main() -> None:
            async def hold() -> None:
                self.token = trio.lowlevel.current_trio_token()
                ready.set()
                await trio.sleep_forever()

            trio.run(hold)

        threading.Thread(target=main, daemon=True).start()
        ready.wait()

    def call(self) -> bytes:
        return trio.from_thread.run(_tiny_work, trio_token=self.token)


class _Guest:
    """trio as a guest of the async actor's loop, through trio_swe.aio (what workers do)."""

    def __init__(self) -> None:
        self.host: Any = None

    async def call(self) -> bytes:
        from trio_swe import aio

        if self.host is None:  # keep one trio run alive, as a worker's host task does
            self.host = asyncio.ensure_future(aio.run(trio.sleep_forever))
        return await aio.run(_tiny_work)


def _hosting() -> None:
    import ray as ray_module

    ray: Any = ray_module  # actor handles and .remote are not typed by ray
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    threaded = ray.remote(_Threaded).options(max_concurrency=64, num_cpus=0).remote()
    guest = ray.remote(_Guest).options(max_concurrency=64, num_cpus=0).remote()
    ray.get([threaded.call.remote(), guest.call.remote()])
    serial: dict[str, list[float]] = {"threaded": [], "guest": []}
    burst: dict[str, list[float]] = {"threaded": [], "guest": []}
    for _ in range(5):
        for name, actor in (("threaded", threaded), ("guest", guest)):
            for _ in range(20):
                t0 = time.perf_counter()
                ray.get(actor.call.remote())
                serial[name].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ray.get([actor.call.remote() for _ in range(200)])
            burst[name].append((time.perf_counter() - t0) / 200)
    print()
    print("trio in an actor: one call = 5 checkpoints + one subprocess     median ms")
    for name, label in (
        ("threaded", "threaded actor, trio.run in a thread"),
        ("guest", "async actor, trio as guest (workers)"),
    ):
        print(
            f"  {label:40} one at a time {statistics.median(serial[name]) * 1e3:>7.2f}"
            f"   200 at once, per call {statistics.median(burst[name]) * 1e3:>6.2f}"
        )
    ratio = statistics.median(serial["guest"]) / statistics.median(serial["threaded"])
    print(f"  guest / threaded, one at a time: {ratio:.2f}x")
    ray.kill(threaded)
    ray.kill(guest)


async def _owned_ids(envd: Any, owner: str) -> list[str]:
    """The live sandboxes of ``owner``, listed by metadata through the REST API."""
    import httpx

    from trio_swe.ray._owned import OWNER_KEY

    async with httpx.AsyncClient(base_url=envd.api_url) as client:
        resp = await client.get(
            "/v2/sandboxes",
            params={"metadata": urlencode({OWNER_KEY: owner})},
            headers={"x-api-key": envd.api_key or ""},
        )
    resp.raise_for_status()
    return [s["sandboxID"] for s in resp.json()]


async def _orphans(tmp: str) -> None:
    """A worker killed while it holds E2B sandboxes: how long until they are gone."""
    import ray

    from trio_swe.ray import WorkerPool
    from trio_swe.ray._owned import DEFAULT_ORPHAN_TTL_SEC, OWNER_KEY
    from trio_swe.sandbox import open_sandbox
    from trio_swe.sandbox.e2b import E2BBackend
    from trio_swe.testing import open_envd_server

    demo = build_demo_set(f"{tmp}/orphans-repos")
    rows = [r for r in demo.rows if r["metadata"]["instance_id"] not in demo.timeouts]
    mds = [get_metadata(r, "scaleswe") for r in rows]
    envd_backend = LocalBackend(state_dir=f"{tmp}/envd-state")
    async with (
        open_envd_server(
            backend=envd_backend, templates={md.image: md.image for md in mds}
        ) as envd,
        open_scripted_policy_server(demo.scripts) as server,
    ):
        opts: dict[str, Any] = {
            "api_key": envd.api_key,
            "api_url": envd.api_url,
            "sandbox_url": envd.sandbox_url,
            "h2c": True,
        }
        config = replace_option(_config(server.url), "backend", "e2b")
        reaps: list[float] = []
        held: list[int] = []
        async with WorkerPool(
            resources=[{"node_a": 1}, {"node_b": 1}],
            concurrency=3,
            config=config,
            backend=functools.partial(E2BBackend, **opts),
            limiter_name=None,
            num_cpus=0,
        ) as pool:
            for _ in range(ROUNDS):

                async def watch(ids: list[str], t0: float) -> None:
                    for sandbox_id in ids:
                        await envd.wait_sandbox_gone(sandbox_id)
                    reaps.append(time.monotonic() - t0)

                killed = False
                async with (
                    trio.open_nursery() as nursery,
                    pool.rollouts(mds * 2, network=False) as stream,
                ):
                    async for _ in stream:
                        if killed:
                            continue
                        for w in pool.live_workers():
                            ids = await _owned_ids(envd, w.info.worker_id)
                            if w.running and ids:
                                nursery.start_soon(watch, ids, time.monotonic())
                                ray.kill(w.handle)
                                held.append(len(ids))
                                killed = True
                                break
        # The floor: the driver lists and kills as many sandboxes itself.
        direct: list[float] = []
        async with E2BBackend(**opts) as backend:
            for n in held:
                async with AsyncExitStack() as stack:
                    for _ in range(n):
                        sb = await stack.enter_async_context(
                            open_sandbox(backend, mds[0].image, metadata={OWNER_KEY: "bench"})
                        )
                        del sb
                    t0 = time.monotonic()
                    await backend.kill_sandboxes({OWNER_KEY: "bench"})
                    direct.append(time.monotonic() - t0)
    if not reaps:
        print("\norphans: no worker held a sandbox when a result came in; nothing measured")
        return
    reap, floor = statistics.median(reaps), statistics.median(direct)
    print()
    print(f"a killed worker's E2B sandboxes ({len(reaps)} kills, {statistics.median(held)} held)")
    print(f"  ray.kill -> all its sandboxes gone (reaped)     {reap * 1e3:>9.1f} ms")
    print(f"  driver lists and kills as many itself           {floor * 1e3:>9.1f} ms")
    print(f"  reaped / direct                                 {reap / floor:>9.2f}x")
    print(
        f"  without a reap: until the orphan TTL            {DEFAULT_ORPHAN_TTL_SEC * 1e3:>9.0f} ms"
    )


def main() -> None:
    from trio_swe.testing._ray import local_ray_cluster

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench_ray-") as tmp, local_ray_cluster():
        print(f"two-node cluster on loopback up in {time.monotonic() - t0:.1f} s")
        if ONLY in ("", "throughput"):
            trio.run(_throughput_and_overhead, tmp)
        if ONLY in ("", "hosting"):
            _hosting()
        if ONLY in ("", "orphans"):
            trio.run(_orphans, tmp)


if __name__ == "__main__":
    main()
