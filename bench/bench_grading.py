"""Grading overhead on the local backend, beside running the row's tests alone, in one run.

A grading = image check + fresh sandbox + patch ladder + the row's eval script + parse + kill
(``run_evaluation``). Its baseline is the row's *test command alone* (e.g. ``pytest -rA
tests/test_config.py``), run in an already booted sandbox where the test patch and the gold patch
are applied, through ``exec_and_wait``. Ratio = median grading / median baseline over
``BENCH_GRADING_N`` (default 15) gradings per case and as many baseline runs, interleaved (ABBA)
so that load drifting on a shared machine hits both sides alike. ``BENCH_GRADING_CASES=flask``
runs only the cases whose name contains one of the comma-separated words.

The *paired ratio* is the median of each grading over the test run beside it (the same ABBA
pair), which a load that drifts during the run disturbs less than the ratio of medians.

The *floor* of a swebench row (:class:`Floor`): what every grading of it pays beside its tests,
each part measured on its own ``N`` times, by the sandbox's clock where it runs there: the eval
script's own lines before the tests (environment activation, swebench's git steps, the test
patch; run in the booted sandbox, which they leave as it was), one ``git apply`` of the patch,
and a fresh sandbox booted and killed. Their medians' sum over the tests alone is the best ratio
a grading on this backend could reach with the harness's script unmodified.

Bytecode: a grading's sandbox is fresh, so Python compiles every module of the repository that
the tests import (an image rarely holds ``__pycache__`` for the repository's own sources: this
flask image has none). Before each timed run of the tests alone, the ``__pycache__``
directories the earlier runs left in the booted sandbox are removed (untimed), so the tests
alone start from the bytecode a fresh sandbox has; otherwise every run but the first would skip
compiling the repository's modules, and the ratio would charge that compile to grading. So is
``.pytest_cache``, which a fresh sandbox lacks too (pytest makes it: ~5 ms on calc). The
*warm* line runs the tests alone once more right after, with the bytecode of the run before it:
the old baseline, printed for comparison (on flask-4992 the two differ by about 13 ms).

Cases:

* ``swebench classic: pallets__flask-4992`` and ``pvlib__pvlib-python-1072``: real SWE-bench
  Lite rows, graded by swebench 4.x's own eval script (classic rows: built from repo + version)
  against Flask 2.2.5's and pvlib 0.8.0's source (their sdists, with their tests; each row's
  test patch and gold patch apply to it). The row's ``base_commit`` is replaced by the commit of
  that local reconstruction. Needs a one-time ``python -m bench.prepare_grading`` (downloads
  the sdists and the test environments' packages from PyPI into ``~/.cache/trio_swe/bench``);
  a row not prepared is skipped, saying so.
* ``swebench classic (calc)``, ``swebench 5.x row (calc)``, ``scaleswe f2p_script (calc)``: the
  tests' tiny calc repository (a sub-second suite: the ratio there is dominated by the fixed
  cost of a grading, shown as the overhead column).

Run: ``python -m bench grading`` (or ``nox -s bench -- grading``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from trio_swe.grading import (
    _swebench_api,
    evaluability_check,
    get_metadata,
    local_backend_shims,
    run_evaluation,
)
from trio_swe.sandbox import Sandbox, exec_and_wait, open_sandbox
from trio_swe.sandbox.local import LocalBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._stats import paired_median_ci, ratio_of_medians_ci, verdict
from bench.prepare_grading import REAL_ROWS, RealRow, prepared
from tests.grading._calc import F2P_SCRIPT, P2P, build_calc_repo

N = int(os.environ.get("BENCH_GRADING_N", "15"))
#: swebench's marker before the test command's output (its ``START_TEST_OUTPUT``).
START_TEST_OUTPUT = ">>>>> Start Test Output"
#: The issue's goal for the ratio (grading / tests alone), checked against the 95 % intervals.
GOAL = 1.1
#: Only the cases whose name contains one of these comma-separated words (default: all).
ONLY = [w for w in os.environ.get("BENCH_GRADING_CASES", "").split(",") if w]
#: The eval scripts' own environment set-up (the shims' conda activate), for both sides.
ACTIVATE = ". /opt/miniconda3/bin/activate && conda activate testbed"
ENV = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PY_COLORS": "0", "NO_COLOR": "1", "TERM": "dumb"}
GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


@dataclass
class Case:
    name: str
    row: dict[str, Any]
    protocol: str
    backend: LocalBackend
    image: str
    patches: tuple[str, ...]  # applied before the baseline's test command (test patch, gold)
    gold: str
    tests_alone: str  # the row's test command


def _backend(python_bin: str | None = None) -> LocalBackend:
    kw = local_backend_shims(python_bin)
    return LocalBackend(
        ro_binds=kw["ro_binds"], extra_path=kw["extra_path"], env={**kw["env"], **ENV}
    )


@dataclass
class Floor:
    """What any grading of a swebench row pays beside its tests, measured on its own."""

    steps: list[float]  # the eval script's lines before the tests (activate, git steps, test patch)
    apply: list[float]  # one `git apply` of the patch (the ladder's first rung)
    boot: list[float]  # a fresh sandbox booted and killed

    def total(self) -> float:
        return sum(statistics.median(v) for v in (self.steps, self.apply, self.boot))


def before_tests(script: str) -> str | None:
    """The eval script up to its start-of-test-output marker (a shell line, not the test
    patch's), or None."""
    lines = script.split("\n")
    for i, (line, in_body) in enumerate(_swebench_api._shell_lines(lines)):
        if not in_body and START_TEST_OUTPUT in line:
            return "\n".join(lines[:i]) + "\n"
    return None


async def _floor(case: Case, sb: Sandbox, md: Any, n: int) -> Floor | None:
    """``n`` timings of each part of :class:`Floor`, in the booted sandbox of the tests alone
    (its patches applied: the script's checkout and test patch leave it as it was) and in fresh
    ones. Timed by the sandbox's clock (``$EPOCHREALTIME``), without the RPCs around them."""
    if case.protocol != "swebench":
        return None
    pre = before_tests(_swebench_api.run_script(_swebench_api.build_test_spec(md).eval_script))
    if pre is None:
        return None
    await sb.write_file("/tmp/pre.sh", pre)
    timed = (
        "s=$EPOCHREALTIME; bash /tmp/pre.sh >/dev/null 2>&1; m=$EPOCHREALTIME; "
        f"git apply --check -R /tmp/p{len(case.patches) - 1}.diff; e=$EPOCHREALTIME; echo $s $m $e"
    )
    floor = Floor([], [], [])
    for _ in range(n):
        r = await sb.exec(f"bash -c {shlex.quote(timed)}", env=ENV)
        s, m, e = (float(x) for x in r.output.split()[-3:])
        floor.steps.append(m - s)
        floor.apply.append(e - m)
        t = time.perf_counter()
        async with open_sandbox(case.backend, case.image):
            pass
        floor.boot.append(time.perf_counter() - t)
    return floor


async def _measure(
    case: Case, n: int
) -> tuple[list[float], list[float], list[tuple[float, dict[str, float]]], Floor | None]:
    """``n`` runs of the row's test command alone and ``n`` gradings, interleaved, then the
    row's :class:`Floor` (``n`` times each).

    The tests alone run in one booted sandbox with the row's patches applied. Gradings and
    test runs alternate (ABBA order), so load that drifts on a shared machine hits both sides
    alike. One untimed warm-up of each first (the first swebench grading imports swebench).
    """
    md = get_metadata(case.row, case.protocol)
    alone: list[float] = []
    warm: list[float] = []
    gradings: list[tuple[float, dict[str, float]]] = []
    async with open_sandbox(case.backend, case.image) as sb:
        for i, patch in enumerate(case.patches):
            await sb.write_file(f"/tmp/p{i}.diff", patch)
            r = await sb.exec(f"git apply /tmp/p{i}.diff")
            assert r.ok, r.output
        if case.protocol == "scaleswe":
            await sb.write_file("/testbed/test_fail_to_pass.py", F2P_SCRIPT)

        async def tests_alone(*, cold: bool = True) -> float:
            if cold:  # the bytecode and pytest cache a fresh sandbox has (untimed)
                r = await sb.exec(
                    "find . -name __pycache__ -type d -prune -exec rm -rf {} + "
                    "&& rm -rf .pytest_cache"
                )
                assert r.ok, r.output
            t = time.perf_counter()
            r = await exec_and_wait(
                sb, f"{case.tests_alone} > /tmp/t.log 2>&1", time_budget_sec=600, env=ENV
            )
            wall = time.perf_counter() - t
            assert r.ok, (await sb.exec("tail -30 /tmp/t.log")).output
            return wall

        async def grading() -> tuple[float, dict[str, float]]:
            t = time.perf_counter()
            # The image and its commit are checked before boot, as episodes do.
            assert evaluability_check(md, case.backend) is None
            r = await run_evaluation(case.backend, md, case.gold, timeout_sec=600)
            wall = time.perf_counter() - t
            assert r.resolved, (r.reason, r.detail, r.log_tail[-800:])
            return wall, dict(r.durations)

        await tests_alone()
        await grading()
        for i in range(n):
            if i % 2 == 0:
                alone.append(await tests_alone())
                warm.append(await tests_alone(cold=False))
                gradings.append(await grading())
            else:
                gradings.append(await grading())
                alone.append(await tests_alone())
                warm.append(await tests_alone(cold=False))
        floor = await _floor(case, sb, md, n)
    return alone, warm, gradings, floor


def _real_case(tmp: Path, real: RealRow) -> Case | None:
    got = prepared(real)
    if got is None:
        print(
            f"{real.instance_id}: not prepared (run `python -m bench.prepare_grading` once); skipped"
        )
        return None
    src, env_bin = got
    repo = tmp / real.instance_id
    shutil.copytree(src, repo)
    # The base is an empty commit on top of the tree: the eval script's `git show` prints the
    # base commit, which in SWE-bench's images is one upstream commit, not the whole tree.
    for args in (
        ["init", "-q"],
        ["add", "-A"],
        ["commit", "-qm", f"{real.sdist} sdist"],
        ["commit", "-q", "--allow-empty", "-m", "base"],
    ):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env=GIT_ENV)
    base = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    row = json.loads(real.row_file.read_text())
    row.update(base_commit=base, image=f"{repo}@{base}")
    return Case(
        name=f"swebench classic: {real.instance_id}",
        row=row,
        protocol="swebench",
        backend=_backend(env_bin),
        image=row["image"],
        patches=(row["test_patch"], row["patch"]),
        gold=row["patch"],
        tests_alone=f"{ACTIVATE} && pytest -rA {real.tests}",
    )


