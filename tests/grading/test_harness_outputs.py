"""``trio-swe grade``: existing predictions graded as SWE-bench's harness does, its outputs read
back by swebench's own code (``get_eval_report`` on each ``test_output.txt``, ``make_run_report``
on the log folders) and checked field by field.

The dataset is five SWE-bench 5.x-shape rows of the calc repository (a real git repository), the
predictions a real gold patch, an empty one, one breaking a PASS_TO_PASS test, one that does not
apply, and one instance without a prediction; ``trio-swe grade`` runs as a real process.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trio_swe.grading import _swebench_api as sw
from trio_swe.grading import get_metadata

from ._calc import CalcRepo, build_calc_repo

pytestmark = pytest.mark.swebench
ROOT = Path(__file__).resolve().parents[2]
MODEL = "org/agent-v1"
RUN_ID = "calc-run"
HARNESS_KEYS = (
    "total_instances",
    "submitted_instances",
    "completed_instances",
    "resolved_instances",
    "unresolved_instances",
    "empty_patch_instances",
    "error_instances",
    "completed_ids",
    "incomplete_ids",
    "empty_patch_ids",
    "submitted_ids",
    "resolved_ids",
    "unresolved_ids",
    "error_ids",
    "schema_version",
)


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> tuple[CalcRepo, Path, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("grade")
    calc = build_calc_repo(tmp / "src")
    patches = {"gold": calc.gold, "empty": "", "break": calc.break_p2p, "noapply": calc.no_apply}
    rows = [calc.swebench_v5_row(instance_id=f"calc__calc-{k}") for k in [*patches, "missing"]]
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    preds = [
        {"instance_id": f"calc__calc-{k}", "model_name_or_path": MODEL, "model_patch": p}
        for k, p in patches.items()
    ]
    (tmp / "preds.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trio_swe.cli",
            "grade",
            str(tmp / "preds.jsonl"),
            "--dataset",
            str(tmp / "rows.jsonl"),
            "--run-id",
            RUN_ID,
            "--out-dir",
            str(tmp / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Instances resolved: 1" in out.stdout
    return calc, tmp / "out", rows


def test_predictions_and_run_report(graded: tuple[CalcRepo, Path, list[dict[str, Any]]]) -> None:
    calc, out, _ = graded
    preds = [json.loads(ln) for ln in (out / "predictions.jsonl").read_text().splitlines()]
    assert {p["instance_id"] for p in preds} == {
        f"calc__calc-{k}" for k in ("gold", "empty", "break", "noapply")
    }
    for p in preds:
        assert set(p) == {"instance_id", "model_name_or_path", "model_patch"}
        assert p["model_name_or_path"] == MODEL
    assert (
        next(p for p in preds if p["instance_id"] == "calc__calc-gold")["model_patch"] == calc.gold
    )
    report = json.loads((out / f"org__agent-v1.{RUN_ID}.json").read_text())
    assert set(HARNESS_KEYS) <= set(report)
    assert report["resolved_ids"] == ["calc__calc-gold"]
    assert report["unresolved_ids"] == ["calc__calc-break"]
    assert report["empty_patch_ids"] == ["calc__calc-empty"]
    assert report["error_ids"] == ["calc__calc-noapply"]  # the harness errors on apply failure
    assert report["incomplete_ids"] == ["calc__calc-missing"]
    assert (report["total_instances"], report["submitted_instances"]) == (5, 4)
    assert report["completed_instances"] == 2


def test_swebench_make_run_report_reads_the_log_folders_the_same(
    graded: tuple[CalcRepo, Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, out, rows = graded
    from swebench.harness.reporting import make_run_report

    preds = {
        json.loads(ln)["instance_id"]: json.loads(ln)
        for ln in (out / "predictions.jsonl").read_text().splitlines()
    }
    theirs_dir = out / "theirs"
    theirs_dir.mkdir(exist_ok=True)
    monkeypatch.chdir(out)  # swebench reads logs/run_evaluation/... relative to the cwd
    with contextlib.redirect_stdout(io.StringIO()):
        path = make_run_report(preds, rows, RUN_ID)
    theirs = json.loads(Path(path).read_text())
    ours = json.loads((out / f"org__agent-v1.{RUN_ID}.json").read_text())
    shared = set(theirs) & set(ours)
    assert set(HARNESS_KEYS) <= shared
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}


def test_instance_folders_are_what_swebench_grades(
    graded: tuple[CalcRepo, Path, list[dict[str, Any]]],
) -> None:
    calc, out, rows = graded
    model_dir = out / "logs" / "run_evaluation" / RUN_ID / "org__agent-v1"
    for iid, resolved in (("calc__calc-gold", True), ("calc__calc-break", False)):
        d = model_dir / iid
        assert {"patch.diff", "eval.sh", "test_output.txt", "report.json", "run_instance.log"} <= {
            p.name for p in d.iterdir()
        }
        row = next(r for r in rows if r["instance_id"] == iid)
        assert (d / "patch.diff").read_text() == (calc.gold if resolved else calc.break_p2p)
        script = (d / "eval.sh").read_text()
        assert ">>>>> Start Test Output" in script
        log = (d / "test_output.txt").read_text()
        assert log.index(">>>>> Start Test Output") < log.index(">>>>> End Test Output")
        assert "git checkout" in log.splitlines()[0] or log.startswith("+")  # whole, from line 1
        ours = json.loads((d / "report.json").read_text())
        # swebench's get_eval_report on our test_output.txt gives our report.json.
        spec = sw.build_test_spec(get_metadata(row, "swebench"))
        api = sw.get_api()
        assert api is not None
        theirs = api.get_eval_report(
            test_spec=spec,
            prediction={
                "instance_id": iid,
                "model_patch": (d / "patch.diff").read_text(),
                "model_name_or_path": MODEL,
            },
            test_log_path=str(d / "test_output.txt"),
            include_tests_status=True,
        )
        assert ours == theirs
        assert ours[iid]["resolved"] is resolved
        assert (
            f"reason: {'resolved' if resolved else 'tests_failed'}"
            in (d / "run_instance.log").read_text()
        )
    noapply = model_dir / "calc__calc-noapply"
    assert not (noapply / "report.json").exists()
    assert "reason: patch_apply_failed" in (noapply / "run_instance.log").read_text()
    assert not (model_dir / "calc__calc-empty").exists()  # not run, as the harness does


async def test_scaleswe_gradings_write_the_same_outputs(tmp_path: Path) -> None:
    """A scaleswe grading returns what the harness's files need (its eval script, test output
    and a report it makes from the statuses); the consumer writes them."""
    from trio_swe.grading import HarnessOutputs, grade, local_backend_shims
    from trio_swe.sandbox.local import LocalBackend

    calc = build_calc_repo(tmp_path / "src")
    kw = local_backend_shims()
    backend = LocalBackend(
        ro_binds=kw["ro_binds"],
        extra_path=kw["extra_path"],
        env={**kw["env"], "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    outputs = HarnessOutputs(tmp_path / "out", "r1", MODEL)
    md = get_metadata(calc.scaleswe_f2p_row(), "scaleswe")
    graded = await grade(backend, md, calc.break_p2p, timeout_sec=60)
    result = graded.result
    outputs.record(md.instance_id, calc.break_p2p, result, graded.artifacts)
    assert result.reason == "tests_failed"
    d = outputs.instance_dir(md.instance_id)
    report = json.loads((d / "report.json").read_text())[md.instance_id]
    assert report["resolved"] is False
    ts = report["tests_status"]
    assert ts["FAIL_TO_PASS"] == {
        "success": ["test_fail_to_pass.py::test_clamp_high"],
        "failure": [],
    }
    assert "tests/test_calc.py::test_add" in ts["PASS_TO_PASS"]["failure"]
    assert "PASSED test_fail_to_pass.py::test_clamp_high" in (d / "test_output.txt").read_text()
    assert "pytest" in (d / "eval.sh").read_text()
    assert outputs.write_report([md.instance_id])["unresolved_ids"] == [md.instance_id]
