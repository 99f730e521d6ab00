"""Dataset rows as users hold them, and the selection of the ones to run.

Reading (a thin I/O edge, :func:`read_rows`):

* a JSONL file (one row per line) or a JSON list;
* a Parquet file (``.parquet``);
* a folder saved by Hugging Face ``datasets`` (``Dataset.save_to_disk``: Arrow stream files
  listed in ``state.json``; a ``DatasetDict`` keeps one such folder per split, listed in
  ``dataset_dict.json``), or a Hub-style folder of ``<split>-*.parquet`` files;
  ``split`` picks the split where there are several.

Parquet and Arrow are read with pyarrow (``pip install 'trio-swe[parquet]'``), imported only then.

Selecting (sans-IO, :func:`select_rows`): by instance ids, by a regular expression on the
instance id, shuffled with a seed, sliced ``A:B``; in that order, so ``shuffle`` then ``slice``
is a reproducible random sample.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ._errors import ConfigError, MetadataError
from ._json import loads
from .grading import instance_id_of

__all__ = [
    "Row",
    "Selection",
    "parse_slice",
    "read_instance_ids",
    "read_rows",
    "row_id",
    "select_rows",
]


class Row(msgspec.Struct, frozen=True):
    """A dataset row and where it came from (``line 3``, ``row 3``), for messages."""

    where: str
    data: dict[str, Any]


class Selection(msgspec.Struct, frozen=True, kw_only=True):
    """Which rows of a dataset to run.

    Attributes:
        instance_ids: only these (each must be in the dataset), in the dataset's order.
        pattern: only the rows whose instance id matches this regular expression (``re.search``).
        shuffle_seed: shuffle (``random.Random(seed)``) before slicing.
        start, stop: a Python slice of what is left (``None``: open).
    """

    instance_ids: tuple[str, ...] = ()
    pattern: str | None = None
    shuffle_seed: int | None = None
    start: int | None = None
    stop: int | None = None


def parse_slice(text: str) -> tuple[int | None, int | None]:
    """``"A:B"``, ``":B"``, ``"A:"`` as Python's slice bounds (negative counts from the end).

    Raises:
        ConfigError: not of that form.
    """
    parts = text.split(":")
    if len(parts) != 2:
        raise ConfigError(f"--slice {text!r}: expected A:B (e.g. 0:100, :50, 100:)")
    bounds: list[int | None] = []
    for part in parts:
        part = part.strip()
        try:
            bounds.append(int(part) if part else None)
        except ValueError:
            raise ConfigError(f"--slice {text!r}: {part!r} is not a whole number") from None
    return bounds[0], bounds[1]


def row_id(row: Row) -> str | None:
    """The row's instance id as the grading reads it, or None when it cannot be read."""
    try:
        iid = instance_id_of(row.data)
    except MetadataError:
        return None
    return None if iid == "unknown" else iid


def select_rows(rows: Sequence[Row], selection: Selection) -> list[Row]:
    """The rows ``selection`` asks for (see :class:`Selection`); unreadable rows stay in only
    when nothing selects by id (the run then reports them).

    Raises:
        ConfigError: an instance id asked for is not in the dataset, or the pattern is not a
            regular expression.
    """
    out = list(rows)
    if selection.instance_ids:
        wanted = set(selection.instance_ids)
        present = {row_id(r) for r in out}
        missing = [i for i in selection.instance_ids if i not in present]
        if missing:
            shown = ", ".join(repr(i) for i in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise ConfigError(f"--instance-ids: not in the dataset: {shown}{more}")
        out = [r for r in out if row_id(r) in wanted]
    if selection.pattern is not None:
        try:
            regex = re.compile(selection.pattern)
        except re.error as exc:
            raise ConfigError(f"--filter {selection.pattern!r}: {exc}") from None
        out = [r for r in out if (iid := row_id(r)) is not None and regex.search(iid)]
    if selection.shuffle_seed is not None:
        random.Random(selection.shuffle_seed).shuffle(out)
    return out[selection.start : selection.stop]


def read_instance_ids(text: str) -> tuple[str, ...]:
    """``--instance-ids``: a comma-separated list, or a file of ids (one per line, or commas)."""
    if os.path.isfile(text):
        try:
            text = Path(text).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--instance-ids {text!r}: {exc}") from None
    ids = tuple(i.strip() for i in re.split(r"[,\n]", text) if i.strip())
    if not ids:
        raise ConfigError("--instance-ids: no id given")
    return ids


# --- reading ------------------------------------------------------------------------------------


def read_rows(path: str | os.PathLike[str], *, split: str | None = None) -> list[Row]:
    """Every row of a dataset file or folder (see the module's docstring).

    Raises:
        ConfigError: the path does not exist or cannot be read, a row is not an object, the
            split is missing or ambiguous, or pyarrow is needed and not installed.
    """
    p = Path(path)
    if p.is_dir():
        return _read_folder(p, split)
    if not p.exists():
        raise ConfigError(f"instances file {str(p)!r} does not exist")
    if split is not None:
        raise ConfigError(f"--split {split!r}: names a split of a dataset folder, not of a file")
    if p.suffix == ".parquet":
        return _records(_pyarrow_table([p]), "row")
    if p.suffix in (".arrow",):
        return _records(_arrow_tables([p]), "row")
    return _read_json_rows(p)


def _read_json_rows(path: Path) -> list[Row]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"instances file {str(path)!r} cannot be read: {exc}") from None
    if text.lstrip().startswith("["):  # a JSON list
        try:
            whole = loads(text)
        except ValueError as exc:
            raise ConfigError(f"{path}: not JSON: {exc}") from None
        return _checked(((f"row {i}", r) for i, r in enumerate(whole, 1)), path)
    rows: list[tuple[str, Any]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"line {lineno}", loads(line)))
        except ValueError as exc:
            raise ConfigError(f"{path}:{lineno}: not JSON: {exc}") from None
    return _checked(rows, path)


