"""One episode as one trainer row: the shape verl's agent loop and SkyRL's generator return.

Sans-IO and trainer-free (no verl or SkyRL import): :func:`to_trainer_row` turns an
:class:`~trio_swe.EpisodeResult` into a :class:`TrainerRow` (prompt ids, response ids, a loss
mask, rollout log-probs, the reward, a stop reason, metrics), which each adapter copies into its
trainer's own type. The rules, shared by both adapters:

* **One row per episode.** Both trainers take one sequence per rollout. An append-only agent (the
  bash agent) makes exactly one sample; an agent whose client rewrote its history (a CLI agent
  behind the gateway) can make several: the row carries the last one (the chain that reached the
  episode's end, so the reward belongs to it) and counts the others in ``dropped_samples``.
* **Lengths.** A response region longer than ``max_response_tokens`` is cut there (stop reason
  ``"length"``); a prompt longer than ``max_prompt_tokens`` cannot be trained at all and becomes
  a failed row with the permanent reason ``prompt_too_long``.
* **Failed rollouts.** An aborted episode (infrastructure: a sandbox that did not boot, a policy
  server that failed, ...) is never a row with a silent reward of 0: it becomes a placeholder of
  one context token (loss mask ``[0]``, so no gradient flows from it), ``aborted=True``,
  ``stop_reason="abort"`` and the reason, which each adapter surfaces in the trainer's own terms
  (see ``docs/trainers.md``). ``permanent`` says the row itself is at fault
  (:data:`PERMANENT_ABORT_REASONS`, or a :class:`~trio_swe.PermanentBootError`), so retrying it
  is pointless.
* An episode that ran but recorded no trained token (no policy call, or an agent that records
  none) is not a failure: a placeholder with the grader's reward and ``trained_tokens == 0``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from .._errors import PermanentBootError
from ..episode import EpisodeResult

__all__ = [
    "PERMANENT_ABORT_REASONS",
    "TrainerRow",
    "abort_text",
    "failed_row",
    "is_permanent_abort",
    "to_trainer_row",
]

#: Abort reasons that are properties of the row, not passing failures (retrying cannot help).
PERMANENT_ABORT_REASONS: frozenset[str] = frozenset({"unevaluable", "prompt_too_long", "metadata"})

#: The stop reasons of a row, in vLLM's (and SkyRL's) words.
STOP: Final = "stop"
LENGTH: Final = "length"
ABORT: Final = "abort"


class TrainerRow(msgspec.Struct, frozen=True, kw_only=True):
    """One episode as one trainer row (see the module's rules).

    Attributes:
        prompt_ids: the tokens before the response region.
        response_ids: the response region: the policy's tokens (loss 1) and the tool results
            and templates between them (loss 0).
        loss_mask: one 0/1 per response token.
        log_probs: one rollout log-prob per response token; 0.0 where no policy call sampled it.
        reward: the grader's reward (0.0 for an aborted episode, which ``aborted`` flags).
        stop_reason: ``"stop"``, ``"length"`` (truncated: a budget, a turn limit, a length cap)
            or ``"abort"`` (a failed rollout).
        aborted: the episode failed for infrastructure (or an unusable row): do not train on it.
        abort_reason: ``"<reason>:<error>"`` when aborted.
        permanent: the failure is the row's own (see :data:`PERMANENT_ABORT_REASONS`).
        num_turns: the agent's policy calls.
        trained_tokens: loss-1 tokens of the row.
        dropped_samples: the episode's other samples, not carried (see the module's rules).
        instance_id: the instance.
        episode_id: the episode (its policy calls' session id).
        metrics: numbers about the episode (seconds per phase, turns, reward, ...).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    log_probs: list[float]
    reward: float
    stop_reason: str
    aborted: bool = False
    abort_reason: str | None = None
    permanent: bool = False
    num_turns: int = 0
    trained_tokens: int = 0
    dropped_samples: int = 0
    instance_id: str = ""
    episode_id: str = ""
    metrics: dict[str, float] = msgspec.field(default_factory=dict)


def abort_text(result: EpisodeResult) -> str:
    """``"<reason>:<error>"`` of an aborted episode (slime's ``abort_reason`` too)."""
    return f"{result.abort_reason}:{result.error}"


def is_permanent_abort(reason: str, error: str | None = None) -> bool:
    """Whether an abort is the row's own fault: its reason (the part of ``"<reason>:<error>"``
    before ``:``) is in :data:`PERMANENT_ABORT_REASONS`, or the error is a
    :class:`~trio_swe.PermanentBootError` (a missing image, a commit that does not exist)."""
    head = reason.split(":", 1)[0]
    if head in PERMANENT_ABORT_REASONS:
        return True
    return (error or "").startswith(f"{PermanentBootError.__name__}:")


def _metrics(result: EpisodeResult) -> dict[str, float]:
    timings = msgspec.structs.asdict(result.timings)
    out = {f"time_{name}_sec": float(value) for name, value in timings.items()}
    out["turns"] = float(result.n_turns)
    out["reward"] = float(result.reward)
    out["aborted"] = 1.0 if result.status == "aborted" else 0.0
    out["truncated"] = 1.0 if result.status == "truncated" else 0.0
    out["boot_retries"] = float(result.boot_retries)
    return out


def _placeholder(
    result: EpisodeResult,
    pad_id: int,
    *,
    reward: float,
    stop_reason: str,
    abort_reason: str | None = None,
    permanent: bool = False,
    dropped: int = 0,
) -> TrainerRow:
    metrics = _metrics(result)
    if abort_reason is not None:
        metrics["aborted"] = 1.0
    return TrainerRow(
        prompt_ids=[pad_id],
        response_ids=[pad_id],
        loss_mask=[0],
        log_probs=[0.0],
        reward=reward,
        stop_reason=stop_reason,
        aborted=abort_reason is not None,
        abort_reason=abort_reason,
        permanent=permanent,
        num_turns=result.n_turns,
        dropped_samples=dropped,
        instance_id=result.instance_id,
        episode_id=result.episode_id,
        metrics=metrics,
    )


def failed_row(
    reason: str, *, pad_id: int, instance_id: str = "unknown", permanent: bool | None = None
) -> TrainerRow:
    """The failed row of a rollout that never became an episode (``reason`` as
    ``"<reason>:<error>"``, e.g. ``"metadata:..."`` for a row that does not read)."""
    if permanent is None:
        permanent = is_permanent_abort(reason)
    return TrainerRow(
        prompt_ids=[pad_id],
        response_ids=[pad_id],
        loss_mask=[0],
        log_probs=[0.0],
        reward=0.0,
        stop_reason=ABORT,
        aborted=True,
        abort_reason=reason,
        permanent=permanent,
        instance_id=instance_id,
        metrics={"aborted": 1.0},
    )


def to_trainer_row(
    result: EpisodeResult,
    *,
    pad_id: int,
    max_prompt_tokens: int | None = None,
    max_response_tokens: int | None = None,
) -> TrainerRow:
    """The trainer row of ``result`` (see the module's rules).

    Args:
        result: the episode.
        pad_id: the token of placeholders (the tokenizer's pad or end-of-text id).
        max_prompt_tokens: the trainer's prompt length; a longer prompt fails the row.
        max_response_tokens: the trainer's response length; a longer region is cut.
    """
    if result.status == "aborted":
        reason = abort_text(result)
        return _placeholder(
            result,
            pad_id,
            reward=0.0,
            stop_reason=ABORT,
            abort_reason=reason,
            permanent=is_permanent_abort(reason, result.error),
        )
    episode_stop = LENGTH if result.status == "truncated" else STOP
    if not result.samples:
        return _placeholder(result, pad_id, reward=result.reward, stop_reason=episode_stop)
    sample = result.samples[-1]
    dropped = len(result.samples) - 1
    tokens = sample.tokens_list()
    prompt = tokens[: sample.prompt_length]
    response = tokens[sample.prompt_length :]
    mask = sample.loss_mask_list()
    log_probs = sample.rollout_log_probs_list()
    if max_prompt_tokens is not None and len(prompt) > max_prompt_tokens:
        return _placeholder(
            result,
            pad_id,
            reward=0.0,
            stop_reason=ABORT,
            abort_reason=(
                f"prompt_too_long:the prompt has {len(prompt)} tokens, more than the "
                f"trainer's {max_prompt_tokens}"
            ),
            permanent=True,
            dropped=dropped,
        )
    stop = LENGTH if sample.status == "truncated" else episode_stop
    if max_response_tokens is not None and len(response) > max_response_tokens:
        response = response[:max_response_tokens]
        mask = mask[:max_response_tokens]
        log_probs = log_probs[:max_response_tokens]
        stop = LENGTH
    if not response:
        return _placeholder(result, pad_id, reward=result.reward, stop_reason=stop, dropped=dropped)
    trained = sum(mask)
    metrics = _metrics(result)
    metrics["trained_tokens"] = float(trained)
    metrics["dropped_samples"] = float(dropped)
    return TrainerRow(
        prompt_ids=prompt,
        response_ids=response,
        loss_mask=mask,
        log_probs=log_probs,
        reward=result.reward,
        stop_reason=stop,
        num_turns=result.n_turns,
        trained_tokens=trained,
        dropped_samples=dropped,
        instance_id=result.instance_id,
        episode_id=result.episode_id,
        metrics=metrics,
    )
