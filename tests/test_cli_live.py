"""A run you can watch (issue 26 item 4, the live part): the figures, and a plain line every N
seconds when the output is not a terminal."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

from trio_swe import EpisodeResult
from trio_swe.cli._live import LiveStats, percentile
from trio_swe.episode import PhaseTimings

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")


def _result(status: str, reward: float, total: float, reason: str | None = None) -> EpisodeResult:
    return EpisodeResult(
        instance_id="i",
        episode_id="i#1",
        protocol="scaleswe",
        status=status,  # type: ignore[arg-type]
        abort_reason=reason,  # type: ignore[arg-type]
        reward=reward,
        timings=PhaseTimings(boot=1.0, total=total),
    )


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile([], 50) == 0.0
    assert percentile([3.0], 95) == 3.0


def test_the_figures_of_a_run_so_far() -> None:
    stats = LiveStats(total=10, started=100.0)
    assert stats.eta_sec(100.0) is None
    for r in (
        _result("completed", 1.0, 10.0),
        _result("completed", 0.0, 20.0),
        _result("truncated", 0.0, 30.0),
        _result("aborted", 0.0, 40.0, "boot_failed"),
    ):
        stats.on_result(r)
    now = 100.0 + 120.0  # 4 episodes in 2 minutes
    assert stats.per_minute(now) == 2.0
    assert stats.eta_sec(now) == 6 / 2.0 * 60.0
    assert stats.reward_mean() == 1.0 / 3  # aborted episodes left out
    line = stats.line(now)
    assert "done 4/10" in line
    assert "2.0 episodes/min, ETA 3m00s" in line
    assert "aborted: boot_failed 1, completed 2, truncated 1" in line
    assert "total 20.0/40.0" in line  # p50/p95 of 10, 20, 30, 40


async def test_a_piped_run_prints_its_figures_every_n_seconds(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "80"}
    with trio.fail_after(300):  # a hang guard only
        proc = await trio.run_process(
            [TRIO_SWE, "demo", "--progress-every", "0.5"],
            cwd=str(tmp_path),
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    out = proc.stdout.decode()
    assert proc.returncode == 0, out + proc.stderr.decode()
    figures = [line for line in out.splitlines() if " episodes/min, ETA " in line]
    # The demo lasts seconds (one instance outlives its 5 s budget): lines came meanwhile, each
    # whole on one line however narrow the console.
    assert len(figures) >= 3, out
    assert any("done 0/8" in f or "done 1/8" in f or "done 7/8" in f for f in figures[:-1]), out
    last = figures[-1]
    assert "done 8/8" in last, out
    assert "outcomes: completed 7, truncated 1" in last, out
    assert "p50/p95 s: boot " in last, out
    assert "tokens/episode " in last, out
