"""``trio-swe run --harness-dir``: a run's episodes leave SWE-bench's harness outputs, end to end.

``trio-swe run`` runs as a real process: the bash agent, driven by the scripted policy server on
loopback, works in real local sandboxes on the calc repository (a real git repository), and the
swebench protocol grades its patches with swebench's own eval script and parsers (a classic
row's script built by swebench 4.x, or the 5.x row's own). Three agents: one applies the fix,
one gives up (an empty patch), one breaks a PASS_TO_PASS test. The outputs are read back by
swebench's own code (``make_run_report`` over the log folders, ``get_eval_report`` on each
``test_output.txt``) and checked field by field against the harness's format (its
``predictions.jsonl`` keys, its report keys, its per-instance folder).
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
import trio

from trio_swe.demo import open_scripted_policy_server
from trio_swe.grading import _swebench_api as sw
from trio_swe.grading import get_metadata
from trio_swe.results import read_results

from ._calc import FIXED, CalcRepo, build_calc_repo, git
from .test_harness_outputs import HARNESS_KEYS

pytestmark = pytest.mark.swebench
ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "rl-step-7"
MODEL = "trio_swe__bash"  # what `trio-swe run` names the model: the agent
FOLDER_FILES = {"patch.diff", "eval.sh", "test_output.txt", "report.json", "run_instance.log"}


def _apply_cmd(patch: str) -> str:
    return (
        "Apply the change.\n```bash\ncat > /tmp/change.diff <<'EOF_CHANGE'\n"
        f"{patch}EOF_CHANGE\ngit apply /tmp/change.diff && git status --short\n```"
    )


SUBMIT = "Done.\n```bash\nsubmit\n```"


def _rows(calc: CalcRepo) -> list[dict[str, Any]]:
    api = sw.get_api()
    assert api is not None
    # The row shape each major grades: classic rows on 4.x (its script builder), 5.x rows on 5.x.
    shape = calc.swebench_classic_row if api.major < 5 else calc.swebench_v5_row
    return [shape(instance_id=f"calc__calc-{k}") for k in ("gold", "giveup", "break")]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[CalcRepo, Path, list[dict[str, Any]]]:
    tmp = tmp_path_factory.mktemp("run")
    calc = build_calc_repo(tmp / "src")
    rows = _rows(calc)
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    scripts = {
        "calc__calc-gold": [_apply_cmd(calc.gold), SUBMIT],
        "calc__calc-giveup": [SUBMIT],
        "calc__calc-break": [_apply_cmd(calc.break_p2p), SUBMIT],
    }

    async def run() -> subprocess.CompletedProcess[bytes]:
        async with open_scripted_policy_server(scripts) as server:
            cmd = [
                sys.executable, "-m", "trio_swe.cli", "run", str(tmp / "rows.jsonl"),
                "--out", str(tmp / "results.msgpack"), "--no-progress", "--no-network",
                "--policy-url", server.url, "--protocol", "swebench", "--concurrency", "3",
                "--agent-budget", "120", "--eval-timeout", "300",
                "--harness-dir", str(tmp / "harness"), "--run-id", RUN_ID,
            ]  # fmt: skip
            with trio.fail_after(900):  # a hang guard only
                return await trio.run_process(
                    cmd,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                    env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
                )

    out = trio.run(run)
    text = out.stdout.decode() + out.stderr.decode()
    assert out.returncode == 0, text
    # swebench's import makes the root logger INFO: httpx's per-request lines stay out.
    assert "HTTP Request:" not in text, text
    assert f"harness outputs: {tmp / 'harness' / f'{MODEL}.{RUN_ID}.json'}" in text
    return calc, tmp, rows


def test_results_and_report_agree(ran: tuple[CalcRepo, Path, list[dict[str, Any]]]) -> None:
    _, tmp, _ = ran
    results, _ = read_results(tmp / "results.msgpack")
    rewards = {r.instance_id: r.reward for r in results}
    assert rewards == {"calc__calc-gold": 1.0, "calc__calc-giveup": 0.0, "calc__calc-break": 0.0}
    report = json.loads((tmp / "harness" / f"{MODEL}.{RUN_ID}.json").read_text())
    assert set(HARNESS_KEYS) <= set(report)
    assert report["resolved_ids"] == ["calc__calc-gold"]
    assert report["unresolved_ids"] == ["calc__calc-break"]
    assert report["empty_patch_ids"] == ["calc__calc-giveup"]
    assert (report["error_ids"], report["incomplete_ids"]) == ([], [])
    assert sorted(report["submitted_ids"]) == sorted(rewards)
    assert report["completed_ids"] == ["calc__calc-break", "calc__calc-gold"]
    counts = ("total_instances", "submitted_instances", "completed_instances")
    assert [report[k] for k in counts] == [3, 3, 2]
    assert (report["resolved_instances"], report["unresolved_instances"]) == (1, 1)
    assert (report["empty_patch_instances"], report["error_instances"]) == (1, 0)


def test_predictions_are_the_agents_patches(
    ran: tuple[CalcRepo, Path, list[dict[str, Any]]],
) -> None:
    calc, tmp, _ = ran
    lines = (tmp / "harness" / "predictions.jsonl").read_text().splitlines()
    preds = {p["instance_id"]: p for p in map(json.loads, lines)}
    assert sorted(preds) == ["calc__calc-break", "calc__calc-giveup", "calc__calc-gold"]
    for p in preds.values():
        assert set(p) == {"instance_id", "model_name_or_path", "model_patch"}
        assert p["model_name_or_path"] == MODEL
    assert preds["calc__calc-giveup"]["model_patch"] == ""
    # The gold agent's patch (taken from its sandbox) makes the gold tree from base.
    clone = tmp / "check"
    git(tmp, "clone", "-q", str(calc.path), str(clone))
    git(clone, "checkout", "-q", calc.base)
    (tmp / "gold.diff").write_text(preds["calc__calc-gold"]["model_patch"])
    git(clone, "apply", str(tmp / "gold.diff"))
    assert (clone / "calc" / "__init__.py").read_text() == FIXED


def test_swebench_make_run_report_reads_the_run_the_same(
    ran: tuple[CalcRepo, Path, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, tmp, rows = ran
    from swebench.harness.reporting import make_run_report

    out = tmp / "harness"
    lines = (out / "predictions.jsonl").read_text().splitlines()
    preds = {p["instance_id"]: p for p in map(json.loads, lines)}
    work = tmp / "theirs"
    work.mkdir(exist_ok=True)
    (work / "logs").symlink_to(out / "logs")
    monkeypatch.chdir(work)  # swebench reads logs/run_evaluation/... and writes its report here
    with contextlib.redirect_stdout(io.StringIO()):
        path = make_run_report(preds, rows, RUN_ID)
    theirs = json.loads(Path(path).read_text())
    ours = json.loads((out / f"{MODEL}.{RUN_ID}.json").read_text())
    assert Path(path).name == f"{MODEL}.{RUN_ID}.json"  # the same file name as the harness's
    shared = set(theirs) & set(ours)
    assert set(HARNESS_KEYS) <= shared
    assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}


def test_instance_folders_are_what_swebench_grades(
    ran: tuple[CalcRepo, Path, list[dict[str, Any]]],
) -> None:
    calc, tmp, rows = ran
    out = tmp / "harness"
    lines = (out / "predictions.jsonl").read_text().splitlines()
    preds = {p["instance_id"]: p for p in map(json.loads, lines)}
    api = sw.get_api()
    assert api is not None
    model_dir = out / "logs" / "run_evaluation" / RUN_ID / MODEL
    for iid, resolved in (("calc__calc-gold", True), ("calc__calc-break", False)):
        d = model_dir / iid
        assert {p.name for p in d.iterdir()} >= FOLDER_FILES
        row = next(r for r in rows if r["instance_id"] == iid)
        spec = sw.build_test_spec(get_metadata(row, "swebench"))
        assert (d / "patch.diff").read_text() == preds[iid]["model_patch"]
        # The script that ran: swebench's, without what follows the recorded exit code.
        assert (d / "eval.sh").read_text() == sw.run_script(spec.eval_script)
        assert f"git checkout {calc.base} tests/test_calc.py" in spec.eval_script
        log = (d / "test_output.txt").read_text()
        # The whole log, from the script's first traced command to its last.
        assert log.startswith("+ ")
        end = log.index(">>>>> End Test Output")
        assert log.index(">>>>> Start Test Output") < end
        assert log.index(">>>>> Test Exit Code: ", end) > end
        assert "+ git checkout" not in log[end:]  # the reset for a container that lives on
        theirs = api.get_eval_report(
            test_spec=spec,
            prediction={"instance_id": iid, "model_patch": preds[iid]["model_patch"]},
            test_log_path=str(d / "test_output.txt"),
            include_tests_status=True,
        )
        assert json.loads((d / "report.json").read_text()) == theirs
        assert theirs[iid]["resolved"] is resolved
        status = theirs[iid]["tests_status"]
        assert status["FAIL_TO_PASS"]["failure"] == []
        if not resolved:
            assert status["PASS_TO_PASS"]["failure"] == ["tests/test_calc.py::test_add"]
        expected = "resolved" if resolved else "tests_failed"
        assert f"reason: {expected}" in (d / "run_instance.log").read_text()


def test_run_s_local_backend_options(tmp_path: Path) -> None:
    from trio_swe import ConfigError
    from trio_swe.cli._parser import build_parser as _parser
    from trio_swe.cli.run import config_from_args as _config_from_args
    from trio_swe.cli.run import local_options as _local_options

    def options(*argv: str) -> dict[str, Any] | None:
        args = _parser().parse_args(["run", "rows.jsonl", *argv])
        return _local_options(args, _config_from_args(args, {}))

    assert options() is None  # scaleswe rows: the backend as it is
    shims = options("--protocol", "swebench")
    assert shims is not None
    assert "/opt/miniconda3/bin/activate" in shims["ro_binds"]
    assert shims["extra_path"] == [str(Path(sys.executable).parent)]
    venv = options("--python-env", str(tmp_path))
    assert venv is not None
    assert venv["extra_path"] == [str(tmp_path)]
    images = options("--checkouts", str(tmp_path))
    assert images is not None
    assert callable(images["images"])
    with pytest.raises(ConfigError, match="local backend options"):
        options("--backend", "e2b", "--python-env", str(tmp_path))
