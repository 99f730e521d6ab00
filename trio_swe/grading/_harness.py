"""The SWE-bench harness's own outputs for a run, so a run compares with the official harness.

Layout (as ``python -m swebench.harness.run_evaluation`` writes it, relative to ``root``)::

    predictions.jsonl                        instance_id, model_name_or_path, model_patch
    <model>.<run_id>.json                    the run report (make_run_report's keys)
    logs/run_evaluation/<run_id>/<model>/<instance_id>/
        patch.diff                           the graded patch
        eval.sh                              the script that ran the tests
        test_output.txt                      the full test output (stdout and stderr, in order)
        report.json                          the per-instance report (get_eval_report's format)
        run_instance.log                     what trio_swe did: outcome, reason, durations

``<model>`` is ``model_name_or_path`` with ``/`` spelled ``__``. ``report.json`` is written only
for a graded test log, so the run report counts the rest (patch not applied, timeouts,
infrastructure) as errors, as the harness does; empty patches are ``empty_patch`` instances.

What is here: :class:`HarnessOutputs`, which writes those files; :func:`run_report`, the run
report as swebench's ``make_run_report`` counts it; and :func:`tests_status_report`, the
per-instance report in ``get_eval_report``'s format for graders other than swebench's (the
``scaleswe`` protocol puts it in its artifacts).

Nothing here runs a grading: a protocol's ``grade`` returns what it graded (an
:class:`~trio_swe.grading.Graded`: the result and its :class:`~trio_swe.grading.EvalArtifacts`),
and whoever consumes it hands the result and the artifacts to :meth:`HarnessOutputs.record`:
``trio-swe grade`` (:func:`~trio_swe.grading.predictions.grade_predictions`) and
``trio-swe run --harness-dir`` (:func:`trio_swe.results.harness_record`, from each episode's
``eval_result`` and ``eval_artifacts``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from ._result import EvalArtifacts, EvalResult

RUN_EVALUATION_LOG_DIR: Final = Path("logs/run_evaluation")
#: Outcomes whose test log was graded: they get a ``report.json``.
GRADED_REASONS: Final = frozenset({"resolved", "tests_failed", "log_ungradable"})


def tests_status_report(
    result: EvalResult, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]
) -> dict[str, Any]:
    """A per-instance report in ``get_eval_report``'s format from a result's statuses (for
    graders other than swebench, which produces its own)."""
    from ._testlog import status_of

    def split(tests: Sequence[str]) -> dict[str, list[str]]:
        ok = [t for t in tests if status_of(result.tests_status, t) in ("PASSED", "XFAIL")]
        passed = set(ok)  # rows list thousands of PASS_TO_PASS tests
        return {"success": ok, "failure": [t for t in tests if t not in passed]}

    return {
        "patch_is_None": False,
        "patch_exists": True,
        "patch_successfully_applied": result.applied_cleanly and result.reason in GRADED_REASONS,
        "resolved": result.resolved,
        "tests_status": {
            "FAIL_TO_PASS": split(fail_to_pass),
            "PASS_TO_PASS": split(pass_to_pass),
            "FAIL_TO_FAIL": {"success": [], "failure": []},
            "PASS_TO_FAIL": {"success": [], "failure": []},
        },
    }


class HarnessOutputs:
    """Writes a run's predictions, per-instance log folders and run report under ``root``.

    Args:
        root: the directory the harness would run in (created).
        run_id: the run's id (``--run_id``).
        model_name_or_path: the predictions' model name.
    """

    def __init__(self, root: str | os.PathLike[str], run_id: str, model_name_or_path: str) -> None:
        if not run_id or "/" in run_id or run_id in (".", ".."):
            raise ValueError(f"run_id {run_id!r}: use a non-empty name without '/'")
        self.root = Path(root).absolute()
        self.run_id = run_id
        self.model = model_name_or_path
        self.predictions: dict[str, dict[str, Any]] = {}
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def model_dir(self) -> Path:
        return self.root / RUN_EVALUATION_LOG_DIR / self.run_id / self.model.replace("/", "__")

    def instance_dir(self, instance_id: str) -> Path:
        if not instance_id or "/" in instance_id or instance_id in (".", ".."):
            raise ValueError(f"instance id {instance_id!r} cannot name a log folder")
        return self.model_dir / instance_id

    def add_prediction(self, instance_id: str, patch: str) -> None:
        """Record a prediction (also done by :meth:`record`)."""
        self.predictions[instance_id] = {
            "instance_id": instance_id,
            "model_name_or_path": self.model,
            "model_patch": patch,
        }
        self._write_predictions()

    def record(
        self,
        instance_id: str,
        patch: str,
        result: EvalResult | None,
        artifacts: EvalArtifacts | None,
        *,
        note: str = "",
    ) -> Path:
        """Write one instance's folder (``result`` None: the grading raised, ``note`` says how)."""
        self.add_prediction(instance_id, patch)
        d = self.instance_dir(instance_id)
        d.mkdir(parents=True, exist_ok=True)
        for stale in ("report.json", "test_output.txt", "eval.sh"):
            (d / stale).unlink(missing_ok=True)
        _write(d / "patch.diff", patch)
        lines = [f"instance_id: {instance_id}", f"run_id: {self.run_id}", f"model: {self.model}"]
        if artifacts is not None and artifacts.eval_script:
            _write(d / "eval.sh", artifacts.eval_script)
        if artifacts is not None and artifacts.test_output:
            _write(d / "test_output.txt", artifacts.test_output)
        if result is not None:
            lines += [
                f"reason: {result.reason}",
                f"resolved: {result.resolved}",
                f"reward: {result.reward}",
                f"infra_failure: {result.infra_failure}",
                f"apply_method: {result.apply_method}",
                f"grader: {result.grader}",
                f"detail: {result.detail}",
                f"test_exit_code: {result.test_exit_code}",
                "durations: " + json.dumps(dict(result.durations), sort_keys=True),
            ]
            report = artifacts.report if artifacts is not None else None
            if result.reason in GRADED_REASONS and report is not None:
                _write(d / "report.json", json.dumps({instance_id: report}, indent=4))
        if note:
            lines.append(f"error: {note}")
        _write(d / "run_instance.log", "\n".join(lines) + "\n")
        return d

    def _write_predictions(self) -> None:
        text = "".join(json.dumps(p) + "\n" for p in self.predictions.values())
        _write(self.root / "predictions.jsonl", text)

    def report_path(self) -> Path:
        return self.root / f"{self.model.replace('/', '__')}.{self.run_id}.json"

    def write_report(self, dataset_ids: Iterable[str]) -> dict[str, Any]:
        """Write ``<model>.<run_id>.json``: the run report with the harness's keys."""
        report = run_report(self.predictions, list(dataset_ids), self.model_dir)
        _write(self.report_path(), json.dumps(report, indent=4) + "\n")
        return report


