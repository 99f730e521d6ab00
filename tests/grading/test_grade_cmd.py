"""``trio-swe grade``'s reading of its inputs: which prediction is graded, against which row, and
what is refused before anything runs (as swebench's ``run_evaluation`` does: it maps instance id
to prediction, so the last one wins, and refuses predictions whose instance the dataset lacks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from trio_swe import ConfigError
from trio_swe.grading.predictions import check_known, index_rows, latest_predictions, model_of

from ._calc import build_calc_repo

ROOT = Path(__file__).resolve().parents[2]


def test_rows_by_instance_id_refuse_what_is_ambiguous() -> None:
    a, b = {"instance_id": "x__y-1", "v": 1}, {"instance_id": "x__y-2"}
    assert index_rows([a, b, dict(a)]) == {"x__y-1": a, "x__y-2": b}  # a copy is harmless
    with pytest.raises(ConfigError, match="rows 0 and 2 differ but share instance_id 'x__y-1'"):
        index_rows([a, b, {**a, "v": 2}])
    for bad in ({}, {"instance_id": 3}, {"instance_id": ""}):
        with pytest.raises(ConfigError, match=r"rows.jsonl: row 1( has no |: )instance_id"):
            index_rows([a, bad], "rows.jsonl")


def test_the_last_prediction_of_an_instance_is_the_one_kept() -> None:
    preds = [
        {"instance_id": "a", "model_patch": "1"},
        {"instance_id": "b", "model_patch": "2"},
        {"instance_id": "a", "model_patch": "3"},
    ]
    assert latest_predictions(preds) == [preds[2], preds[1]]


def test_predictions_outside_the_dataset_are_named() -> None:
    by_id: dict[str, Any] = {"a": {}}
    check_known([{"instance_id": "a"}], by_id)
    preds = [{"instance_id": f"n{i}"} for i in range(12)]
    with pytest.raises(ConfigError, match=r"12 prediction\(s\) .* 'n0', .* 'n9' and 2 more"):
        check_known([{"instance_id": "a"}, *preds], by_id)


def test_one_model_per_run() -> None:
    """The outputs are one model's (its log folders, its report): another model's predictions
    would be relabelled, so a mix is refused, naming the models."""
    assert model_of([{"instance_id": "a", "model_name_or_path": "org/m"}] * 2) == "org/m"
    assert model_of([{"instance_id": "a"}]) == model_of([]) == "model"
    mixed = [{"instance_id": "a", "model_name_or_path": m} for m in ("org/m", "org/n")]
    with pytest.raises(ConfigError, match=r"2 models \('org/m', 'org/n'\)"):
        model_of(mixed)


def _grade(tmp: Path, preds: list[dict[str, Any]], rows: list[dict[str, Any]]) -> Any:
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp / "preds.jsonl").write_text("".join(json.dumps(p) + "\n" for p in preds))
    argv = [sys.executable, "-m", "trio_swe.cli", "grade", str(tmp / "preds.jsonl")]
    argv += ["--dataset", str(tmp / "rows.jsonl"), "--run-id", "r", "--out-dir", str(tmp / "out")]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        check=False,
    )


@pytest.mark.swebench
def test_cli_grades_the_last_prediction_and_refuses_unknown_instances(tmp_path: Path) -> None:
    calc = build_calc_repo(tmp_path / "src")
    row = calc.swebench_v5_row(instance_id="calc__calc-1")

    def pred(patch: str, iid: str = "calc__calc-1") -> dict[str, Any]:
        return {"instance_id": iid, "model_name_or_path": "m", "model_patch": patch}

    # Two independent runs, at once (threads: each waits on its process).
    # The gold patch first, an empty one last: the harness grades the empty one. Graded
    # both, the gold one (a sandbox run) would land last and report the instance resolved.
    # And a prediction outside the dataset: refused before anything runs or is written.
    bare = tmp_path / "second"
    bare.mkdir()
    with ThreadPoolExecutor(2) as pool:
        graded = pool.submit(_grade, tmp_path, [pred(calc.gold), pred("")], [row])
        refused = pool.submit(
            _grade, bare, [pred(calc.gold), pred(calc.gold, "calc__calc-404")], [row]
        )
    out = graded.result()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 earlier prediction(s)" in out.stdout
    report = json.loads((tmp_path / "out" / "m.r.json").read_text())
    assert (report["resolved_ids"], report["empty_patch_ids"]) == ([], ["calc__calc-1"])
    assert report["submitted_instances"] == 1
    saved = [json.loads(ln) for ln in (tmp_path / "out" / "predictions.jsonl").open()]
    assert [p["model_patch"] for p in saved] == [""]

    out = refused.result()
    assert out.returncode == 2, out.stdout + out.stderr
    assert "not in the dataset: 'calc__calc-404'" in out.stdout + out.stderr
    assert not (bare / "out").exists()
