"""Rollouts on a two-node Ray cluster: demo rewards, a worker killed midway, a cancelled driver.

Workers are pinned one per node with custom resources; their local backends keep their state
under the test's directory, so leftovers (sandbox processes, state directories) can be checked.
"""

from __future__ import annotations

import functools
import os
import random
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import EpisodeResult
from trio_swe.demo import open_scripted_policy_server
from trio_swe.rollout import episode_seed
from trio_swe.sandbox.local import LocalBackend

from ..test_episode_support import build_demo, demo_config, processes_mentioning

ray = pytest.importorskip("ray")

from trio_swe.ray import WorkerPool  # noqa: E402


def make_pool(tmp_path: Path, policy_url: str, **kwargs: Any) -> WorkerPool:
    options: dict[str, Any] = {
        "resources": [{"node_a": 1}, {"node_b": 1}],
        "concurrency": 3,
        "config": demo_config(policy_url=policy_url),
        "backend": functools.partial(LocalBackend, state_dir=str(tmp_path / "state")),
        "max_booting": 2,
        "max_alive": 4,
        "limiter_name": f"limiter-{uuid.uuid4().hex[:8]}",
    }
    options.update(kwargs)
    return WorkerPool(**options)


async def _exited(pid: int) -> None:
    """Wait until ``pid`` has exited (a pidfd turns readable), without polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        with open(f"/proc/{pid}/stat") as f:
            ppid = f.read().rsplit(")", 1)[1].split()[1]
        return f"{pid} (parent {ppid}): {cmd[:300]}"
    except OSError:
        return f"{pid}: gone"


async def assert_pool_clean(pool: WorkerPool, tmp_path: Path, dead_pids: set[int]) -> None:
    """Nothing runs, no lease is out, no sandbox process is left (the dead workers' included)."""
    for stats in await pool.worker_statistics():
        assert stats.running == 0, stats
        assert stats.backend["live"] == 0, stats
    limits = await pool.limiter_statistics()
    assert limits is not None
    assert (limits.alive, limits.booting, limits.waiting) == (0, 0, 0), limits
    assert limits.granted == limits.released + limits.reclaimed, limits
    assert limits.peak_alive <= 4, limits
    assert limits.peak_booting <= 2, limits
    state = tmp_path / "state"
    if dead_pids:
        # A killed worker's sandboxes end through their lifeline: asynchronously, once the
        # kernel has closed the dead process's pipe. Wait for those processes to exit.
        with trio.move_on_after(30):
            for pid in processes_mentioning(str(state)):
                await _exited(pid)
    left_pids = processes_mentioning(str(state))
    assert left_pids == [], [_cmdline(p) for p in left_pids]
    # A killed worker cannot clean its state directories; they hold no process (checked above)
    # and the next backend on that state root sweeps them. Nobody else's may be left.
    left = {int(p.name.split("-")[1]) for p in state.glob("sb-*")}
    assert left <= dead_pids, (left, dead_pids)


FULL = pytest.mark.skipif(
    os.environ.get("TRIO_SWE_RAY_FULL") != "1",
    reason="the heavier Ray suite runs in `nox -s ray` (TRIO_SWE_RAY_FULL=1)",
)


async def run_killing_the_busiest_worker(
    pool: WorkerPool, mds: list[Any], killed: set[int]
) -> list[EpisodeResult]:
    """Run ``mds``; after the first result, ``ray.kill`` the worker with the most episodes."""
    results: list[EpisodeResult] = []
    async with pool.rollouts(mds, network=False) as stream:
        async for result in stream:
            results.append(result)
            if not killed:
                victim = max(pool.live_workers(), key=lambda w: w.running)
                assert victim.running > 0
                killed.add(victim.info.pid)
                ray.kill(victim.handle)
    return results


async def run_cancelled_at(pool: WorkerPool, mds: list[Any], moment: float) -> int:
    """Run ``mds`` and cancel the driver after ``moment`` seconds; how many had finished."""
    finished = 0
    with trio.move_on_after(moment) as scope:
        async with pool.rollouts(mds, network=False) as stream:
            async for _ in stream:
                finished += 1
    assert scope.cancelled_caught, f"all {len(mds)} finished within {moment:.1f}s"
    return finished


async def test_two_nodes_a_killed_worker_then_a_cancelled_driver(
    ray_cluster: object, tmp_path: Path
) -> None:
    """The default run's Ray test (one cluster, one pool, three batches).

    1. The demo across two workers pinned to two nodes, the busiest worker killed with
       ``ray.kill`` after the first result: every instance exactly once with its scripted
       reward, no sandbox left, the limiter's leases back to zero.
    2. The driver cancelled at a random moment: nothing left, nothing leased.
    3. The same pool (its workers live across batches) runs another batch.
    4. And a group (issue 23 item 3) with one member already done.
    """
    demo, all_mds, _ = build_demo(tmp_path)
    mds = [md for md in all_mds if md.instance_id not in demo.timeouts]  # no 8 s tail
    expected = {md.instance_id: demo.expected_rewards[md.instance_id] for md in mds}
    killed: set[int] = set()
    async with open_scripted_policy_server(demo.scripts) as server:
        async with make_pool(tmp_path, server.url) as pool:
            assert len({w.info.node_id for w in pool.live_workers()}) == 2
            results = await run_killing_the_busiest_worker(pool, mds, killed)
            assert pool.statistics().deaths == 1
            assert pool.statistics().reruns >= 1
            await assert_pool_clean(pool, tmp_path, killed)
            assert Counter(r.instance_id for r in results) == Counter(m.instance_id for m in mds)
            assert {r.instance_id: r.reward for r in results} == expected
            assert all(r.status != "aborted" for r in results), [r.error for r in results]

            # Enough episodes that an idle machine (about 4 s for 14) is still busy at the moment.
            moment = random.Random(os.getpid()).uniform(0.3, 2.5)
            assert await run_cancelled_at(pool, mds * 4, moment) < 4 * len(mds)
            await assert_pool_clean(pool, tmp_path, killed)

            async with pool.rollouts(mds[:2], network=False) as stream:
                again = [r async for r in stream]
            assert sorted(r.instance_id for r in again) == sorted(m.instance_id for m in mds[:2])

            # 4. Groups on the pool, through the one rollout loop: members 0 and 2 of a group
            # of three (1 is done), each with its own seed reaching the policy server.
            seen = len(server.sampling_params_seen)
            first = mds[0].instance_id
            async with pool.rollouts(
                mds[:1], n_per_instance=3, done={(first, 1)}, network=False
            ) as stream:
                grouped = [r async for r in stream]
            assert sorted((r.group_id, r.group_index) for r in grouped) == [(first, 0), (first, 2)]
            assert {r.seed for r in grouped} == {episode_seed(first, i) for i in (0, 2)}
            seeds = [p["seed"] for p in server.sampling_params_seen[seen:]]
            assert len(seeds) == len(set(seeds)) == sum(r.n_turns for r in grouped)
        assert server.statistics().active == 0


@FULL
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_cancelling_the_driver_at_random_moments_leaves_nothing(
    ray_cluster: object, tmp_path: Path, seed: int
) -> None:
    demo, mds, _ = build_demo(tmp_path)
    async with open_scripted_policy_server(demo.scripts) as server:
        async with make_pool(tmp_path, server.url) as pool:
            moment = random.Random(seed).uniform(0.2, 4.0)
            await run_cancelled_at(pool, mds * 4, moment)
            await assert_pool_clean(pool, tmp_path, set())
        assert server.statistics().active == 0


@FULL
async def test_a_lost_node_costs_its_episodes_time_only(ray_cluster: Any, tmp_path: Path) -> None:
    """A third node is removed mid-run: its worker's episodes run again on node_a."""
    from trio_swe.testing._ray import add_loopback_node

    demo, all_mds, _ = build_demo(tmp_path)
    mds = [md for md in all_mds if md.instance_id not in demo.timeouts]
    node = add_loopback_node(ray_cluster, {"node_c": 100})  # Ray sets signals: main thread
    gone: set[int] = set()
    results: list[EpisodeResult] = []
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        make_pool(tmp_path, server.url, resources=[{"node_a": 1}, {"node_c": 1}]) as pool,
    ):
        on_c = [w for w in pool.live_workers() if w.info.node_id == node.node_id]
        assert len(on_c) == 1
        async with pool.rollouts(mds, network=False) as stream:
            async for result in stream:
                results.append(result)
                if not gone:
                    victim = next(w for w in pool.live_workers() if w.info.node_id == node.node_id)
                    assert victim.running > 0
                    gone.add(victim.info.pid)
                    await trio.to_thread.run_sync(ray_cluster.remove_node, node)
        assert pool.statistics().deaths == 1
        await assert_pool_clean(pool, tmp_path, gone)
    assert Counter(r.instance_id for r in results) == Counter(m.instance_id for m in mds)
    assert {r.instance_id: r.reward for r in results} == {
        m.instance_id: demo.expected_rewards[m.instance_id] for m in mds
    }
