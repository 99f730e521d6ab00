"""run_rollouts: streaming, early exit, cancellation at a random moment; the results file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_swe import EpisodeResult, run_rollouts
from trio_swe.agents import BashAgent, ByteTokenizer, SGLangPolicy
from trio_swe.rollout import ResultsWriter, encode_result, read_results
from trio_swe.testing import open_scripted_policy_server

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
        assert server.statistics()["active"] == 0
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


def _result(iid: str, status: str = "completed", reward: float = 1.0) -> EpisodeResult:
    from trio_swe import Sample

    sample = Sample.from_lists(
        tokens=[1, 2, 3, 4, 5],
        loss_mask=[0, 1, 1],
        rollout_log_probs=[0.0, -0.5, -0.25],
        response_length=3,
        reward=reward,
    )
    return EpisodeResult(
        instance_id=iid,
        episode_id=f"{iid}#1",
        protocol="scaleswe",
        status=status,  # type: ignore[arg-type]
        reward=reward,
        samples=[sample],
        patch="diff --git a/x b/x\n",
    )


def test_results_file_round_trip_and_resume_after_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "results.msgpack"
    with ResultsWriter(path) as writer:
        assert writer.previous == []
        for i in range(3):
            writer.write(_result(f"i{i}"))
    # A writer killed mid-frame leaves a torn frame at the end.
    torn = encode_result(_result("torn"))
    with open(path, "ab") as f:
        f.write(torn[: len(torn) // 2])
    results, intact = read_results(path)
    assert [r.instance_id for r in results] == ["i0", "i1", "i2"]
    assert intact < path.stat().st_size
    with ResultsWriter(path) as writer:
        assert [r.instance_id for r in writer.previous] == ["i0", "i1", "i2"]
        writer.write(_result("i3", status="aborted", reward=0.0))
    results, intact = read_results(path)
    assert intact == path.stat().st_size
    assert [r.instance_id for r in results] == ["i0", "i1", "i2", "i3"]
    assert results[0].samples == _result("i0").samples
    assert results[0].samples[0].rollout_log_probs_list() == [0.0, -0.5, -0.25]
    assert results[3].status == "aborted"
    assert read_results(tmp_path / "missing.msgpack") == ([], 0)