def _spread(values: Iterable[float]) -> str:
    v = sorted(values)
    return f"min {v[0]:.3f} / median {statistics.median(v):.3f} / max {v[-1]:.3f} s"


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench_grading_"))
    try:
        calc = build_calc_repo(tmp / "src")
        calc_backend = _backend()
        calc_tests = f"{ACTIVATE} && pytest -rA tests/test_calc.py"
        cases: list[Case] = []
        for real in REAL_ROWS:
            if (case := _real_case(tmp, real)) is not None:
                cases.append(case)
        api = _swebench_api.get_api()
        if api is not None and api.major < 5:
            cases.append(
                Case(
                    "swebench classic (calc)",
                    calc.swebench_classic_row(),
                    "swebench",
                    calc_backend,
                    calc.image,
                    (calc.test_patch, calc.gold),
                    calc.gold,
                    calc_tests,
                )
            )
        cases.append(
            Case(
                "swebench 5.x row (calc)",
                calc.swebench_v5_row(),
                "swebench",
                calc_backend,
                calc.image,
                (calc.test_patch, calc.gold),
                calc.gold,
                calc_tests,
            )
        )
        ids = " ".join(shlex.quote(t) for t in ("test_fail_to_pass.py", *P2P))
        cases.append(
            Case(
                "scaleswe f2p_script (calc)",
                calc.scaleswe_f2p_row(),
                "scaleswe",
                calc_backend,
                calc.image,
                (calc.test_patch, calc.gold),
                calc.gold,
                f"python -m pytest -rA -p no:cacheprovider {ids}",
            )
        )
        if ONLY:
            cases = [c for c in cases if any(w in c.name for w in ONLY)]
        version = api.version if api is not None else "none"
        print(
            f"N = {N} gradings and test runs per case; medians; {os.cpu_count()} CPUs; "
            f"swebench {version}"
        )
        print(f"load average at start: {os.getloadavg()[0]:.1f}")
        print(
            f"{'case':40} {'grading s':>10} {'tests alone s':>14} {'overhead s':>11} "
            f"{'ratio':>6}   grading phases (median s)"
        )
        for case in cases:
            alone_runs, warm_runs, runs, floor = trio.run(_measure, case, N)
            alone = statistics.median(alone_runs)
            warm = statistics.median(warm_runs)
            wall = statistics.median(w for w, _ in runs)
            # Each grading beside the test run next to it (ABBA pairs): drift cancels out.
            pairs = [w / a for (w, _), a in zip(runs, alone_runs, strict=True)]
            paired = statistics.median(pairs)
            r_lo, r_hi = ratio_of_medians_ci([w for w, _ in runs], alone_runs)
            p_lo, p_hi = paired_median_ci(pairs)
            phases = {
                k: statistics.median(d.get(k, 0.0) for _, d in runs)
                for k in ("spec", "boot", "setup", "apply", "tests", "parse", "kill")
                if any(k in d for _, d in runs)
            }
            shown = " ".join(f"{k}={v:.3f}" for k, v in phases.items())
            print(
                f"{case.name:40} {wall:10.3f} {alone:14.3f} {wall - alone:11.3f} "
                f"{wall / alone:6.2f}   {shown}",
                flush=True,
            )
            print(
                f"{'':40} grading runs {_spread(w for w, _ in runs)}; "
                f"tests alone runs {_spread(alone_runs)}; paired ratio median {paired:.2f}",
                flush=True,
            )
            print(
                f"{'':40} 95 % intervals: ratio {r_lo:.2f}-{r_hi:.2f} "
                f"({verdict(r_lo, r_hi, GOAL)} {GOAL}), paired {p_lo:.2f}-{p_hi:.2f} "
                f"({verdict(p_lo, p_hi, GOAL)} {GOAL})",
                flush=True,
            )
            print(
                f"{'':40} warm bytecode: tests alone median {warm:.3f} s, ratio "
                f"{wall / warm:.2f} (the old baseline)",
                flush=True,
            )
            if floor is not None:
                ms = {
                    k: 1000 * statistics.median(getattr(floor, k))
                    for k in ("steps", "apply", "boot")
                }
                print(
                    f"{'':40} floor on this backend: the eval script's own steps before the tests "
                    f"{ms['steps']:.1f} ms + a patch's git apply {ms['apply']:.1f} ms + a "
                    f"sandbox's boot and kill {ms['boot']:.1f} ms = {1000 * floor.total():.1f} ms: "
                    f"no grading of this row here beats {1 + floor.total() / alone:.2f}x",
                    flush=True,
                )
        print(
            "tests alone = the row's test command in a booted sandbox with its patches applied, "
            "its __pycache__ and .pytest_cache removed first (as a fresh sandbox has them); "
            "grading = evaluability_check(md, backend) + run_evaluation (boot, ladder, the eval "
            "script with its git steps, parse, kill)"
        )
        print(f"load average at end: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
