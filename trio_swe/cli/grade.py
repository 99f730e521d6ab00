"""``trio-swe grade PREDICTIONS --dataset ROWS``: grade existing predictions as SWE-bench's
harness does and write its outputs (``--run-id``, ``--out-dir``); see ``docs/grading.md``.

Predictions are what ``swebench.harness.run_evaluation --predictions_path`` reads: JSONL (one
``{instance_id, model_name_or_path, model_patch}`` per line), a JSON list of those, or a JSON
object keyed by instance id. The grading itself is :func:`trio_swe.grading.predictions.grade_predictions`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .._errors import ConfigError, MetadataError
from ..grading import (
    HarnessOutputs,
    evaluability_check,
    get_metadata,
    local_backend_shims,
    local_checkouts,
    require_protocol,
)
from ..grading.predictions import (
    grade_predictions,
    model_of,
    pair,
    read_dataset,
    read_predictions,
)
from ..sandbox import open_backend
from .run import check_backend

__all__ = ["cmd_grade"]


async def cmd_grade(args: argparse.Namespace, console: Console) -> int:
    require_protocol(args.protocol)
    given = read_predictions(Path(args.predictions))
    rows = read_dataset(Path(args.dataset))
    # Checked here too, before the outputs' directory is made.
    predictions, by_id = pair(given, rows, f"dataset {args.dataset}")
    check_protocol_fits(predictions, by_id, args.protocol)
    model = model_of(predictions)
    outputs = HarnessOutputs(args.out_dir, args.run_id, model)
    options: dict[str, Any] = {}
    if args.backend == "local":
        images = local_checkouts(args.checkouts) if args.checkouts else None
        options = {**local_backend_shims(args.python_env), "images": images}
    console.print(f"grading {len(predictions)} predictions against {len(rows)} rows ({model})")
    if len(given) > len(predictions):
        console.print(
            f"  {len(given) - len(predictions)} earlier prediction(s) for an instance that has a "
            "later one: the last one is graded, as swebench's harness does"
        )

    def done(iid: str, what: str) -> None:
        console.print(f"  {escape(iid)}: {escape(what)}")

    async with open_backend(args.backend, options) as backend:
        await check_backend(backend)
        report = await grade_predictions(
            predictions,
            rows,
            backend,
            outputs,
            protocol=args.protocol,
            timeout_sec=args.timeout,
            concurrency=args.concurrency,
            on_done=done,
        )
    # As the harness prints its summary.
    console.print(f"Total instances: {report['total_instances']}")
    for label, key in (
        ("submitted", "submitted_instances"),
        ("completed", "completed_instances"),
        ("incomplete", "incomplete_ids"),
        ("resolved", "resolved_instances"),
        ("unresolved", "unresolved_instances"),
        ("with empty patches", "empty_patch_instances"),
        ("with errors", "error_instances"),
    ):
        value = report[key]
        console.print(f"Instances {label}: {len(value) if isinstance(value, list) else value}")
    console.print(f"report: {escape(str(outputs.report_path()))}")
    errors = _count(report["error_instances"])
    if errors and errors == _count(report["submitted_instances"]) - _count(
        report["empty_patch_instances"]
    ):
        console.print(f"[red]every graded prediction ended in an error ({errors})")
        return 1
    return 0


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list) else int(value)


def check_protocol_fits(
    predictions: list[dict[str, Any]], by_id: Mapping[str, Mapping[str, Any]], protocol: str
) -> None:
    """Refuse a run whose every row is another protocol's (each would be an error)."""
    reasons: set[str] = set()
    for pred in predictions:
        try:
            md = get_metadata(by_id[pred["instance_id"]], protocol)
        except MetadataError:
            return  # recorded per instance as an unreadable row
        reason = evaluability_check(md)
        if reason is None or not reason.startswith("protocol_row_mismatch"):
            return
        reasons.add(reason)
    if reasons:
        hint = (
            {
                "protocol_row_mismatch:looks_scaleswe": " (they look like scaleswe rows: "
                "--protocol scaleswe)",
                "protocol_row_mismatch:looks_swebench": " (they look like swebench rows: "
                "--protocol swebench)",
            }.get(next(iter(reasons)), "")
            if len(reasons) == 1
            else ""
        )
        raise ConfigError(
            f"--protocol {protocol}: every row is another protocol's "
            f"({', '.join(sorted(reasons))}){hint}"
        )
