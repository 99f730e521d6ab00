"""Faults on the e2b backend and of the driver process itself (the full Ray suite).

* a worker ``ray.kill``ed mid-run on the e2b backend: its sandboxes are found by their owner
  metadata and killed by a surviving worker before its episodes run again;
* Ctrl-C of ``trio-swe run --ray`` as a process: exit 130, the finished episodes in the results
  file, nothing left, and the rerun resumes;
* the driver process SIGKILLed: Ray kills its workers, their E2B sandboxes end at their short
  TTL (nobody pushes it forward any more), the limiter (owned by another process) reclaims their
  leases once they fall silent;
* the limiter's silent-holder expiry on its own, with a short TTL.

The envd test server runs in this process, on a local backend under the test's directory; the
workers reach it over loopback.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import msgspec
import pytest
import trio

from trio_swe import EpisodeResult, read_results
from trio_swe.demo import build_demo_set, open_scripted_policy_server
from trio_swe.grading import InstanceMetadata
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing import EnvdServer, open_envd_server

from ..test_episode_support import build_demo, demo_config, processes_mentioning
from .test_pool import FULL, _exited

ray = pytest.importorskip("ray")

from trio_swe.ray import LimiterClient, LimiterStatistics, WorkerPool, open_limiter  # noqa: E402
from trio_swe.ray._bridge import wait_ref  # noqa: E402
from trio_swe.ray._owned import OWNER_KEY  # noqa: E402
from trio_swe.sandbox.e2b import E2BBackend  # noqa: E402

pytestmark = FULL

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")
HERE = Path(__file__).parent


async def owned_live(envd: EnvdServer, owner: str) -> list[str]:
    """The live sandboxes whose metadata names ``owner``, as E2B's REST API lists them."""
    async with httpx.AsyncClient(base_url=envd.api_url) as client:
        resp = await client.get(
            "/v2/sandboxes",
            params={"metadata": urlencode({OWNER_KEY: owner})},
            headers={"x-api-key": envd.api_key or ""},
        )
    resp.raise_for_status()
    return [s["sandboxID"] for s in resp.json()]


async def wait_server_empty(envd: EnvdServer) -> None:
    """Until every sandbox on the server is gone (killed, or reclaimed at its TTL)."""
    while ids := envd.live_sandbox_ids():
        for sandbox_id in ids:
            await envd.wait_sandbox_gone(sandbox_id)


def alive_workers_of_other_jobs() -> list[dict[str, Any]]:
    """Rollout-worker actors alive in the cluster that this process did not start."""
    mine = ray.get_runtime_context().get_job_id()
    table = ray._private.state.actors(actor_state_name="ALIVE")
    return [
        a for a in table.values() if a["ActorClassName"].endswith("_Worker") and a["JobID"] != mine
    ]


async def wait_until(predicate: Callable[[], Awaitable[bool]], *, every: float = 0.5) -> None:
    """Poll a condition of other processes' state (Ray's, the limiter actor's: no event to wait
    on here); the caller's ``fail_after`` bounds it."""
    while not await predicate():  # noqa: ASYNC110 - state of other processes
        await trio.sleep(every)


async def no_foreign_workers() -> bool:
    return not alive_workers_of_other_jobs()


async def limits_of(limiter: Any) -> LimiterStatistics:
    raw: bytes = await wait_ref(limiter.statistics.remote())
    return msgspec.msgpack.decode(raw, type=LimiterStatistics)


@asynccontextmanager
async def open_e2b_demo(
    tmp_path: Path,
) -> AsyncIterator[tuple[Any, list[InstanceMetadata], Any, EnvdServer, LocalBackend]]:
    demo, mds, _ = build_demo(tmp_path)
    picked = [md for md in mds if md.instance_id not in demo.timeouts]
    local = LocalBackend(state_dir=tmp_path / "envd-state")
    async with (
        open_envd_server(backend=local, templates={md.image: md.image for md in picked}) as envd,
        open_scripted_policy_server(demo.scripts) as server,
    ):
        yield demo, picked, server, envd, local


