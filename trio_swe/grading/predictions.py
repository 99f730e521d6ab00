"""Grading existing predictions as SWE-bench's harness does (``trio-swe grade`` is its CLI).

Predictions are what ``swebench.harness.run_evaluation --predictions_path`` reads: JSONL (one
``{instance_id, model_name_or_path, model_patch}`` per line), a JSON list of those, or a JSON
object keyed by instance id. Every prediction is graded in a fresh sandbox with the row's
protocol (default ``swebench``); empty patches are not run (the harness counts them as
``empty_patch``). Outputs: ``predictions.jsonl``, per-instance log folders and the run report
``<model>.<run_id>.json`` under ``--out-dir`` (see ``trio_swe.grading._harness``).

A public module of its own rather than a re-export of :mod:`trio_swe.grading`: it builds on that
package's functions, so the package importing it back would close a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from .._errors import ConfigError, InvalidArgumentError, MetadataError, TrioSweError
from .._json import loads
from ..sandbox import Backend
from . import (
    check_rows,
    evaluability_check,
    get_metadata,
    grade,
    resolve_image,
)
from ._harness import HarnessOutputs
from ._metadata import instance_id_of

__all__ = [
    "check_known",
    "grade_predictions",
    "index_rows",
    "latest_predictions",
    "model_of",
    "pair",
    "read_dataset",
    "read_predictions",
]


def read_predictions(path: Path) -> list[dict[str, Any]]:
    """Predictions from a JSONL file, a JSON list or a JSON object keyed by instance id."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"predictions {path}: {exc.strerror or exc}") from None
    items: list[Any]
    try:
        whole = loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, list):
        items = whole
    elif isinstance(whole, dict) and "instance_id" not in whole:
        items = [{"instance_id": k, **v} if isinstance(v, dict) else v for k, v in whole.items()]
    else:
        items = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                items.append(loads(line))
            except ValueError as exc:
                raise ConfigError(f"{path}:{lineno}: not JSON: {exc}") from None
    out: list[dict[str, Any]] = []
    for i, p in enumerate(items):
        if not isinstance(p, dict) or not isinstance(p.get("instance_id"), str):
            raise ConfigError(f"{path}: prediction {i} has no instance_id")
        patch = p.get("model_patch")
        if patch is not None and not isinstance(patch, str):
            raise ConfigError(f"{path}: prediction {p['instance_id']!r}: model_patch is not text")
        out.append(p)
    return out


def read_dataset(path: Path) -> list[dict[str, Any]]:
    """Dataset rows from JSONL or a JSON list."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"dataset {path}: {exc.strerror or exc}") from None
    try:
        whole = loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, list):
        rows = whole
    elif isinstance(whole, dict):
        rows = [whole]
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(loads(line))
                except ValueError as exc:
                    raise ConfigError(f"{path}:{lineno}: not JSON: {exc}") from None
    if not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"dataset {path}: every row must be a JSON object")
    return rows


def index_rows(rows: list[dict[str, Any]], source: str = "dataset") -> dict[str, dict[str, Any]]:
    """The rows by instance id (read as :func:`~trio_swe.grading.get_metadata` reads it).

    Raises:
        ConfigError: a row without a text ``instance_id``, or two different rows with one
            (which of them to grade against would be a guess; identical copies are fine).
    """
    by_id: dict[str, dict[str, Any]] = {}
    first: dict[str, int] = {}
    for i, row in enumerate(rows):
        # As `run` reads it: slime-style rows keep theirs under `metadata` (or `label`).
        try:
            iid = instance_id_of(row)
        except MetadataError as exc:
            raise ConfigError(f"{source}: row {i}: {exc}") from None
        if iid == "unknown":
            raise ConfigError(f"{source}: row {i} has no instance_id")
        if iid in by_id and by_id[iid] != row:
            raise ConfigError(
                f"{source}: rows {first[iid]} and {i} differ but share instance_id {iid!r}"
            )
        by_id.setdefault(iid, row)
        first.setdefault(iid, i)
    return by_id


def latest_predictions(predictions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One prediction per instance id: the last one given, as swebench's ``run_evaluation``
    keeps (it maps instance id to prediction), in the order the ids first came."""
    latest: dict[str, dict[str, Any]] = {}
    for pred in predictions:
        latest[pred["instance_id"]] = pred
    return list(latest.values())


