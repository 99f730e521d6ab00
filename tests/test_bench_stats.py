"""The benchmarks' bootstrap intervals (bench/_stats.py): they hold the estimate, tighten with
more runs, and the verdict against a goal is only given when the whole interval agrees."""

from __future__ import annotations

import random
import statistics

from bench._stats import paired_median_ci, ratio_of_medians_ci, verdict


def _noisy(center: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [center * rng.uniform(0.7, 1.4) for _ in range(n)]


def test_interval_holds_the_ratio_and_narrows_with_more_runs() -> None:
    widths = []
    for n in (9, 81):
        num, den = _noisy(1.08, n, 1), _noisy(1.0, n, 2)
        lo, hi = ratio_of_medians_ci(num, den)
        assert lo <= statistics.median(num) / statistics.median(den) <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0] / 2


def test_interval_is_repeatable_and_exact_without_noise() -> None:
    num, den = _noisy(1.2, 15, 3), _noisy(1.0, 15, 4)
    assert ratio_of_medians_ci(num, den) == ratio_of_medians_ci(num, den)
    assert ratio_of_medians_ci([2.0] * 5, [1.0] * 5) == (2.0, 2.0)
    assert paired_median_ci([1.05] * 7) == (1.05, 1.05)
    ratios = [1.0, 1.02, 1.04, 1.3, 1.06]
    lo, hi = paired_median_ci(ratios)
    assert min(ratios) <= lo <= statistics.median(ratios) <= hi <= max(ratios)


def test_verdict_needs_the_whole_interval() -> None:
    assert verdict(1.02, 1.09, 1.1) == "under"
    assert verdict(1.11, 1.2, 1.1) == "over"
    assert verdict(1.05, 1.12, 1.1) == "undecided"


def test_the_floor_runs_the_eval_script_up_to_its_tests_only() -> None:
    """bench_grading's floor times the eval script's own lines before the tests: cut at the
    start marker's shell line, never at the same text inside the test patch's here-document."""
    from bench.bench_grading import START_TEST_OUTPUT, before_tests

    script = (
        "#!/bin/bash\nset -uxo pipefail\ngit status\n"
        "git apply -v - <<'EOF_1'\n+print(': \\'" + START_TEST_OUTPUT + "\\'')\nEOF_1\n"
        f": '{START_TEST_OUTPUT}'\npytest -rA tests\n: '>>>>> End Test Output'\n"
    )
    pre = before_tests(script)
    assert pre is not None
    assert pre.endswith("EOF_1\n")  # the here-document's line did not cut it
    assert "pytest" not in pre
    assert before_tests("git status\npytest\n") is None
