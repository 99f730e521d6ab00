"""Grading overhead on the local backend, beside the bare cost of the graded test command.

A grading = fresh sandbox + patch ladder + test run + parse + kill (``run_evaluation``). Its
baseline is the very command the grader runs (the SWE-bench eval script; the f2p pytest run), run
alone in an already booted and patched sandbox through ``exec_and_wait``, in the same run.
Overhead = grading wall time - baseline; medians over ``BENCH_GRADING_N`` (default 20) gradings
per protocol (baselines: N/2 runs). The test command on the host, outside any sandbox, is shown
for reference.

Run: ``python -m bench grading`` (or ``nox -s bench -- grading``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from trio_swe.grading import InstanceMetadata, get_metadata, local_backend_shims, run_evaluation
from trio_swe.grading._swebench_api import build_test_spec
from trio_swe.sandbox import exec_and_wait, open_sandbox
from trio_swe.sandbox.local import LocalBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.grading._calc import F2P_SCRIPT, P2P, CalcRepo, build_calc_repo

N = int(os.environ.get("BENCH_GRADING_N", "20"))
ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PY_COLORS": "0", "NO_COLOR": "1", "TERM": "dumb"}


def _host_runs(calc: CalcRepo, workdir: Path, n: int) -> list[float]:
    """pytest on a patched host checkout, no sandbox at all."""
    subprocess.run(["git", "clone", "-q", str(calc.path), str(workdir)], check=True)
    subprocess.run(["git", "-C", str(workdir), "checkout", "-q", calc.base], check=True)
    for patch in (calc.test_patch, calc.gold):
        subprocess.run(["git", "-C", str(workdir), "apply", "-"], input=patch.encode(), check=True)
    cmd = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_calc.py"]
    times = []
    for i in range(n + 1):
        t = time.perf_counter()
        subprocess.run(cmd, cwd=workdir, env={**os.environ, **ENV}, capture_output=True, check=True)
        if i:  # the first run warms the page cache
            times.append(time.perf_counter() - t)
    return times


async def _baseline_runs(
    backend: LocalBackend, calc: CalcRepo, md: InstanceMetadata, n: int
) -> list[float]:
    """The grader's own test command, alone, in one booted sandbox with the gold patch."""
    async with open_sandbox(backend, calc.image) as sb:
        await sb.write_file("/tmp/gold.diff", calc.gold)
        assert (await sb.exec("git apply /tmp/gold.diff")).ok
        if md.protocol == "swebench":
            await sb.write_file("/tmp/eval.sh", build_test_spec(md).eval_script)
            cmd = "bash /tmp/eval.sh > /tmp/eval.log 2>&1"
        else:
            await sb.write_file("/testbed/test_fail_to_pass.py", F2P_SCRIPT)
            ids = " ".join(shlex.quote(t) for t in ("test_fail_to_pass.py", *P2P))
            cmd = f"python -m pytest -rA -p no:cacheprovider {ids} > /tmp/f2p.log 2>&1"
        times: list[float] = []
        for i in range(n + 1):
            t = time.perf_counter()
            r = await exec_and_wait(sb, cmd, time_budget_sec=120, user="root", env=ENV)
            if i:  # the first run is a warm-up
                times.append(time.perf_counter() - t)
            assert r.ok, r.output
        return times


async def _gradings(
    backend: LocalBackend, calc: CalcRepo, md: InstanceMetadata
) -> list[tuple[float, dict[str, float]]]:
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


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_grading_"))
    try:
        calc = build_calc_repo(tmp / "src")
        kw = local_backend_shims()
        backend = LocalBackend(
            ro_binds=kw["ro_binds"], extra_path=kw["extra_path"], env={**kw["env"], **ENV}
        )
        half = max(N // 2, 1)
        host = statistics.median(_host_runs(calc, tmp / "host", half))
        cases: dict[str, tuple[dict[str, Any], str]] = {
            "swebench (5.x row, eval script)": (calc.swebench_v5_row(), "swebench"),
            "scaleswe (f2p_script + P2P)": (calc.scaleswe_f2p_row(), "scaleswe"),
        }
        print(f"N = {N} gradings per protocol, baselines N/2 runs; medians; {os.cpu_count()} CPUs")
        print(f"load average at start: {os.getloadavg()[0]:.1f}")
        print(f"pytest on the host, no sandbox: {host:.3f} s")
        print(
            f"{'protocol':34} {'grading s':>10} {'baseline s':>11} {'overhead s':>11} "
            f"{'ratio':>6}   grading phases (median s)"
        )
        for name, (row, protocol) in cases.items():
            md = get_metadata(row, protocol)
            base = statistics.median(trio.run(_baseline_runs, backend, calc, md, half))
            runs = trio.run(_gradings, backend, calc, md)
            wall = statistics.median(w for w, _ in runs)
            phases = {
                k: statistics.median(d.get(k, 0.0) for _, d in runs)
                for k in ("boot", "setup", "apply", "tests", "parse")
                if any(k in d for _, d in runs)
            }
            shown = " ".join(f"{k}={v:.3f}" for k, v in phases.items())
            print(
                f"{name:34} {wall:10.3f} {base:11.3f} {wall - base:11.3f} {wall / base:6.2f}   "
                f"{shown}"
            )
        print(
            "baseline = the grader's test command alone in a warm sandbox (exec_and_wait); "
            "overhead = grading - baseline = boot + setup + ladder + parse + kill + file I/O"
        )
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