def model_of(predictions: list[dict[str, Any]]) -> str:
    """The predictions' ``model_name_or_path`` (``"model"`` when none is given).

    Raises:
        ConfigError: they name more than one model: the outputs are written for one model (its
            log folders, its report), and relabelling the others' predictions would misreport
            them; grade each model's predictions in a run of its own.
    """
    names = {str(p.get("model_name_or_path") or "model") for p in predictions}
    if len(names) > 1:
        shown = ", ".join(repr(n) for n in sorted(names)[:5])
        raise ConfigError(
            f"predictions name {len(names)} models ({shown}): grade each model's in its own run"
        )
    return names.pop() if names else "model"


def check_known(predictions: list[dict[str, Any]], by_id: Mapping[str, Any]) -> None:
    """Raises ConfigError naming the predictions whose instance is not in the dataset, as
    swebench's harness refuses them (before anything runs: a wrong dataset file is the usual
    cause, and grading the rest would report a run that is not the one asked for)."""
    unknown = [p["instance_id"] for p in predictions if p["instance_id"] not in by_id]
    if unknown:
        shown = ", ".join(repr(i) for i in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise ConfigError(
            f"{len(unknown)} prediction(s) name instances not in the dataset: {shown}{more}"
        )


def pair(
    predictions: list[dict[str, Any]], rows: list[dict[str, Any]], source: str = "dataset"
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The predictions to grade (:func:`latest_predictions`) and the rows by instance id
    (:func:`index_rows`), every prediction's instance checked to be there (:func:`check_known`).

    Raises:
        ConfigError: as those say.
    """
    by_id = index_rows(rows, source)
    latest = latest_predictions(predictions)
    check_known(latest, by_id)
    return latest, by_id


async def grade_predictions(
    predictions: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    backend: Backend,
    outputs: HarnessOutputs,
    *,
    protocol: str = "swebench",
    timeout_sec: float = 1800.0,
    concurrency: int = 4,
    on_done: Callable[[str, str], None] | None = None,
) -> dict[str, Any]:
    """Grade ``predictions`` against ``rows`` and write the harness's outputs; the run report.

    Predictions for one instance: the last one is graded (:func:`pair`).

    Raises:
        ConfigError: this install cannot grade the dataset (e.g. the swebench version), or the
            predictions and rows do not pair up (:func:`pair`); raised before anything runs.
    """
    predictions, by_id = pair(predictions, rows)
    check_rows(rows, protocol)
    limiter = trio.CapacityLimiter(concurrency)
    done = on_done or (lambda iid, what: None)

    async def one(pred: dict[str, Any]) -> None:
        iid = pred["instance_id"]
        patch = pred.get("model_patch") or ""
        row = by_id[iid]
        if not patch.strip():  # not run: the harness's empty_patch
            outputs.add_prediction(iid, patch)
            done(iid, "empty patch")
            return
        try:
            md = resolve_image(backend, get_metadata(row, protocol))
        except MetadataError as exc:
            outputs.record(iid, patch, None, None, note=f"unreadable row: {exc}")
            done(iid, "error")
            return
        reason = evaluability_check(md, backend)
        if reason is not None:
            outputs.record(iid, patch, None, None, note=f"unevaluable: {reason}")
            done(iid, f"error ({reason.split(':', 1)[0]})")
            return
        async with limiter:
            try:
                graded = await grade(backend, md, patch, timeout_sec=timeout_sec)
            except InvalidArgumentError as exc:  # a patch no encoding can write: nothing ran
                done(iid, f"error ({type(exc).__name__})")
                return
            except Exception as exc:
                outputs.record(iid, patch, None, None, note=f"{type(exc).__name__}: {exc}")
                if not isinstance(exc, TrioSweError):
                    raise
                done(iid, f"error ({type(exc).__name__})")
                return
        outputs.record(iid, patch, graded.result, graded.artifacts)
        done(iid, graded.result.reason)

    async with trio.open_nursery() as nursery:
        for pred in predictions:
            nursery.start_soon(one, pred)
    return outputs.write_report(by_id)
