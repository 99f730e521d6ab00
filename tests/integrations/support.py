"""What the verl and SkyRL adapter tests share: the episode configuration, the check of a row
against the engine's replies, and the re-score of its trained tokens."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from trio_swe.config import SweConfig, replace_option
from trio_swe.sandbox import Backend
from trio_swe.testing._rescore import RescoreRequest, rescore

from ..engine.test_vllm_policy import RESCORE_TOLERANCE
from ..test_episode_support import demo_config

__all__ = [
    "RESCORE_TOLERANCE",
    "Call",
    "check_row",
    "rescore_worst",
    "sandboxes_live",
    "swe_config",
]

#: One engine call as the trainer's handle saw it: prompt ids, output ids, their log-probs.
Call = tuple[list[int], list[int], list[float]]


def swe_config(checkpoint: Path, *, max_new_tokens: int = 48) -> SweConfig:
    """The demo budgets, the bash agent on the checkpoint's template, short turns; every
    sampled turn trained (a random model's turns are all ill-formed: masked, nothing would be
    left to check)."""
    config = demo_config(agent_time_budget_sec=300.0, max_turns=3, ill_formed_policy="train")
    config = replace_option(config, "bash.tokenizer", str(checkpoint))
    return replace_option(config, "policy.max_new_tokens", max_new_tokens)


async def sandboxes_live(backend: Backend, n: int = 1, timeout: float = 120.0) -> None:
    """Wait (from asyncio) until ``backend`` holds at least ``n`` live sandboxes.

    An episode sends its agent's first policy call while its sandbox boots, so a trainer's
    handle being called says nothing about the sandbox. The backend runs in trio's thread and
    signals nothing across, so this polls its statistics (bounded)."""
    deadline = time.monotonic() + timeout
    while backend.statistics().live < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {n} live sandboxes within {timeout} s")
        await asyncio.sleep(0.02)


def check_row(
    prompt: Sequence[int],
    response: Sequence[int],
    mask: Sequence[int],
    log_probs: Sequence[float],
    calls: Sequence[Call],
) -> list[tuple[int, float]]:
    """The row is the episode's one chain as the engine sampled it: the first call's prompt,
    then every output at its place with the engine's log-prob and loss 1, everything else loss
    0 and log-prob 0. Returns the sampled (position, log-prob) pairs."""
    assert calls
    tokens = [*prompt, *response]
    assert list(prompt) == calls[0][0]
    last_prompt, last_out, _ = calls[-1]
    assert tokens == last_prompt + last_out
    assert len(mask) == len(log_probs) == len(response)
    start = len(prompt)
    expected_mask = [0] * len(response)
    sampled: list[tuple[int, float]] = []
    for call_prompt, out, lps in calls:
        assert tokens[: len(call_prompt)] == call_prompt  # append-only
        for i, (tid, lp) in enumerate(zip(out, lps, strict=True)):
            pos = len(call_prompt) + i
            assert tokens[pos] == tid
            assert abs(log_probs[pos - start] - lp) <= 1e-6
            expected_mask[pos - start] = 1
            sampled.append((pos, lp))
    assert list(mask) == expected_mask
    for m, lp in zip(mask, log_probs, strict=True):
        if not m:
            assert lp == 0.0
    return sampled


def rescore_worst(
    checkpoint: Path,
    rows: Sequence[tuple[list[int], list[tuple[int, float]]]],
    temperature: float,
) -> float:
    """max |rollout log-prob - the checkpoint's own re-score| over every sampled token."""
    requests = [RescoreRequest(tokens=tokens, temperature=temperature) for tokens, _ in rows]
    worst = 0.0
    for scored, (_, sampled) in zip(rescore(checkpoint, requests), rows, strict=True):
        for pos, lp in sampled:
            worst = max(worst, abs(scored[pos] - lp))
    return worst
