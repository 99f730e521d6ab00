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
from trio_swe.sandbox import exec_and_wait, open_sandbox
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
    for i in range(N + 1):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=workdir, env={**os.environ, **ENV}, capture_output=True, check=True)
        if i == 0:
            continue  # warm-up: page cache
        times.append(time.perf_counter() - t)
    return times


async def _gradings(
    backend: LocalBackend, calc: CalcRepo, row: dict[str, Any], protocol: str
) -> list[tuple[float, dict[str, float]]]:
    md = get_metadata(row, protocol)
    # Warm-up, untimed: the first swebench grading imports swebench (about a second).
    await run_evaluation(backend, md, calc.gold, timeout_sec=120)
    out: list[tuple[float, dict[str, float]]] = []
    for _ in range(N):
        t = time.perf_counter()
        r = await run_evaluation(backend, md, calc.gold, timeout_sec=120)
        wall = time.perf_counter() - t
        assert r.resolved, (r.reason, r.detail, r.log_tail[-500:])
        out.append((wall, dict(r.durations)))
    return out


async def _warm_sandbox_runs(backend: LocalBackend, calc: CalcRepo, n: int) -> list[float]:
    """The same test command through ``exec_and_wait`` in one already-booted, patched sandbox."""
    async with open_sandbox(backend, calc.image) as sb:
        for patch in (calc.test_patch, calc.gold):
            await sb.write_file("/tmp/p.diff", patch)
            assert (await sb.exec("git apply /tmp/p.diff")).ok
        times: list[float] = []
        for i in range(n + 1):
            t = time.perf_counter()
            r = await exec_and_wait(
                sb,
                "python -m pytest -rA -p no:cacheprovider tests/test_calc.py",
                time_budget_sec=120,
            )
            if i > 0:  # the first run is a warm-up
                times.append(time.perf_counter() - t)
            assert r.ok, r.output
        return times


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
        warm_med = statistics.median(trio.run(_warm_sandbox_runs, backend, calc, max(N // 2, 1)))
        cases = {
            "swebench (5.x row, eval script)": (calc.swebench_v5_row(), "swebench"),
            "scaleswe (f2p_script + P2P)": (calc.scaleswe_f2p_row(), "scaleswe"),
        }
        print(f"N = {N} runs each; medians; load average {os.getloadavg()[0]:.1f}")
        print(f"{'':34} {'wall s':>8} {'overhead s':>11} {'x bare':>7}   phases (median s)")
        print(f"{'bare test command (host)':34} {bare_med:8.3f} {'':>11} {1.0:7.2f}")
        print(
            f"{'same, warm sandbox, exec_and_wait':34} {warm_med:8.3f} "
            f"{warm_med - bare_med:11.3f} {warm_med / bare_med:7.2f}   (N/2 runs)"
        )
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
