"""Episodes against the real engine: what a trainer receives is what vLLM sampled.

The demo instances run through the bash agent, speaking the tiny Qwen3's real chat template,
with every policy call passed through a recorder (the engine's replies as they came). Then, per
episode: the sample's tokens are the last prompt and its output; every sampled token is in it
exactly once, at its place, with the engine's log-prob; the loss mask is 1 exactly on the
sampled tokens of well-formed turns (ill-formed turns are kept as sampled and masked, as
docs/models.md says); and a re-score of every sampled token by the checkpoint's own weights in
torch gives the rollout log-prob back within 1e-3, at T = 1 and at T = 0.7.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from trio_swe import EpisodeResult, run_rollouts
from trio_swe.agents import BashAgent
from trio_swe.models import ChatModel
from trio_swe.policy import PolicyOutput, VLLMPolicy
from trio_swe.testing._engine import VLLMEngine
from trio_swe.testing._rescore import RescoreRequest, rescore

from ..test_episode_support import assert_nothing_left, build_demo, demo_config
from .test_vllm_policy import RESCORE_TOLERANCE


class Recorder:
    """A policy that passes every call to ``inner`` and keeps (prompt, output) per session,
    and the temperature of each call."""

    def __init__(self, inner: VLLMPolicy) -> None:
        self.inner = inner
        self.calls: dict[str, list[tuple[list[int], PolicyOutput]]] = defaultdict(list)
        self.temperatures: set[object] = set()

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        out = await self.inner.generate(input_ids, sampling_params, session_id=session_id)
        self.calls[session_id or ""].append((list(input_ids), out))
        self.temperatures.add(sampling_params.get("temperature"))
        return out


def check_episode(
    result: EpisodeResult,
    calls: list[tuple[list[int], PolicyOutput]],
    model: ChatModel,
    *,
    train_ill_formed: bool,
) -> tuple[list[int], list[tuple[int, float]]]:
    """Check one episode's sample against the engine's replies; return its tokens and its
    sampled (position, log-prob) pairs for the re-score."""
    assert calls, result.episode_id
    (sample,) = result.samples  # one append-only chain
    tokens = sample.tokens_list()
    last_prompt, last_out = calls[-1]
    assert tokens == last_prompt + last_out.output_ids
    start = len(tokens) - sample.response_length
    assert start == len(calls[0][0])  # the response region starts after the first prompt
    mask = sample.loss_mask_list()
    log_probs = sample.rollout_log_probs_list()
    expected_mask = [0] * sample.response_length
    sampled: list[tuple[int, float]] = []
    for prompt, out in calls:
        assert tokens[: len(prompt)] == prompt  # append-only: each prompt extends the last
        trained = 1 if train_ill_formed or not model.parse(out.output_ids).ill_formed else 0
        for i, (tid, lp) in enumerate(zip(out.output_ids, out.log_probs, strict=True)):
            pos = len(prompt) + i
            assert tokens[pos] == tid
            assert log_probs[pos - start] == pytest.approx(lp, abs=1e-6)
            expected_mask[pos - start] = trained
            sampled.append((pos, lp))
    assert mask == expected_mask
    assert len(sampled) == sum(len(out.output_ids) for _, out in calls)
    return tokens, sampled


@pytest.mark.parametrize(
    ("temperature", "ill_formed"), [(1.0, "train"), (0.7, "train"), (1.0, "mask")]
)
async def test_bash_agent_samples_are_what_the_engine_sampled(
    engine: VLLMEngine, checkpoint: Path, tmp_path: Path, temperature: float, ill_formed: str
) -> None:
    _, mds, backend = build_demo(tmp_path)
    model = ChatModel.from_checkpoint(checkpoint, tools=BashAgent.TOOLS)
    config = demo_config(agent_time_budget_sec=120.0, ill_formed_policy=ill_formed)
    async with VLLMPolicy(engine.url, vocab_size=len(model)) as vllm:
        recorder = Recorder(vllm)
        agent = BashAgent(
            recorder,
            model,
            max_turns=3,
            sampling_params={"max_new_tokens": 48, "temperature": temperature},
        )
        async with run_rollouts(
            mds, agent, backend=backend, config=config, concurrency=4, network=False
        ) as stream:
            results = [r async for r in stream]
    assert len(results) == len(mds)
    requests: list[RescoreRequest] = []
    positions: list[list[tuple[int, float]]] = []
    for result in results:
        assert result.status != "aborted", (result.abort_reason, result.error)
        calls = recorder.calls[result.episode_id]
        assert result.n_turns == len(calls)
        if ill_formed == "mask" and all(model.parse(out.output_ids).ill_formed for _, out in calls):
            # A random model calls no tool: every turn is context, and a sample that trains
            # nothing is dropped (docs/models.md).
            assert result.samples == []
            continue
        tokens, sampled = check_episode(
            result, calls, model, train_ill_formed=ill_formed == "train"
        )
        requests.append(RescoreRequest(tokens=tokens, temperature=temperature))
        positions.append(sampled)
    worst = 0.0
    scores = rescore(checkpoint, requests) if requests else []
    for scored, sampled in zip(scores, positions, strict=True):
        for pos, lp in sampled:
            worst = max(worst, abs(scored[pos] - lp))
    print(f"bash agent, T={temperature}, {ill_formed}: {sum(map(len, positions))} sampled tokens, "
          f"max |rollout - re-score| = {worst:.2e}")  # fmt: skip
    assert worst <= RESCORE_TOLERANCE
    assert (len(requests) > 0) == (ill_formed == "train")
    assert_nothing_left(tmp_path, backend)