def run_report(
    predictions: Mapping[str, Mapping[str, Any]], dataset_ids: Sequence[str], model_dir: Path
) -> dict[str, Any]:
    """The run report, key for key as swebench's ``make_run_report`` (without Docker) makes it."""
    completed, resolved, unresolved, errors, incomplete, empty = (set[str]() for _ in range(6))
    for iid in dataset_ids:
        pred = predictions.get(iid)
        if pred is None:
            incomplete.add(iid)
            continue
        if pred.get("model_patch") in ("", None):
            empty.add(iid)
            continue
        path = model_dir / iid / "report.json"
        if not path.exists():
            errors.add(iid)
            continue
        completed.add(iid)
        try:
            content = path.read_text().strip()
            if not content:
                errors.add(iid)
                continue
            (resolved if json.loads(content)[iid]["resolved"] else unresolved).add(iid)
        except (ValueError, KeyError):
            errors.add(iid)
    return {
        "total_instances": len(dataset_ids),
        "submitted_instances": len(predictions),
        "completed_instances": len(completed),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(unresolved),
        "empty_patch_instances": len(empty),
        "error_instances": len(errors),
        "completed_ids": sorted(completed),
        "incomplete_ids": sorted(incomplete),
        "empty_patch_ids": sorted(empty),
        "submitted_ids": sorted(predictions),
        "resolved_ids": sorted(resolved),
        "unresolved_ids": sorted(unresolved),
        "error_ids": sorted(errors),
        "schema_version": 2,
        "unstopped_instances": 0,
        "unstopped_containers": [],
        "unremoved_images": [],
    }


def _write(path: Path, text: str) -> None:
    """Write atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8", errors="surrogateescape")
    os.replace(tmp, path)
