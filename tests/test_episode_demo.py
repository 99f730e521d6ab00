"""End to end on the local backend: the demo set through the bash agent and the scripted policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe import EpisodeResult, run_episode, run_rollouts
from trio_swe.agents import BashAgent, parse_command
from trio_swe.demo import open_scripted_policy_server
from trio_swe.grading import InstanceMetadata
from trio_swe.policy import ByteTokenizer, SGLangPolicy

from .test_episode_support import (
    assert_nothing_left,
    assert_sample_matches_script,
    build_demo,
    demo_config,
    script_text,
)


@pytest.mark.slow
async def test_eight_demo_episodes_four_at_a_time(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    assert len(mds) == 8
    running = 0
    peak = 0

    def started(md: InstanceMetadata) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)

    results: dict[str, EpisodeResult] = {}
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer(), max_turns=10)
        async with run_rollouts(
            mds,
            agent,
            backend=backend,
            config=demo_config(),
            concurrency=4,
            boot_ahead=0,  # episodes, not only agents, four at a time
            network=False,
            on_start=started,
        ) as stream:
            async for result in stream:
                running -= 1
                results[result.instance_id] = result
    assert peak == 4
    assert sorted(results) == sorted(demo.expected_rewards)

    for iid, result in results.items():
        script = [script_text(c) for c in demo.scripts[iid]]
        assert result.status != "aborted", (iid, result.abort_reason, result.error)
        # Rewards are what the script does: fixed -> 1, not fixed -> 0.
        assert result.reward == demo.expected_rewards[iid], (iid, result.eval_result)
        assert result.eval_result is not None
        assert result.eval_result.resolved == (result.reward == 1.0)
        if iid in demo.timeouts:
            assert result.agent_exit_code == -1
            assert result.agent_finish == "time_budget"
            assert result.status == "truncated"
            assert result.n_turns == 1
            assert result.patch == b""
        else:
            assert result.agent_exit_code == 0
            assert result.agent_finish == "submitted"
            assert result.status == "completed"
            assert result.n_turns == len(script)
        # One clean chain per episode: one sample, the full reward, aligned masks/log-probs.
        assert len(result.samples) == 1
        sample = result.samples[0]
        assert sample.reward == result.reward
        assert sample.metadata["instance_id"] == iid
        turns = script[: result.n_turns]
        trained = [t for t in turns if parse_command(t) is not None]
        assert_sample_matches_script(sample, trained)
        prompt = bytes(sample.tokens_list()[: len(sample.tokens) - sample.response_length])
        assert f"Instance: {iid}\n".encode() in prompt
        assert result.boot_attempts == 2  # the agent's and the eval sandbox
        assert result.boot_retries == 0
        t = result.timings
        assert t.total >= t.boot + t.setup + t.agent + t.patch + t.eval

    # The ill-formed turn stays in place (as context, loss 0) and shifts nothing.
    median = results["demo__median-1"].samples[0]
    response = bytes(median.tokens_list()[-median.response_length :]).decode()
    assert response.startswith(script_text(demo.scripts["demo__median-1"][0]))
    # The agent's sed produced exactly the gold fix, as a binary-safe diff against the base.
    assert results["demo__calc-1"].patch_text == demo.gold_patches["demo__calc-1"]
    # Editing the tests instead of the code earns nothing: the grader has its own copy.
    assert "test_fizz.py" in results["demo__fizz-1"].patch_text
    assert results["demo__fizz-1"].reward == 0.0
    # Harness files never reach the patch.
    assert all("PROBLEM_STATEMENT.md" not in r.patch_text for r in results.values())
    assert_nothing_left(tmp_path, backend)


async def test_context_cap_bounds_samples_and_truncates_the_episode(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    calc = next(md for md in mds if md.instance_id == "demo__calc-1")
    cap = 1200  # room for the first prompt and a turn or two, not for the whole script
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer(), max_turns=10)
        config = demo_config(max_context_tokens=cap)
        result = await run_episode(calc, agent, backend=backend, config=config, network=False)
    assert result.status == "truncated", result.error
    assert result.agent_finish == "context_limit"
    assert result.agent_exit_code == 1
    # The last reply was cut to the room left (finish "length", no command): the run stops
    # there, graded on what was done by then (the fix was).
    assert result.n_turns == len(demo.scripts["demo__calc-1"])
    assert result.reward == 1.0
    assert result.samples
    assert all(len(s.tokens) <= cap for s in result.samples)
    assert result.samples[-1].status == "truncated"
    assert_nothing_left(tmp_path, backend)
