"""Datasets as users hold them (issue 26 item 3): JSONL, Parquet, Hugging Face `datasets`
folders, and the selection of rows; through `trio-swe run` as a real process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import ConfigError, read_results
from trio_swe.datasets import Row, Selection, parse_slice, read_rows, row_id, select_rows
from trio_swe.demo import build_demo_set

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")


def _rows(n: int) -> list[Row]:
    return [Row(f"line {i}", {"instance_id": f"repo__p-{i}", "image": "x"}) for i in range(n)]


def test_selection_by_ids_pattern_shuffle_and_slice() -> None:
    rows = _rows(10)
    ids = [row_id(r) for r in select_rows(rows, Selection(instance_ids=("repo__p-7", "repo__p-2")))]
    assert ids == ["repo__p-2", "repo__p-7"]  # the dataset's order
    ids = [row_id(r) for r in select_rows(rows, Selection(pattern=r"-[13]$"))]
    assert ids == ["repo__p-1", "repo__p-3"]
    assert select_rows(rows, Selection(start=2, stop=4)) == rows[2:4]
    assert select_rows(rows, Selection(start=-2)) == rows[-2:]
    a = select_rows(rows, Selection(shuffle_seed=7, stop=5))
    assert a == select_rows(rows, Selection(shuffle_seed=7, stop=5))  # reproducible
    assert a != rows[:5]
    assert a != select_rows(rows, Selection(shuffle_seed=8, stop=5))
    with pytest.raises(ConfigError, match=r"--instance-ids: not in the dataset: 'nope'"):
        select_rows(rows, Selection(instance_ids=("repo__p-1", "nope")))
    with pytest.raises(ConfigError, match=r"--filter '\(': "):
        select_rows(rows, Selection(pattern="("))


def test_slices_parse_as_python_s() -> None:
    assert parse_slice("0:100") == (0, 100)
    assert parse_slice(":5") == (None, 5)
    assert parse_slice("-10:") == (-10, None)
    for bad in ("5", "1:2:3", "a:b"):
        with pytest.raises(ConfigError, match="--slice"):
            parse_slice(bad)


def _demo_rows(tmp: Path) -> list[dict[str, Any]]:
    return build_demo_set(tmp / "repos").rows


def test_parquet_and_datasets_folders_read_as_the_jsonl(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = _demo_rows(tmp_path)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    expected = [r.data for r in read_rows(jsonl)]
    assert expected == rows
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    assert [r.data for r in read_rows(tmp_path / "rows.parquet")] == expected
    # datasets' save_to_disk: one Dataset, and a DatasetDict of two splits.
    one = datasets.Dataset.from_list(rows)
    one.save_to_disk(str(tmp_path / "one"))
    assert [r.data for r in read_rows(tmp_path / "one")] == expected
    both = datasets.DatasetDict({"train": one.select(range(2)), "test": one})
    both.save_to_disk(str(tmp_path / "dd"))
    assert [r.data for r in read_rows(tmp_path / "dd", split="test")] == expected
    assert [r.data for r in read_rows(tmp_path / "dd", split="train")] == expected[:2]
    with pytest.raises(ConfigError, match=r"has splits 'train', 'test': choose one with --split"):
        read_rows(tmp_path / "dd")
    with pytest.raises(ConfigError, match=r"--split 'dev': .* has 'train', 'test'"):
        read_rows(tmp_path / "dd", split="dev")
    # The Hub's layout: data/<split>-NNNNN-of-NNNNN.parquet
    (tmp_path / "hub" / "data").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows[:3]), tmp_path / "hub" / "data" / "test-00000-of-00001.parquet"
    )
    assert [r.data for r in read_rows(tmp_path / "hub")] == expected[:3]
    with pytest.raises(ConfigError, match="not a dataset folder"):
        read_rows(tmp_path / "repos" / "demo__calc-1")


async def _cli(*argv: str, cwd: Path) -> tuple[int, str]:
    env = {**os.environ, "TMPDIR": str(cwd), "COLUMNS": "200"}
    with trio.fail_after(120):  # a hang guard only
        proc = await trio.run_process(
            [TRIO_SWE, *argv], cwd=str(cwd), env=env, capture_stdout=True, capture_stderr=True,
            check=False,
        )  # fmt: skip
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


async def test_run_selects_rows_of_a_parquet_file_and_exports_parquet(tmp_path: Path) -> None:
    rows = _demo_rows(tmp_path)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    ids = sorted(r["metadata"]["instance_id"] for r in rows)
    # Scale-SWE rows under the swebench protocol end at once as `unevaluable` (no sandbox), so
    # the results file says which rows the selection ran.
    base = ("run", "rows.parquet", "--protocol", "swebench", "--no-progress")
    runs = {
        "a": ("--filter", "^demo__(calc|fizz|leap)", "--out", "a.msgpack"),
        "b": ("--instance-ids", f"{ids[3]},{ids[1]}", "--out", "b.msgpack"),
        "c": ("--shuffle", "3", "--slice", "1:4", "--out", "c.msgpack"),
        "d": ("--shuffle", "3", "--slice", "1:4", "--out", "d.msgpack"),
        "none": ("--filter", "^nothing"),
    }
    done: dict[str, tuple[int, str]] = {}

    async def one(name: str) -> None:
        done[name] = await _cli(*base, *runs[name], cwd=tmp_path)

    # Independent runs (each its own results file): at once, as a loaded machine's CPU allows.
    async with trio.open_nursery() as nursery:
        for name in runs:
            nursery.start_soon(one, name)
    for name in ("a", "b", "c", "d"):
        assert done[name][0] == 1, done[name][1]
    assert sorted(r.instance_id for r in read_results(tmp_path / "a.msgpack")[0]) == [
        "demo__calc-1", "demo__fizz-1", "demo__leap-1",
    ]  # fmt: skip
    assert sorted(r.instance_id for r in read_results(tmp_path / "b.msgpack")[0]) == [
        ids[1], ids[3],
    ]  # fmt: skip
    picked = [[r.instance_id for r in read_results(tmp_path / f"{n}.msgpack")[0]] for n in "cd"]
    assert len(picked[0]) == 3
    assert sorted(picked[0]) == sorted(picked[1])  # the same seed, the same sample
    rc, out = done["none"]
    assert rc == 2, out
    assert "the selection leaves none of the 8 rows" in out
    # Exports as Parquet beside JSONL: the same rows.
    rc, out = await _cli(
        "results", "a.msgpack", "--format", "jsonl", "-o", "a.parquet", cwd=tmp_path
    )
    assert rc == 0, out
    table = pq.read_table(tmp_path / "a.parquet")
    assert sorted(table.column("instance_id").to_pylist()) == [
        "demo__calc-1", "demo__fizz-1", "demo__leap-1",
    ]  # fmt: skip
    assert set(table.column("abort_reason").to_pylist()) == {"unevaluable"}
