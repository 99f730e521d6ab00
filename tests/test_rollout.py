"""run_rollouts: streaming, early exit, cancellation at a random moment."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_swe import EpisodeResult, run_rollouts
from trio_swe.agents import BashAgent
from trio_swe.demo import open_scripted_policy_server
from trio_swe.policy import ByteTokenizer, SGLangPolicy

from .test_episode_support import assert_nothing_left, build_demo, demo_config


@pytest.mark.parametrize(("seed", "low", "high"), [(7, 0.05, 0.6), (11, 1.0, 5.0)])
async def test_cancelling_twenty_episodes_at_a_random_moment_leaves_nothing(
    tmp_path: Path, seed: int, low: float, high: float
) -> None:
    demo, mds, backend = build_demo(tmp_path)
    instances = (mds * 3)[:20]
    moment = random.Random(seed).uniform(low, high)
    finished: list[EpisodeResult] = []
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        with trio.move_on_after(moment) as scope:
            async with run_rollouts(
                instances, agent, backend=backend, config=demo_config(), concurrency=8
            ) as stream:
                async for result in stream:
                    finished.append(result)
        assert scope.cancelled_caught, f"all 20 finished before {moment:.2f}s"
        await trio.testing.wait_all_tasks_blocked()
        assert server.statistics().active == 0
    assert len(finished) < 20
    assert all(r.status != "aborted" for r in finished)
    assert_nothing_left(tmp_path, backend)


async def test_leaving_early_cancels_the_rest(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        async with run_rollouts(
            mds, agent, backend=backend, config=demo_config(), concurrency=3, network=False
        ) as stream:
            first = await stream.receive()
    assert first.status in ("completed", "truncated")
    assert_nothing_left(tmp_path, backend)