@asynccontextmanager
async def spawn(argv: list[str], **kwargs: Any) -> AsyncIterator[trio.Process]:
    """A process with its output (stdout and stderr) on a pipe; killed if the block fails."""
    proc = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True):
            await proc.wait()


def e2b_factory(envd: EnvdServer) -> Any:
    return functools.partial(
        E2BBackend,
        api_key=envd.api_key,
        api_url=envd.api_url,
        sandbox_url=envd.sandbox_url,
        h2c=True,
    )


async def test_a_killed_worker_leaves_no_e2b_sandbox(ray_cluster: object, tmp_path: Path) -> None:
    """``ray.kill`` of a worker holding E2B sandboxes: every instance once, its sandboxes
    killed by the reap before the batch ends (their TTL is far longer), leases back to 0."""
    orphan_ttl = 90.0
    seen: list[str] = []
    results: list[EpisodeResult] = []
    async with open_e2b_demo(tmp_path) as (demo, picked, server, envd, local):
        mds = picked * 2
        async with WorkerPool(
            resources=[{"node_a": 1}, {"node_b": 1}],
            concurrency=3,
            config=demo_config(policy_url=server.url, backend="e2b"),
            backend=e2b_factory(envd),
            max_booting=2,
            max_alive=4,
            limiter_name=f"limiter-{uuid.uuid4().hex[:8]}",
            orphan_ttl_sec=orphan_ttl,
        ) as pool:
            async with pool.rollouts(mds, network=False) as stream:
                async for result in stream:
                    results.append(result)
                    if seen:
                        continue
                    # Kill the busiest worker that holds a sandbox right now.
                    for w in sorted(pool.live_workers(), key=lambda w: -w.running):
                        owned = await owned_live(envd, w.info.worker_id)
                        if w.running and owned:
                            seen += owned
                            t_kill = trio.current_time()
                            ray.kill(w.handle)
                            break
            assert seen, "no worker held a sandbox when a result came in"
            elapsed = trio.current_time() - t_kill
            stats = pool.statistics()
            assert (stats.deaths, stats.reaps) == (1, 1), stats
            assert stats.reruns >= 1, stats
            # The reap ran before the reruns: the victim's sandboxes are gone, and not by their
            # TTL (none has been reclaimed by the server while the batch was shorter than it).
            assert not set(seen) & set(envd.live_sandbox_ids()), (seen, stats)
            if elapsed < orphan_ttl:
                assert envd.statistics().sandboxes_reclaimed == 0
            for s in await pool.worker_statistics():
                assert s.running == 0, s
                assert s.backend["live"] == 0, s
            limits = await pool.limiter_statistics()
        # A create in flight at the kill completes on the server after the reap looked: that
        # sandbox ends at its short TTL, which nobody pushes forward.
        with trio.fail_after(orphan_ttl * 3):
            await wait_server_empty(envd)
    assert local.statistics().live == 0
    assert Counter(r.instance_id for r in results) == Counter(m.instance_id for m in mds)
    assert all(r.reward == demo.expected_rewards[r.instance_id] for r in results), [
        (r.instance_id, r.status, r.error) for r in results
    ]
    assert limits is not None
    assert (limits.alive, limits.booting, limits.waiting) == (0, 0, 0), limits
    assert limits.granted == limits.released + limits.reclaimed, limits
    assert limits.peak_alive <= 4, limits
    assert limits.peak_booting <= 2, limits


def _run_argv(dataset: Path, out: Path, address: str) -> list[str]:
    return [
        TRIO_SWE,
        "run",
        str(dataset),
        "--ray",
        address,
        "--concurrency",
        "2",
        "--max-alive",
        "4",
        "--no-network",
        "--no-progress",
        "--out",
        str(out),
    ]


