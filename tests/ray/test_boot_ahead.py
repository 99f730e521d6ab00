"""Boot-ahead on the pool: a worker's agents hold its ``concurrency`` slots, ``boot_ahead`` more
episodes boot and wait beside them (as ``run_rollouts``' in tests/test_rollout.py)."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import trio

from trio_swe import ConfigError, EpisodeResult

from ..test_episode_support import build_demo, demo_config
from ._gate import GatedAgent, ReportingBackend, open_hub
from .test_pool import FULL, assert_pool_clean, make_pool

pytest.importorskip("ray")

from trio_swe.ray import AsyncioWorkerPool, WorkerPool


@FULL
@pytest.mark.parametrize("boot_ahead", [None, 0])
async def test_a_worker_boots_ahead_while_its_agents_run(
    ray_cluster: object, tmp_path: Path, boot_ahead: int | None
) -> None:
    # One worker, two agent slots. By default (boot_ahead = concurrency = 2) the next two
    # episodes boot and prepare their sandboxes while both agents are held at the gate; with
    # boot_ahead=0 the worker gets no third episode until an agent finishes.
    _, mds, _ = build_demo(tmp_path)
    ahead = 2 if boot_ahead is None else boot_ahead
    results: list[EpisodeResult] = []
    async with open_hub() as hub:
        pool = make_pool(
            tmp_path,
            "http://127.0.0.1:9",  # no policy: the gated agent asks none
            resources=[{"node_a": 1}],
            concurrency=2,
            boot_ahead=boot_ahead,
            config=demo_config(agent_time_budget_sec=600.0),  # held at the gate, in budget
            agent=functools.partial(GatedAgent, hub.port),
            backend=functools.partial(ReportingBackend, hub.port, str(tmp_path / "state")),
        )
        async with pool:
            assert [(w.concurrency, w.boot_ahead) for w in pool.workers] == [(2, ahead)]
            async with pool.rollouts(mds[:4], network=False) as stream:
                with trio.fail_after(300):  # a hang guard: without boot-ahead only two boot
                    await hub.wait_until(lambda: hub.agents == 2 and hub.boots == 2 + ahead)
                    # Every episode booting or waiting is in flight on the worker.
                    [worker] = pool.live_workers()
                    assert worker.running == 2 + ahead
                    [stats] = await pool.worker_statistics()
                    assert stats.running == 2 + ahead
                    assert (hub.agents, hub.boots) == (2, 2 + ahead)
                    hub.gate.set()
                    results = [r async for r in stream]
            await assert_pool_clean(pool, tmp_path, set())
    assert hub.peak == 2
    assert sorted(r.status for r in results) == ["completed"] * 4, [r.error for r in results]


@pytest.mark.parametrize("boot_ahead", [-1, 3])
def test_boot_ahead_outside_zero_to_concurrency_is_refused(boot_ahead: int) -> None:
    with pytest.raises(ConfigError, match="boot_ahead must be between 0 and concurrency"):
        WorkerPool(concurrency=2, boot_ahead=boot_ahead)
    with pytest.raises(ConfigError, match="boot_ahead must be between 0 and concurrency"):
        AsyncioWorkerPool(concurrency=2, boot_ahead=boot_ahead)
