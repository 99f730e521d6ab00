"""Grading overhead on the local backend, beside the bare cost of the test command.

A grading = fresh sandbox + patch ladder + test run + parse + kill. The baseline is the same test
command run alone (a host subprocess in a checkout of the same repository), measured in the same
run. Overhead = grading wall time - baseline; medians over ``BENCH_GRADING_N`` (default 20)
gradings per protocol.

Run: ``python -m bench grading`` (or ``nox -s bench -- grading``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from trio_swe.grading import get_metadata, local_backend_shims, run_evaluation
from trio_swe.sandbox.local import LocalBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.grading._calc import CalcRepo, build_calc_repo

N = int(os.environ.get("BENCH_GRADING_N", "20"))
ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PY_COLORS": "0", "NO_COLOR": "1"}


def _bare_test_runs(calc: CalcRepo, workdir: Path) -> list[float]:
    """The graded test command alone: pytest on the patched, test-patched checkout."""
    subprocess.run(["git", "clone", "-q", str(calc.path), str(workdir)], check=True)
    subprocess.run(["git", "-C", str(workdir), "checkout", "-q", calc.base], check=True)
    for patch in (calc.test_patch, calc.gold):
        subprocess.run(["git", "-C", str(workdir), "apply", "-"], input=patch.encode(), check=True)
    cmd = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_calc.py"]
    times = []
    for _ in range(N):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=workdir, env={**os.environ, **ENV}, capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    return times


async def _gradings(
    backend: LocalBackend, calc: CalcRepo, row: dict[str, Any], protocol: str
) -> list[tuple[float, dict[str, float]]]:
    md = get_metadata(row, protocol)
    out: list[tuple[float, dict[str, float]]] = []
    for _ in range(N):
        t = time.perf_counter()
        r = await run_evaluation(backend, md, calc.gold, timeout_sec=120)
        wall = time.perf_counter() - t
        assert r.resolved, (r.reason, r.detail, r.log_tail[-500:])
        out.append((wall, dict(r.durations)))
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_grading_"))
    try:
        calc = build_calc_repo(tmp / "src")
        kw = local_backend_shims()
        backend = LocalBackend(
            ro_binds=kw["ro_binds"], extra_path=kw["extra_path"], env={**kw["env"], **ENV}
        )
        bare = _bare_test_runs(calc, tmp / "bare")
        bare_med = statistics.median(bare)
        cases = {
            "swebench (5.x row, eval script)": (calc.swebench_v5_row(), "swebench"),
            "scaleswe (f2p_script + P2P)": (calc.scaleswe_f2p_row(), "scaleswe"),
        }
        print(f"N = {N} runs each; medians; load average {os.getloadavg()[0]:.1f}")
        print(f"{'':34} {'wall s':>8} {'overhead s':>11} {'x bare':>7}   phases (median s)")
        print(f"{'bare test command (host)':34} {bare_med:8.3f} {'':>11} {1.0:7.2f}")
        for name, (row, protocol) in cases.items():
            runs = trio.run(_gradings, backend, calc, row, protocol)
            wall = statistics.median(w for w, _ in runs)
            phases = {
                k: statistics.median(d.get(k, 0.0) for _, d in runs)
                for k in ("boot", "setup", "apply", "tests", "parse")
                if any(k in d for _, d in runs)
            }
            shown = " ".join(f"{k}={v:.3f}" for k, v in phases.items())
            print(f"{name:34} {wall:8.3f} {wall - bare_med:11.3f} {wall / bare_med:7.2f}   {shown}")
        print(
            "overhead = grading wall - bare test command; the 'tests' phase holds the command's "
            "own run plus exec_and_wait's detached launch and wait"
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
