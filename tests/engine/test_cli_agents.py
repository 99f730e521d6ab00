"""The five real CLI agents through the recording gateway against the real engine: every token
vLLM sampled for a CLI's request is in the episode's samples exactly once, trained, with the
engine's log-prob, and the checkpoint's own weights give that log-prob back within 1e-3.

A random model calls no tool, so each CLI usually ends after its first reply (a plain answer):
the proof is about the tokens, not the task. The CLIs' first prompts reach ~18k tokens, which
the engine serves (``--max-model-len 40960``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trio_swe import EpisodeResult, run_episode
from trio_swe.agents._cli import CliAgent
from trio_swe.agents._install import ensure_installed
from trio_swe.models import load_tokenizer
from trio_swe.policy import PolicyOutput, VLLMPolicy
from trio_swe.testing._engine import VLLMEngine
from trio_swe.testing._rescore import RescoreRequest, rescore

from ..test_episode_support import assert_nothing_left, build_demo, demo_config
from .test_episodes import Recorder
from .test_vllm_policy import RESCORE_TOLERANCE

#: Claude Code is installed by scripts/bootstrap; TRIO_SWE_ENGINE_AGENTS=all runs all five.
AGENTS = (
    ["claude-code", "codex", "mini-swe-agent", "opencode", "qwen-code"]
    if os.environ.get("TRIO_SWE_ENGINE_AGENTS", "all") == "all"
    else os.environ["TRIO_SWE_ENGINE_AGENTS"].split(",")
)


def sampled_once(
    result: EpisodeResult, calls: list[tuple[list[int], PolicyOutput]], temperature: float
) -> tuple[list[tuple[RescoreRequest, list[tuple[int, float]]]], int]:
    """Check that each call's output is trained at most once, in place, with its log-probs;
    return, per sample, its re-score request and its trained (position, log-prob) pairs, and
    how many calls are in no sample (side requests: docs/gateway.md)."""
    found: dict[int, list[tuple[int, float]]] = {}
    nowhere = 0
    for k, (prompt, out) in enumerate(calls):
        homes = []
        for s, sample in enumerate(result.samples):
            tokens = sample.tokens_list()
            start = len(tokens) - sample.response_length
            end = len(prompt) + len(out.output_ids)
            if len(prompt) < start or tokens[: len(prompt)] != prompt or end > len(tokens):
                continue
            if tokens[len(prompt) : end] != out.output_ids:
                continue
            mask = sample.loss_mask_list()[len(prompt) - start : end - start]
            if any(mask):
                assert all(mask), (k, s)
                lps = sample.rollout_log_probs_list()[len(prompt) - start : end - start]
                assert lps == pytest.approx(out.log_probs, abs=1e-6)
                homes.append(s)
                found.setdefault(s, []).extend(
                    zip(range(len(prompt), end), out.log_probs, strict=True)
                )
        assert len(homes) <= 1, (k, homes)
        nowhere += not homes
    return [
        (RescoreRequest(tokens=result.samples[s].tokens_list(), temperature=temperature), pairs)
        for s, pairs in found.items()
    ], nowhere


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("agent", AGENTS)
async def test_cli_agent_samples_are_what_the_engine_sampled(
    engine: VLLMEngine, checkpoint: Path, tmp_path: Path, agent: str, temperature: float
) -> None:
    await ensure_installed(agent)
    _, mds, backend = build_demo(tmp_path)
    md = next(m for m in mds if m.instance_id == "demo__calc-1")
    tokenizer = load_tokenizer(checkpoint)
    async with VLLMPolicy(engine.url, vocab_size=len(tokenizer)) as vllm:
        recorder = Recorder(vllm)
        cli = CliAgent(agent, policy=recorder, tokenizer=tokenizer)
        result = await run_episode(
            md,
            cli,
            backend=backend,
            config=demo_config(
                agent_time_budget_sec=240.0, max_context_tokens=40960, ill_formed_policy="train"
            ),
            sampling_params={"max_new_tokens": 48, "temperature": temperature},
        )
    assert result.status != "aborted", (result.abort_reason, result.error, result.agent_output)
    calls = [c for session in recorder.calls.values() for c in session]
    assert calls
    assert recorder.temperatures == {temperature}  # the run's, whatever the CLI asks for
    side = cli.last_session.statistics().side_turns
    # Requests without tools (opencode's title) are side chains: served, never trained.
    assert result.n_turns + side == len(calls)
    pairs, nowhere = sampled_once(result, calls, temperature)
    assert nowhere == side
    scores = rescore(checkpoint, [request for request, _ in pairs])
    worst = max(
        abs(scored[pos] - lp)
        for scored, (_, sampled) in zip(scores, pairs, strict=True)
        for pos, lp in sampled
    )
    trained = sum(len(sampled) for _, sampled in pairs)
    longest = max(len(prompt) for prompt, _ in calls)
    print(f"{agent} T={temperature}: {result.n_turns} turns (+{side} side), {trained} trained tokens, prompts up to {longest} "
          f"tokens, max |rollout - re-score| = {worst:.2e}")  # fmt: skip
    assert worst <= RESCORE_TOLERANCE
    assert_nothing_left(tmp_path, backend)
