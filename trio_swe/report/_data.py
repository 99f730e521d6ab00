"""The report's data, from results alone (sans-IO): one row per episode, and the trajectories
of the episodes to drill into."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ..episode import EpisodeResult
from ..trajectories import Message, TurnText, episode_messages

__all__ = ["PHASES", "EpisodeRow", "ReportData", "report_data"]

#: The phases the report plots, in the order of an episode (``overhead`` is derived).
PHASES = (
    "boot",
    "setup",
    "agent",
    "agent_policy",
    "agent_commands",
    "patch",
    "kill",
    "eval",
    "eval_tests",
    "samples",
    "overhead",
    "total",
)


class EpisodeRow(msgspec.Struct, kw_only=True):
    """One episode as the report shows it.

    Attributes:
        index: its position in the results file (the order episodes finished in).
        group: its GRPO group (``group_id`` when the results carry it, else the instance id).
        outcome: ``completed``, ``truncated``, or ``aborted: <reason>``.
        tokens: tokens of its samples (prompt and response regions).
        trained_tokens: loss-1 tokens of its samples.
        finished_at: seconds from the first episode's start to this one's end (None when the
            results carry no start times).
        phases: seconds per phase (:data:`PHASES`).
        drill: its trajectory is in the report.
    """

    index: int
    instance_id: str
    episode_id: str
    group: str
    group_index: int | None
    status: str
    abort_reason: str | None
    error: str | None
    outcome: str
    reward: float
    resolved: bool | None
    eval_reason: str | None
    n_turns: int
    n_samples: int
    tokens: int
    trained_tokens: int
    finished_at: float | None
    phases: dict[str, float]
    drill: bool = False


class ReportData(msgspec.Struct, kw_only=True):
    """Everything the page shows: the rows, and the drilled-into episodes' details.

    ``episodes`` maps an episode id to its details: ``messages`` (see
    :func:`~trio_swe.trajectories.episode_messages`), ``patch``, ``agent_output``.
    """

    title: str
    rows: list[EpisodeRow]
    episodes: dict[str, dict[str, Any]]
    tokenizer: str | None
    omitted_trajectories: int


def report_data(
    results: Sequence[EpisodeResult],
    *,
    title: str = "trio-swe run",
    text: TurnText | None = None,
    tokenizer: str | None = None,
    max_trajectories: int = 500,
) -> ReportData:
    """The report of ``results`` (in file order).

    The first ``max_trajectories`` episodes carry their trajectories (decoded by ``text`` when
    given, token ids otherwise): a page holds every token of what it embeds, so a run of
    thousands of long episodes embeds a bounded part. ``tokenizer`` names ``text`` on the page.
    """
    starts = [r.started_at for r in results if r.started_at is not None]
    t0 = min(starts) if starts else None
    rows: list[EpisodeRow] = []
    episodes: dict[str, dict[str, Any]] = {}
    omitted = 0
    for i, r in enumerate(results):
        t = r.timings
        phases = {p: float(getattr(t, p)) for p in PHASES}
        ev = r.eval_result
        drill = len(episodes) < max_trajectories and r.episode_id not in episodes
        if drill:
            messages: list[Message] = episode_messages(r, text)
            episodes[r.episode_id] = {
                "messages": msgspec.to_builtins(messages),
                "patch": r.patch_text,
                "agent_output": r.agent_output,
                "eval_detail": ev.detail if ev is not None else None,
                "log_tail": ev.log_tail if ev is not None else None,
            }
        else:
            omitted += 1
        rows.append(
            EpisodeRow(
                index=i,
                instance_id=r.instance_id,
                episode_id=r.episode_id,
                # GRPO groups; results written before groups existed: the instance.
                group=r.group,
                group_index=r.group_index if r.group_id else None,
                status=r.status,
                abort_reason=r.abort_reason,
                error=r.error,
                outcome=f"aborted: {r.abort_reason}" if r.status == "aborted" else r.status,
                reward=r.reward,
                resolved=ev.resolved if ev is not None else None,
                eval_reason=ev.reason if ev is not None else None,
                n_turns=r.n_turns,
                n_samples=len(r.samples),
                tokens=sum(len(s.tokens) for s in r.samples),
                trained_tokens=sum(s.num_trained_tokens() for s in r.samples),
                finished_at=(
                    r.started_at - t0 + t.total
                    if r.started_at is not None and t0 is not None
                    else None
                ),
                phases=phases,
                drill=drill,
            )
        )
    return ReportData(
        title=title,
        rows=rows,
        episodes=episodes,
        tokenizer=tokenizer,
        omitted_trajectories=omitted,
    )
