"""The pool from asyncio, slime's generate() on SWE_RAY_WORKERS, and ``trio-swe run --ray``.

Part of the full Ray suite (``nox -s ray``); the default run has one Ray test (test_pool.py).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import os
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from trio_swe import aio, generate, read_results
from trio_swe.demo import DemoSet, build_demo_set, open_scripted_policy_server
from trio_swe.sandbox.local import LocalBackend

from ..test_episode_support import build_demo, demo_config, processes_mentioning
from ..test_rollout_generate import SlimeLikeSample
from .test_pool import FULL

pytestmark = FULL

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")


async def _serve(demo: DemoSet, port: asyncio.Future[int]) -> None:
    async with open_scripted_policy_server(demo.scripts) as server:
        port.set_result(server.port)
        await trio.sleep_forever()


def test_asyncio_driver_streams_results_and_leaving_early_leaves_nothing(
    ray_cluster: object, tmp_path: Path
) -> None:
    from trio_swe.ray import AsyncioWorkerPool

    demo, mds, _ = build_demo(tmp_path)
    picked = [md for md in mds if md.instance_id not in demo.timeouts][:4]

    async def main() -> tuple[list[str], list[Any]]:
        port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.ensure_future(aio.run(_serve, demo, port))
        url = f"http://127.0.0.1:{await port}"
        try:
            async with AsyncioWorkerPool(
                resources=[{"node_a": 1}, {"node_b": 1}],
                concurrency=2,
                config=demo_config(policy_url=url),
                backend=functools.partial(LocalBackend, state_dir=str(tmp_path / "state")),
            ) as pool:
                done = []
                async with pool.rollouts(picked, network=False) as results:
                    async for result in results:
                        assert result.reward == demo.expected_rewards[result.instance_id]
                        done.append(result.instance_id)
                async with pool.rollouts(picked * 2, network=False) as results:
                    async for _ in results:
                        break  # the rest are cancelled on their workers
                return done, await pool.worker_statistics()
        finally:
            server.cancel()
            try:
                await server
            except asyncio.CancelledError:
                pass

    done, stats = asyncio.run(main())
    assert sorted(done) == sorted(md.instance_id for md in picked)
    assert all(s.running == 0 and s.backend["live"] == 0 for s in stats), stats
    assert processes_mentioning(str(tmp_path / "state")) == []
    assert list((tmp_path / "state").glob("sb-*")) == []


def test_slime_generate_dispatches_to_the_shared_pool(
    ray_cluster: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_swe.ray import AsyncioWorkerPool, RayOptions, shared_pool

    pool_name = f"pool-{uuid.uuid4().hex[:6]}"
    for var, value in {
        "SWE_RAY_WORKERS": "2",
        "SWE_RAY_CONCURRENCY": "2",
        "SWE_RAY_POOL": pool_name,
        "SWE_RAY_NAMESPACE": "trio_swe-tests",
        "SWE_RAY_MAX_ALIVE": "3",
        "SWE_AGENT_TIME_BUDGET_SEC": "60",
        "SWE_EVAL_TIMEOUT_SEC": "60",
        "SWE_MAX_TURNS": "10",
    }.items():
        monkeypatch.setenv(var, value)
    demo = build_demo_set(tmp_path / "repos")
    by_id = {row["label"]: row for row in demo.rows}
    ids = ["demo__calc-1", "demo__leap-1", "demo__stack-1"]

    def sample_of(iid: str) -> SlimeLikeSample:
        row = copy.deepcopy(by_id[iid])
        return SlimeLikeSample(prompt=row["prompt"], label=row["label"], metadata=row["metadata"])

    async def main() -> tuple[list[Any], list[Any], Any]:
        port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.ensure_future(aio.run(_serve, demo, port))
        args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=await port)
        params = {"temperature": 1.0, "max_new_tokens": 2048}
        try:
            out = await asyncio.gather(*(generate(args, sample_of(i), params) for i in ids))
            options = RayOptions.from_env()
            assert options is not None
            pool = AsyncioWorkerPool(shared_pool(options, demo_config()))  # made once
            stats = await pool.worker_statistics()
            limits = await pool.limiter_statistics()
            await pool.shutdown()
            return out, stats, limits
        finally:
            server.cancel()
            try:
                await server
            except asyncio.CancelledError:
                pass

    out, stats, limits = asyncio.run(main())
    for iid, samples in zip(ids, out, strict=True):
        assert [s.reward for s in samples] == [demo.expected_rewards[iid]], iid
        assert all(s.metadata["instance_id"] == iid for s in samples)
        assert samples[0].response  # decoded here, by the same tokenizer as on the worker
    assert len(stats) == 2
    assert sum(s.finished for s in stats) == 3
    assert (limits.alive, limits.granted) == (0, 6)  # an agent and an eval sandbox each
    assert limits.peak_alive <= 3


async def test_trio_swe_run_on_ray_then_resume(ray_cluster: Any, tmp_path: Path) -> None:
    demo = build_demo_set(tmp_path / "repos")
    rows = [r for r in demo.rows if r["metadata"]["instance_id"] not in demo.timeouts][:4]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.msgpack"
    async with open_scripted_policy_server(demo.scripts) as server:
        env = {
            **os.environ,
            "COLUMNS": "160",
            "SWE_POLICY_URL": server.url,
            "SWE_AGENT_TIME_BUDGET_SEC": "60",
            "SWE_MAX_TURNS": "10",
        }
        argv = [
            TRIO_SWE,
            "run",
            str(dataset),
            "--ray",
            ray_cluster.address,
            "--concurrency",
            "2",
            "--max-alive",
            "3",
            "--no-network",
            "--no-progress",
            "--out",
            str(out),
        ]
        first = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True)
        text = first.stdout.decode()
        assert first.returncode == 0, text + first.stderr.decode()
        assert "on Ray: 2 workers on 2 nodes" in text, text
        results, _ = read_results(out)
        assert sorted(r.instance_id for r in results) == sorted(
            r["metadata"]["instance_id"] for r in rows
        )
        assert all(r.reward == demo.expected_rewards[r.instance_id] for r in results)
        again = await trio.run_process(argv, env=env, capture_stdout=True, capture_stderr=True)
        assert again.returncode == 0, again.stderr.decode()
        assert "nothing to run: 4 episode(s) already finished" in again.stdout.decode()


async def test_e2b_backend_on_the_workers_against_the_local_envd_server(
    ray_cluster: object, tmp_path: Path
) -> None:
    """Each worker keeps one E2BBackend (its HTTP/2 pools) across episodes; nothing is left."""
    from trio_swe.ray import WorkerPool
    from trio_swe.sandbox.e2b import E2BBackend
    from trio_swe.testing import open_envd_server

    demo, mds, _ = build_demo(tmp_path)
    picked = [md for md in mds if md.instance_id not in demo.timeouts][:4]
    local = LocalBackend(state_dir=tmp_path / "envd-state")
    async with (
        open_envd_server(backend=local, templates={md.image: md.image for md in picked}) as envd,
        open_scripted_policy_server(demo.scripts) as server,
    ):
        backend = functools.partial(
            E2BBackend,
            api_key=envd.api_key,
            api_url=envd.api_url,
            sandbox_url=envd.sandbox_url,
            h2c=True,
        )
        async with WorkerPool(
            resources=[{"node_a": 1}, {"node_b": 1}],
            concurrency=2,
            config=demo_config(policy_url=server.url, backend="e2b"),
            backend=backend,
            max_alive=3,
            limiter_name=f"limiter-{uuid.uuid4().hex[:8]}",
        ) as pool:
            async with pool.rollouts(picked * 2, network=False) as stream:
                results = [r async for r in stream]
            stats = await pool.worker_statistics()
            limits = await pool.limiter_statistics()
        assert envd.live_sandbox_ids() == []
    assert sorted(r.instance_id for r in results) == sorted(m.instance_id for m in picked * 2)
    assert all(r.reward == demo.expected_rewards[r.instance_id] for r in results), [
        (r.instance_id, r.status, r.error) for r in results
    ]
    assert sum(s.finished for s in stats) == 8
    for s in stats:  # one backend per worker for all its episodes: an agent + an eval sandbox each
        assert s.backend["live"] == 0, s
        assert s.backend["created"] == 2 * s.finished, s
    assert limits is not None
    assert (limits.alive, limits.granted) == (0, 16)
    assert limits.peak_alive <= 3
    assert local.statistics().live == 0
