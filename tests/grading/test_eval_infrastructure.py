"""An environment that cannot run the tests is ``eval_infrastructure``, never a reward of 0.

The broken environment is real: a virtualenv whose ``pytest`` script and ``python -m pytest``
find no pytest (a missing test runner), given to the local backend as the test environment.
Every protocol and grader is graded there with the gold patch (must not score 0 as a task
outcome) and, in a working environment, with a patch that breaks collection of every test (the
environment is fine: that 0 stands).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trio_swe.grading import _swebench_api as sw
from trio_swe.grading import get_metadata, local_backend_shims, run_evaluation
from trio_swe.grading._run import tests_did_not_run as did_not_run
from trio_swe.sandbox.local import LocalBackend

from ._calc import F2P, P2P, CalcRepo, _diff, build_calc_repo
from ._venvs import make_venv

_FAST_PYTEST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
BUDGET_SEC = 60.0


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> CalcRepo:
    return build_calc_repo(tmp_path_factory.mktemp("calc"))


def _backend(bin_dir: str | Path | None = None) -> LocalBackend:
    kw = local_backend_shims(bin_dir)
    return LocalBackend(
        ro_binds=kw["ro_binds"], extra_path=kw["extra_path"], env={**kw["env"], **_FAST_PYTEST}
    )


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> LocalBackend:
    bin_dir, _ = make_venv(tmp_path_factory.mktemp("broken") / "venv", with_test_env=False)
    return _backend(bin_dir)


def _eval_cmd_row(calc: CalcRepo, _: Path) -> dict[str, Any]:
    row = calc.slime_eval_cmd_sample(
        f"git checkout -q HEAD -- tests && git apply {calc._test_patch_file()}"
        " && python -m pytest -rA -p no:cacheprovider tests"
    )
    row["metadata"]["FAIL_TO_PASS"] = list(F2P)
    row["metadata"]["PASS_TO_PASS"] = list(P2P)
    return row


Row = Callable[[CalcRepo, Path], dict[str, Any]]
CASES: dict[str, tuple[str, Row]] = {
    "swebench_v5_row": ("swebench", lambda c, t: c.swebench_v5_row()),
    "swebench_classic_row": ("swebench", lambda c, t: c.swebench_classic_row()),
    "scaleswe_f2p_script": ("scaleswe", lambda c, t: c.scaleswe_f2p_row()),
    "scaleswe_eval_cmd": ("scaleswe", _eval_cmd_row),
    "scaleswe_swepro": ("scaleswe", lambda c, t: c.swepro_row(t)),
}


def _params() -> list[Any]:
    return [
        pytest.param(name, marks=[pytest.mark.swebench] if p == "swebench" else [], id=name)
        for name, (p, _) in CASES.items()
    ]


def _needs_classic_support(name: str) -> None:
    api = sw.get_api()
    if name == "swebench_classic_row" and api is not None and api.major >= 5:
        pytest.skip("swebench 5.x builds no eval script for classic rows")


@pytest.mark.parametrize("name", _params())
async def test_broken_environment_is_infrastructure_never_a_zero(
    calc: CalcRepo, broken: LocalBackend, tmp_path: Path, name: str
) -> None:
    _needs_classic_support(name)
    protocol, make_row = CASES[name]
    md = get_metadata(make_row(calc, tmp_path), protocol)
    # The run without a patch is its own control; one protocol is enough to show it.
    for patch in (calc.gold, "") if name == "swebench_v5_row" else (calc.gold,):
        result = await run_evaluation(broken, md, patch, timeout_sec=BUDGET_SEC)
        explain = f"{result.reason}: {result.detail}\n{result.log_tail[-1200:]}"
        assert (result.reason, result.infra_failure) == ("eval_infrastructure", True), explain
        assert (result.reward, result.resolved) == (0.0, False)
        assert "cannot run the tests" in result.detail
        assert "pytest" in result.log_tail  # the log says what was missing
        if patch:
            assert result.durations["control"] > 0  # confirmed by a run without the patch
        else:
            assert "control" not in result.durations  # the run itself was the control
    assert broken.statistics().live == 0


@pytest.mark.parametrize(
    "name", [p for p in _params() if p.id in ("swebench_v5_row", "scaleswe_f2p_script")]
)
async def test_patch_breaking_every_test_is_still_the_patch(
    calc: CalcRepo, tmp_path: Path, name: str
) -> None:
    """A collection error that hits every test, caused by the patch: reward 0 stands."""
    _needs_classic_support(name)
    protocol, make_row = CASES[name]
    md = get_metadata(make_row(calc, tmp_path), protocol)
    syntax_error = _diff(calc.path, "calc/__init__.py", "def add(a, b)\n    return a + b\n")
    result = await run_evaluation(_backend(), md, syntax_error, timeout_sec=BUDGET_SEC)
    explain = f"{result.reason}: {result.detail}\n{result.log_tail[-1200:]}"
    assert (result.reward, result.infra_failure) == (0.0, False), explain
    assert result.reason in ("tests_failed", "log_ungradable"), explain
    # The control run (no patch) ran the tests, so the environment was not to blame.
    assert result.durations["control"] > 0


@pytest.mark.swebench
async def test_a_row_whose_script_never_marks_its_output_is_infrastructure(
    calc: CalcRepo,
) -> None:
    script = calc.eval_script().replace(": '>>>>> Start Test Output'\n", "")
    md = get_metadata(calc.swebench_v5_row(eval_script=script), "swebench")
    result = await run_evaluation(_backend(), md, calc.gold, timeout_sec=BUDGET_SEC)
    assert (result.reason, result.infra_failure) == ("eval_infrastructure", True)
    assert "PASSED" in result.log_tail  # the tests ran; swebench cannot grade this log


def test_the_rule_on_statuses_and_exit_codes() -> None:
    from trio_swe.grading import EvalResult

    def r(status: dict[str, str], code: int | None = 1, reason: str = "tests_failed") -> Any:
        return EvalResult(
            reward=0.0,
            resolved=False,
            applied_cleanly=True,
            reason=reason,
            protocol="p",
            instance_id="i",
            tests_status=status,
            test_exit_code=code,
        )

    tests = ["t.py::a", "t.py::b[x y]"]
    assert did_not_run(r({}), tests)
    assert did_not_run(r({"t.py": "ERROR"}), tests)  # a collection error, file level
    assert not did_not_run(r({"t.py::a": "FAILED"}), tests)
    assert not did_not_run(r({"t.py::b[x y]": "SKIPPED"}), tests)  # any status counts
    assert not did_not_run(r({"t.py::b[x y] extra": "PASSED"}), ["t.py::b[x y]"])
    assert not did_not_run(r({}, reason="patch_apply_failed"), tests)
    assert not did_not_run(r({}, reason="tests_timeout"), tests)
    # Without the row's tests, only a command the shell could not run is suspect.
    assert did_not_run(r({}, 127), [])
    assert not did_not_run(r({}, 1), [])
    assert json.dumps(tests)  # the ids are plain strings