async def test_ctrl_c_of_trio_swe_run_on_ray_leaves_nothing_and_resumes(
    ray_cluster: Any, tmp_path: Path
) -> None:
    """SIGINT after the first finished episode: exit 130, every episode it reported finished
    is in the results file, no sandbox, no worker, no lease; the rerun runs the rest."""
    demo = build_demo_set(tmp_path / "repos")
    rows = [r for r in demo.rows if r["metadata"]["instance_id"] not in demo.timeouts] * 3
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.msgpack"
    templates = {r["metadata"]["image"]: r["metadata"]["image"] for r in rows}
    local = LocalBackend(state_dir=tmp_path / "envd-state")
    # The CLI's limiter (its default name, in its namespace), made by this process so that it
    # outlives the CLI and can be asked afterwards.
    limiter = open_limiter(max_alive=4, namespace="trio_swe")
    try:
        async with (
            open_envd_server(backend=local, templates=templates) as envd,
            open_scripted_policy_server(demo.scripts) as server,
        ):
            env = {
                **os.environ,
                **envd.sdk_env(),
                "COLUMNS": "160",
                "SWE_BACKEND": "e2b",
                "SWE_POLICY_URL": server.url,
                "SWE_AGENT_TIME_BUDGET_SEC": "60",
                "SWE_MAX_TURNS": "10",
            }
            argv = _run_argv(dataset, out, ray_cluster.address)
            reported: list[str] = []
            with trio.fail_after(600):
                async with spawn(argv, env=env) as proc:
                    text = await _read_until_done(proc, reported)
                    proc.send_signal(signal.SIGINT)
                    text += await _read_all(proc)
                    code = await proc.wait()
            assert code == 130, text
            assert "interrupted" in text, text
            # Nothing left: the CLI killed its sandboxes and workers and returned its leases.
            assert envd.live_sandbox_ids() == [], text
            with trio.fail_after(60):
                await wait_until(no_foreign_workers)
            limits = await limits_of(limiter)
            assert (limits.alive, limits.booting, limits.waiting) == (0, 0, 0), limits
            assert limits.granted == limits.released + limits.reclaimed > 0, limits
            first, _ = read_results(out)
            got = Counter(r.instance_id for r in first)
            assert not Counter(reported) - got, (reported, got)  # every reported one is there
            assert len(first) < len(rows), "all finished before the interrupt"
            assert all(r.status != "aborted" for r in first), [r.error for r in first]

            again = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True)
            text = again.stdout.decode()
            assert again.returncode == 0, text + again.stderr.decode()
            assert (
                f"{len(rows) - len(first)} episodes to run ({len(first)} already finished" in text
            )
            assert envd.live_sandbox_ids() == []
    finally:
        ray.kill(limiter)
    final, _ = read_results(out)
    assert Counter(r.instance_id for r in final) == Counter(
        r["metadata"]["instance_id"] for r in rows
    )
    assert all(r.reward == demo.expected_rewards[r.instance_id] for r in final)
    assert local.statistics().live == 0
    assert processes_mentioning(str(tmp_path / "envd-state")) == []


async def _read_until_done(proc: trio.Process, reported: list[str]) -> str:
    """Read the CLI's output until it reports a finished episode (``done <id> ...``)."""
    assert proc.stdout is not None
    buf = b""
    while True:
        chunk = await proc.stdout.receive_some()
        if not chunk:
            raise AssertionError(f"the CLI ended before an episode finished: {buf.decode()}")
        buf += chunk
        lines = buf.decode(errors="replace").splitlines()
        reported[:] = [line.split()[1] for line in lines if line.startswith("done ")]
        if reported:
            return buf.decode(errors="replace")


async def _read_all(proc: trio.Process) -> str:
    assert proc.stdout is not None
    buf = b""
    while chunk := await proc.stdout.receive_some():
        buf += chunk
    return buf.decode(errors="replace")


