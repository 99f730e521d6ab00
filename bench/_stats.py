"""Intervals for the benchmarks' ratios, by the bootstrap (no dependency beyond the stdlib).

On a shared VM one timing can swing by a third (a pure CPU loop here varied 0.33-0.57 s between
runs), so a ratio of two medians over a dozen runs each moves by several percent from one run
of the benchmark to the next. A percentile bootstrap says how far: resample the runs with
replacement, recompute the ratio, and take the middle 95 % of the results. A seeded generator
keeps the interval of a given set of timings the same from one printing to the next.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

#: Resamples per interval: a few thousand put the percentiles' own noise well below a percent.
REPS = 4000


def _interval(values: list[float], level: float) -> tuple[float, float]:
    values.sort()
    cut = (1.0 - level) / 2.0
    lo = values[round(cut * (len(values) - 1))]
    hi = values[round((1.0 - cut) * (len(values) - 1))]
    return lo, hi


def ratio_of_medians_ci(
    num: Sequence[float],
    den: Sequence[float],
    *,
    level: float = 0.95,
    reps: int = REPS,
    seed: int = 0,
) -> tuple[float, float]:
    """Interval of ``median(num) / median(den)``, each sample resampled on its own."""
    rng = random.Random(seed)
    out = [
        statistics.median(rng.choices(num, k=len(num)))
        / statistics.median(rng.choices(den, k=len(den)))
        for _ in range(reps)
    ]
    return _interval(out, level)


def paired_median_ci(
    ratios: Sequence[float], *, level: float = 0.95, reps: int = REPS, seed: int = 0
) -> tuple[float, float]:
    """Interval of the median of per-pair ratios (the pairs resampled whole)."""
    rng = random.Random(seed)
    out = [statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(reps)]
    return _interval(out, level)


def verdict(lo: float, hi: float, goal: float) -> str:
    """``"under"`` / ``"over"`` ``goal`` when the whole interval is, else ``"undecided"``."""
    if hi < goal:
        return "under"
    if lo > goal:
        return "over"
    return "undecided"