def _checked(rows: Iterable[tuple[str, Any]], path: Path) -> list[Row]:
    out = []
    for where, row in rows:
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: {where}: a row must be a JSON object")
        out.append(Row(where, row))
    return out


def _read_folder(folder: Path, split: str | None) -> list[Row]:
    """A ``save_to_disk`` folder (a Dataset or a DatasetDict) or a folder of Parquet files."""
    splits_file = folder / "dataset_dict.json"
    if splits_file.is_file():
        splits = [str(s) for s in _json_file(splits_file).get("splits", [])]
        chosen = _choose_split(folder, splits, split)
        return _read_folder(folder / chosen, None)
    state = folder / "state.json"
    if state.is_file():
        if split is not None:
            raise ConfigError(f"--split {split!r}: {folder} holds one split only")
        files = [folder / str(f["filename"]) for f in _json_file(state).get("_data_files", [])]
        if not files:
            raise ConfigError(f"{folder}/state.json lists no data files")
        return _records(_arrow_tables(files), "row")
    parquet = sorted(folder.rglob("*.parquet"))
    if parquet:
        # Hub layout: data/<split>-00000-of-00001.parquet
        by_split: dict[str, list[Path]] = {}
        for f in parquet:
            by_split.setdefault(f.name.split("-", 1)[0], []).append(f)
        chosen = _choose_split(folder, sorted(by_split), split)
        return _records(_pyarrow_table(by_split[chosen]), "row")
    raise ConfigError(
        f"{folder} is not a dataset folder: no dataset_dict.json or state.json "
        "(datasets' save_to_disk) and no .parquet files"
    )


def _choose_split(folder: Path, splits: Sequence[str], split: str | None) -> str:
    if split is not None:
        if split not in splits:
            raise ConfigError(
                f"--split {split!r}: {folder} has {', '.join(repr(s) for s in splits)}"
            )
        return split
    if len(splits) == 1:
        return splits[0]
    raise ConfigError(
        f"{folder} has splits {', '.join(repr(s) for s in splits)}: choose one with --split"
    )


def _json_file(path: Path) -> dict[str, Any]:
    try:
        doc = loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return doc


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ConfigError(
            "reading Parquet or Arrow needs pyarrow: pip install 'trio-swe[parquet]'"
        ) from None
    return pyarrow


def _pyarrow_table(files: Sequence[Path]) -> Any:
    pa = _pyarrow()
    import pyarrow.parquet as pq

    try:
        return pa.concat_tables([pq.read_table(f) for f in files])
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{files[0]}: not readable as Parquet: {exc}") from None


def _arrow_tables(files: Sequence[Path]) -> Any:
    """Arrow files as ``datasets`` writes them (the IPC stream format; the file format too)."""
    pa = _pyarrow()
    tables = []
    for f in files:
        try:
            with pa.memory_map(str(f)) as source:
                try:
                    tables.append(pa.ipc.open_stream(source).read_all())
                except pa.ArrowInvalid:
                    source.seek(0)
                    tables.append(pa.ipc.open_file(source).read_all())
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"{f}: not readable as Arrow: {exc}") from None
    return pa.concat_tables(tables)


def _records(table: Any, label: str) -> list[Row]:
    return [Row(f"{label} {i}", dict(r)) for i, r in enumerate(table.to_pylist(), 1)]
