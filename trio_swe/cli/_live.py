"""A run's live figures (sans-IO): rate, ETA, counts per status and abort reason, reward mean,
tokens per episode, p50/p95 per phase. The display (:mod:`._progress`) only renders them."""

from __future__ import annotations

import collections
import math
from collections.abc import Sequence

from ..episode import EpisodeResult
from ..grading import InstanceMetadata

__all__ = ["PHASES", "LiveStats", "percentile"]

#: The phases whose p50/p95 are shown (seconds; see :class:`~trio_swe.episode.PhaseTimings`).
PHASES = ("boot", "setup", "agent", "eval", "total")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values``, nearest rank; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


class LiveStats:
    """Counts and figures of a run so far; times are given by the caller (a clock in seconds).

    Args:
        total: episodes the run will have when it ends.
        started: the clock's reading when the run started.
    """

    def __init__(self, total: int, started: float) -> None:
        self.total = total
        self.started = started
        self.running = 0
        self.done = 0
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.rewards: list[float] = []
        self.tokens: list[int] = []
        self.phases: dict[str, list[float]] = {p: [] for p in PHASES}

    def on_start(self, md: InstanceMetadata) -> None:
        self.running += 1

    def on_result(self, result: EpisodeResult) -> None:
        self.running = max(0, self.running - 1)
        self.done += 1
        if result.status == "aborted":
            self.outcomes[f"aborted: {result.abort_reason}"] += 1
        else:
            self.outcomes[result.status] += 1
            self.rewards.append(result.reward)
            self.tokens.append(sum(len(s.tokens) for s in result.samples))
        for phase in PHASES:
            self.phases[phase].append(float(getattr(result.timings, phase)))

    # -- figures ----------------------------------------------------------------------------------
    @property
    def aborted(self) -> int:
        return sum(n for k, n in self.outcomes.items() if k.startswith("aborted"))

    @property
    def resolved(self) -> int:
        return sum(1 for r in self.rewards if r > 0)

    def per_minute(self, now: float) -> float:
        """Episodes finished per minute since the start."""
        elapsed = now - self.started
        return self.done / elapsed * 60.0 if elapsed > 0 else 0.0

    def eta_sec(self, now: float) -> float | None:
        """Seconds until the last episode at today's rate; None before the first one."""
        rate = self.per_minute(now)
        if rate <= 0:
            return None
        return (self.total - self.done) / rate * 60.0

    def reward_mean(self) -> float | None:
        return sum(self.rewards) / len(self.rewards) if self.rewards else None

    def tokens_per_episode(self) -> float | None:
        return sum(self.tokens) / len(self.tokens) if self.tokens else None

    # -- text -------------------------------------------------------------------------------------
    def lines(self, now: float) -> list[str]:
        """Three lines: progress and rate; outcomes; phases."""
        eta = self.eta_sec(now)
        mean = self.reward_mean()
        tokens = self.tokens_per_episode()
        head = (
            f"[{_duration(now - self.started)}] done {self.done}/{self.total}, running "
            f"{self.running} | {self.per_minute(now):.1f} episodes/min, ETA "
            f"{'-' if eta is None else _duration(eta)} | reward mean "
            f"{'-' if mean is None else f'{mean:.3f}'} (resolved {self.resolved}) | tokens/episode "
            f"{'-' if tokens is None else f'{tokens:,.0f}'}"
        )
        outcomes = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items())) or "-"
        phases = " ".join(
            f"{p} {percentile(v, 50):.1f}/{percentile(v, 95):.1f}" for p, v in self.phases.items()
        )
        return [head, f"outcomes: {outcomes}", f"p50/p95 s: {phases}"]

    def line(self, now: float) -> str:
        """The figures on one line (a pipe or a log file)."""
        return " | ".join(self.lines(now))


def _duration(sec: float) -> str:
    sec = max(0.0, sec)
    if sec < 60:
        return f"{sec:.0f}s"
    if sec < 3600:
        return f"{sec // 60:.0f}m{sec % 60:02.0f}s"
    return f"{sec // 3600:.0f}h{sec % 3600 // 60:02.0f}m"