async def test_a_killed_driver_leaves_nothing(ray_cluster: Any, tmp_path: Path) -> None:
    """SIGKILL of a driver process mid-run: Ray kills its workers (not detached), their E2B
    sandboxes end at their short TTL, and the limiter (this process's) reclaims their leases
    once they are silent for its holder TTL."""
    holder_ttl, orphan_ttl = 3.0, 10.0
    name = f"limiter-{uuid.uuid4().hex[:8]}"
    limiter = open_limiter(max_alive=4, holder_ttl_sec=holder_ttl, name=name)
    try:
        async with open_e2b_demo(tmp_path) as (demo, _, server, envd, local):
            job = tmp_path / "job.json"
            job.write_text(
                json.dumps(
                    {
                        "address": ray_cluster.address,
                        "namespace": "trio_swe-tests",
                        "limiter": name,
                        "orphan_ttl_sec": orphan_ttl,
                        "policy_url": server.url,
                        "e2b": {
                            "api_key": envd.api_key,
                            "api_url": envd.api_url,
                            "sandbox_url": envd.sandbox_url,
                        },
                        "rows": [
                            r
                            for r in demo.rows
                            if r["metadata"]["instance_id"] not in demo.timeouts
                        ]
                        * 3,
                    }
                )
            )
            with trio.fail_after(600):
                async with spawn(
                    [sys.executable, str(HERE / "driver_script.py"), str(job)]
                ) as proc:
                    info = await _read_workers(proc)

                    # Kill it while its workers hold sandboxes and leases.
                    async def busy() -> bool:
                        return (await limits_of(limiter)).alive >= 2 and bool(
                            envd.live_sandbox_ids()
                        )

                    await wait_until(busy, every=0.1)
                    held = await limits_of(limiter)
                    live_at_kill = envd.live_sandbox_ids()
                    proc.kill()
                    await proc.wait()
                    await _read_all(proc)
            assert live_at_kill
            assert held.alive >= 2

            async def no_lease() -> bool:
                return (await limits_of(limiter)).alive == 0

            with trio.fail_after(120):
                # Ray kills the actors a dead driver owned (their processes exit) ...
                await wait_until(no_foreign_workers)
                for pid in info["pids"]:
                    await _exited(pid)
                # ... their leases come back once they are silent for the holder TTL ...
                await wait_until(no_lease)
                # ... and their sandboxes end at the TTL nobody pushes forward any more.
                await wait_server_empty(envd)
            limits = await limits_of(limiter)
            assert limits.reclaimed >= held.alive - (limits.released - held.released), limits
            assert limits.reclaimed >= 1, limits
            assert limits.granted == limits.released + limits.reclaimed, limits
            stats = envd.statistics()
            assert stats.sandboxes_reclaimed >= 1, stats  # by their TTL: nobody killed them
        assert local.statistics().live == 0
        assert processes_mentioning(str(tmp_path / "envd-state")) == []
    finally:
        ray.kill(limiter)


async def _read_workers(proc: trio.Process) -> dict[str, Any]:
    """The driver script's ``WORKERS {...}`` line (pids, ids), once its workers are ready."""
    assert proc.stdout is not None
    buf = b""
    while True:
        for line in buf.decode(errors="replace").splitlines(keepends=True):
            if line.startswith("WORKERS ") and line.endswith("\n"):
                info: dict[str, Any] = json.loads(line.removeprefix("WORKERS "))
                return info
        chunk = await proc.stdout.receive_some()
        if not chunk:
            raise AssertionError(f"the driver ended early: {buf.decode(errors='replace')}")
        buf += chunk


async def test_the_limiter_reclaims_a_silent_holder_after_its_ttl(ray_cluster: object) -> None:
    """A holder that heartbeats keeps its lease; a silent one loses it after the holder TTL,
    and the request waiting for room gets it."""
    limiter = open_limiter(max_alive=2, holder_ttl_sec=5.0, name=None)
    try:
        talker, silent, waiter = (LimiterClient(limiter, h) for h in ("talker", "silent", "waiter"))
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(talker.heartbeat_forever, 0.5)
                nursery.start_soon(waiter.heartbeat_forever, 0.5)
                kept = await talker.acquire()
                await silent.acquire()
                t0 = trio.current_time()
                granted = await waiter.acquire()  # waits for the silent holder's expiry
                waited = trio.current_time() - t0
                nursery.cancel_scope.cancel()
        assert waited >= 5.0 * 0.9, waited  # not before the TTL (give the clocks some slack)
        per_holder = await wait_ref(limiter.per_holder.remote())
        assert per_holder == {"talker": 1, "waiter": 1}, per_holder
        limits = await limits_of(limiter)
        assert (limits.reclaimed, limits.alive) == (1, 2), limits
        talker.release(kept)
        waiter.release(granted)
    finally:
        ray.kill(limiter)
