"""Grading real patches of a real repository in real local sandboxes, for every protocol and shape.

Each case boots a fresh bubblewrap sandbox from the calc repository (see ``_calc.py``), applies
a patch and runs the row's grader; the swebench cases are graded by swebench's own
``get_eval_report`` on the real log.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import SandboxError
from trio_swe.grading import _run as grading_run
from trio_swe.grading import _swebench_api as sw
from trio_swe.grading import (
    evaluability_check,
    get_metadata,
    local_backend_shims,
    run_evaluation,
)
from trio_swe.sandbox.local import LocalBackend

from ..conftest import host_pids_gone, host_pids_with
from ._calc import CalcRepo, build_calc_repo

# The calc suite needs no pytest plugins; loading the venv's (hypothesis, xdist, trio...) in
# every graded run would dominate the test time.
_FAST_PYTEST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
HANG_BUDGET_SEC = 2.0
BUDGET_SEC = 60.0


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> CalcRepo:
    return build_calc_repo(tmp_path_factory.mktemp("calc"))


@pytest.fixture
def grading_backend() -> LocalBackend:
    kw = local_backend_shims()
    return LocalBackend(
        ro_binds=kw["ro_binds"], extra_path=kw["extra_path"], env={**kw["env"], **_FAST_PYTEST}
    )


def _swebench_major() -> int:
    api = sw.get_api()
    return 0 if api is None else api.major


Shape = tuple[str, Callable[[CalcRepo, Path], dict[str, Any]]]
SHAPES: dict[str, Shape] = {
    "swebench_v5_row": ("swebench", lambda c, t: c.swebench_v5_row()),
    "swebench_classic_row": ("swebench", lambda c, t: c.swebench_classic_row()),
    "swebench_slime_sample": ("swebench", lambda c, t: c.slime_swebench_sample()),
    "scaleswe_f2p_row": ("scaleswe", lambda c, t: c.scaleswe_f2p_row()),
    "scaleswe_eval_cmd_sample": ("scaleswe", lambda c, t: c.slime_eval_cmd_sample()),
    "scaleswe_swepro_row": ("scaleswe", lambda c, t: c.swepro_row(t)),
}
CLASSIC = {"swebench_classic_row", "swebench_slime_sample"}


def _marks(shape: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.swebench] if SHAPES[shape][0] == "swebench" else []


def _cases() -> list[Any]:
    outcomes = ["gold", "empty", "no_apply", "break_p2p", "hang", "cheat"]
    return [
        pytest.param(shape, outcome, marks=_marks(shape), id=f"{shape}-{outcome}")
        for shape in SHAPES
        for outcome in outcomes
        # A slime sample wrapping a classic row differs from it only in where the fields are
        # read from (covered in test_metadata); one grading proves the path end to end.
        if shape != "swebench_slime_sample" or outcome == "gold"
    ]


def _patch(calc: CalcRepo, shape: str, outcome: str) -> str:
    if outcome == "empty":
        return ""
    if outcome == "cheat":
        # What an agent could write to make its graded tests pass without fixing the bug.
        if shape == "scaleswe_swepro_row":
            return calc.cheat_after_setup  # the agent saw the tests after before_repo_set_cmd
        if shape == "scaleswe_f2p_row":
            return calc.fake_f2p
        return calc.cheat
    patch: str = getattr(calc, outcome)
    return patch


@pytest.mark.parametrize(("shape", "outcome"), _cases())
async def test_grade(
    calc: CalcRepo, grading_backend: LocalBackend, tmp_path: Path, shape: str, outcome: str
) -> None:
    protocol, make_row = SHAPES[shape]
    md = get_metadata(make_row(calc, tmp_path), protocol)
    if shape in CLASSIC and _swebench_major() >= 5:
        # swebench 5.x cannot build an eval script from repo+version: flagged before any episode.
        if outcome != "gold":
            pytest.skip("swebench 5.x: one case is enough for an unevaluable row")
        reason = evaluability_check(md)
        assert reason is not None
        assert reason.startswith("classic_row_needs_swebench_4")
        result = await run_evaluation(grading_backend, md, calc.gold, timeout_sec=BUDGET_SEC)
        assert (result.reward, result.reason, result.infra_failure) == (0.0, "unevaluable", True)
        return
    assert evaluability_check(md) is None
    budget = HANG_BUDGET_SEC if outcome == "hang" else BUDGET_SEC
    result = await run_evaluation(
        grading_backend, md, _patch(calc, shape, outcome), timeout_sec=budget
    )

    assert result.protocol == protocol
    assert result.instance_id == md.instance_id
    assert grading_backend.statistics().live == 0  # the eval sandbox was killed
    explain = f"{result.reason}: {result.detail}\n{result.log_tail[-1500:]}"
    if outcome == "gold":
        assert (result.reward, result.resolved, result.reason) == (1.0, True, "resolved"), explain
        assert result.apply_method == "git_apply"
        assert result.applied_cleanly
        if result.f2p_total is not None:
            assert result.f2p_passed == result.f2p_total > 0
            assert result.p2p_passed == result.p2p_total
        if protocol == "swebench":  # recorded by the script on 4.x and 5.x alike
            assert result.test_exit_code == 0, explain
    elif outcome == "empty":
        assert (result.reward, result.reason) == (0.0, "tests_failed"), explain
        assert result.applied_cleanly
        assert result.apply_method == "empty"
        if protocol == "swebench":
            assert result.test_exit_code == 1, explain
        if result.f2p_total is not None:  # every grader now splits F2P/P2P where it can
            assert (result.f2p_passed, result.p2p_passed) == (0, result.p2p_total), explain
    elif outcome == "no_apply":
        assert (result.reward, result.reason) == (0.0, "patch_apply_failed"), explain
        assert not result.applied_cleanly
        assert result.apply_method is None
        assert "patch" in result.log_tail  # the ladder's log says why
    elif outcome == "break_p2p":
        assert (result.reward, result.resolved, result.reason) == (0.0, False, "tests_failed"), (
            explain
        )
        if result.p2p_total is not None:
            assert result.f2p_passed == result.f2p_total
            assert result.p2p_passed is not None
            assert result.p2p_passed < result.p2p_total
    elif outcome == "hang":
        assert (result.reward, result.reason) == (0.0, "tests_timeout"), explain
        assert result.test_exit_code == -1
        assert result.durations["total"] < budget + 30
    else:  # cheat
        assert result.applied_cleanly, explain
        assert (result.reward, result.resolved) == (0.0, False), explain
    assert result.durations["total"] >= result.durations.get("tests", 0.0)


@pytest.mark.swebench
async def test_swebench_tests_status_comes_from_swebench(
    calc: CalcRepo, grading_backend: LocalBackend
) -> None:
    md = get_metadata(calc.swebench_v5_row(), "swebench")
    result = await run_evaluation(grading_backend, md, calc.break_p2p, timeout_sec=BUDGET_SEC)
    assert result.tests_status["tests/test_calc.py::test_add"] == "FAILED"
    assert result.tests_status["tests/test_calc.py::test_clamp_high"] == "PASSED"
    assert (result.f2p_passed, result.f2p_total, result.p2p_passed, result.p2p_total) == (
        2,
        2,
        1,
        2,
    )


async def test_pre_commands_failure_is_infrastructure(
    calc: CalcRepo, grading_backend: LocalBackend
) -> None:
    row = calc.scaleswe_f2p_row(pre_commands=["true", "git checkout no-such-ref", "true"])
    result = await run_evaluation(
        grading_backend, get_metadata(row, "scaleswe"), calc.gold, timeout_sec=BUDGET_SEC
    )
    assert (result.reward, result.reason, result.infra_failure) == (0.0, "setup_failed", True)
    assert "no-such-ref" in result.log_tail
    assert result.detail == "pre_commands exited with status 1"
    assert result.apply_method is None  # the ladder never ran
    assert set(result.durations) >= {"boot", "setup"}
    assert "tests" not in result.durations


async def test_a_setup_over_its_budget_is_infrastructure(
    calc: CalcRepo, grading_backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grading_run, "SETUP_BUDGET_SEC", 1.0)
    row = calc.scaleswe_f2p_row(pre_commands=["echo installing", "sleep 300"])
    with trio.fail_after(120):  # a hang guard: the watchdog cuts it at 1 s
        result = await run_evaluation(
            grading_backend, get_metadata(row, "scaleswe"), calc.gold, timeout_sec=BUDGET_SEC
        )
    assert (result.reward, result.reason, result.infra_failure) == (0.0, "setup_failed", True)
    assert result.detail == "pre_commands outlived its 1 s budget"
    assert result.log_tail == "installing\n"
    assert grading_backend.statistics().live == 0


async def test_both_setups_run_in_order_and_the_graded_script_sees_them(
    calc: CalcRepo, grading_backend: LocalBackend, tmp_path: Path
) -> None:
    # pre_commands fails unless before_repo_set_cmd already applied the test patch; the run
    # script passes the F2P tests only with it applied.
    unless_applied = "git diff --quiet -- tests && exit 7 || true"
    row = calc.swepro_row(tmp_path, pre_commands=[unless_applied])
    result = await run_evaluation(
        grading_backend, get_metadata(row, "scaleswe"), calc.gold, timeout_sec=BUDGET_SEC
    )
    assert (result.reward, result.reason) == (1.0, "resolved"), result.detail
    assert 0 <= result.durations["setup"] <= result.durations["total"]
    # The check first and the test patch after it: the check fails.
    row = calc.swepro_row(tmp_path, before_repo_set_cmd=unless_applied)
    row["pre_commands"] = [f"git apply {calc._test_patch_file()}"]
    result = await run_evaluation(
        grading_backend, get_metadata(row, "scaleswe"), calc.gold, timeout_sec=BUDGET_SEC
    )
    assert (result.reason, result.infra_failure) == ("setup_failed", True)
    assert result.detail == "before_repo_set_cmd exited with status 7"


async def test_no_grader_is_flagged_and_costs_no_sandbox(
    calc: CalcRepo, grading_backend: LocalBackend
) -> None:
    md = get_metadata({"metadata": {"image": calc.image, "instance_id": "x"}}, "scaleswe")
    assert evaluability_check(md) == "no_grader"
    result = await run_evaluation(grading_backend, md, calc.gold, timeout_sec=BUDGET_SEC)
    assert (result.reward, result.reason, result.infra_failure) == (0.0, "no_grader", True)
    assert grading_backend.statistics().created == 0


async def test_binary_patch_is_applied(calc: CalcRepo, grading_backend: LocalBackend) -> None:
    binary = bytes(range(256)) * 4
    eval_cmd = "python -c \"import sys; d=open('blob.bin','rb').read(); sys.exit(d != bytes(range(256))*4)\""
    patch = calc.binary_patch("blob.bin", binary)
    md = get_metadata(calc.slime_eval_cmd_sample(eval_cmd=eval_cmd), "scaleswe")
    result = await run_evaluation(grading_backend, md, patch, timeout_sec=BUDGET_SEC)
    assert (result.reward, result.apply_method) == (1.0, "git_apply"), result.log_tail


async def test_cancellation_leaves_no_sandbox(
    calc: CalcRepo, grading_backend: LocalBackend
) -> None:
    md = get_metadata(calc.scaleswe_f2p_row(), "scaleswe")
    with trio.CancelScope() as scope:

        async def cancel_once_the_suite_hangs() -> None:
            with trio.fail_after(120):  # a hang guard only
                while not host_pids_with(calc.hang_marker):  # noqa: ASYNC110 (no event)
                    await trio.sleep(0.05)
            scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_the_suite_hangs)
            await run_evaluation(grading_backend, md, calc.hang, timeout_sec=BUDGET_SEC)
    assert scope.cancelled_caught
    stats = grading_backend.statistics()
    assert stats.created == 1
    assert stats.live == 0
    assert await host_pids_gone(calc.hang_marker) == []


async def test_swepro_parser_writing_junk_is_infrastructure(
    calc: CalcRepo, grading_backend: LocalBackend, tmp_path: Path
) -> None:
    # The row's parser fails with any patch (the control run without one too): the row's
    # grader is broken, so the outcome says nothing about the patch.
    row = calc.swepro_row(tmp_path)
    row.pop("parser_script_path")
    row["parser_script"] = "import sys\nopen(sys.argv[3], 'w').write('{not json')\n"
    result = await run_evaluation(
        grading_backend, get_metadata(row, "scaleswe"), calc.gold, timeout_sec=BUDGET_SEC
    )
    assert (result.reward, result.reason, result.grader) == (0.0, "eval_infrastructure", "swepro")
    assert result.infra_failure
    assert "log_ungradable" in result.detail
    assert "result.json" in result.detail


@pytest.mark.swebench
async def test_swebench_log_larger_than_one_read(
    calc: CalcRepo, grading_backend: LocalBackend
) -> None:
    # 10 MB of test output between the markers: a capped read keeps only the tail and loses
    # the start marker; the log must be read whole.
    noise = "head -c 10000000 /dev/zero | tr '\\0' x | fold -w 100\n"
    start = ": '>>>>> Start Test Output'\n"
    script = calc.eval_script().replace(start, start + noise)
    md = get_metadata(calc.swebench_v5_row(eval_script=script), "swebench")
    result = await run_evaluation(grading_backend, md, calc.gold, timeout_sec=BUDGET_SEC)
    assert (result.reward, result.reason) == (1.0, "resolved"), result.detail


async def test_unbootable_image_is_a_sandbox_error(
    calc: CalcRepo, grading_backend: LocalBackend, tmp_path: Path
) -> None:
    # Infrastructure, not a task outcome: raised, never a reward 0.
    row = calc.scaleswe_f2p_row(image_url=f"{tmp_path / 'no-such-repo'}@HEAD")
    with pytest.raises(SandboxError):
        await run_evaluation(
            grading_backend, get_metadata(row, "scaleswe"), calc.gold, timeout_sec=BUDGET_SEC
        )
    assert grading_backend.statistics().live == 0


@pytest.mark.parametrize(
    ("protocol", "row"),
    [
        pytest.param("swebench", "swebench_classic_row", marks=pytest.mark.swebench),
        ("scaleswe", "scaleswe_f2p_row"),
    ],
)
async def test_a_failed_boot_is_a_sandbox_error_as_itself(
    calc: CalcRepo, grading_backend: LocalBackend, protocol: str, row: str
) -> None:
    # Not wrapped in an exception group by the grading's own nursery: callers (episodes)
    # catch SandboxError to abort as an infrastructure failure.
    if protocol == "swebench" and _swebench_major() >= 5:
        pytest.skip("swebench 5.x builds no eval script for classic rows")
    image = f"/nonexistent/trio-swe-test@{calc.base}"
    data = getattr(calc, row)(image=image) if protocol == "swebench" else getattr(calc, row)()
    if protocol == "scaleswe":
        data["image_url"] = image
    with pytest.raises(SandboxError, match="nonexistent"):
        await run_evaluation(
            grading_backend, get_metadata(data, protocol), calc.gold, timeout_sec=BUDGET_SEC
        )
