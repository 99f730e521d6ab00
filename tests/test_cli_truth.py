"""The CLI tells the truth (issue 11 item 9), tried as a new user would: as a real process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import msgspec
import pytest
import trio

import trio_swe
from trio_swe import EpisodeResult, ResultsWriter, read_results
from trio_swe.cli._parser import build_parser as _parser
from trio_swe.demo import build_demo_set

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")


async def _run(*argv: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    proc = await trio.run_process(
        [TRIO_SWE, *argv],
        cwd=str(cwd),
        env={**os.environ, "TMPDIR": str(cwd), "COLUMNS": "160", **(env or {})},
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


def test_help_shows_defaults_their_sources_and_examples(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWE_TRAIN_PROTOCOL", raising=False)
    top = _parser().format_help()
    assert "examples:" in top
    assert "trio-swe results results.msgpack --format predictions" in top
    run_help = _parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    flat = " ".join(run_help.split())
    # --protocol's default is where it really comes from, not "scaleswe" alone.
    assert "default: scaleswe, or $SWE_TRAIN_PROTOCOL when set" in flat
    assert "agents running at once" in flat  # --concurrency has help text
    assert "cap of a sample's tokens" in flat  # --max-context-tokens has help text
    assert "(default: 4)" in flat
    assert "(default: results.msgpack)" in flat
    # A variable set in the environment is shown as the default in force.
    monkeypatch.setenv("SWE_TRAIN_PROTOCOL", "swebench")
    run_help = _parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    assert "default: $SWE_TRAIN_PROTOCOL='swebench' here; scaleswe when unset" in " ".join(
        run_help.split()
    )


async def test_version(tmp_path: Path) -> None:
    rc, out = await _run("--version", cwd=tmp_path)
    assert rc == 0
    assert out.strip() == f"trio-swe {trio_swe.__version__}"


async def test_a_missing_instances_file_is_one_line_and_creates_nothing(tmp_path: Path) -> None:
    rc, out = await _run("run", "nope.jsonl", "--out", "res.msgpack", cwd=tmp_path)
    assert rc == 2, out
    assert out.strip() == "error: instances file 'nope.jsonl' does not exist"
    assert "Traceback" not in out
    assert not (tmp_path / "res.msgpack").exists()


async def test_an_instances_line_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"instance_id": "a"}\n' + "[" * 100_000 + "\n")
    rc, out = await _run("run", "rows.jsonl", "--out", "res.msgpack", cwd=tmp_path)
    assert rc == 2, out
    assert out.strip().startswith("error: ")
    assert "rows.jsonl:2: not JSON: JSON nested too deeply" in out
    assert "Traceback" not in out


def _unevaluable_rows(tmp_path: Path) -> Path:
    demo = build_demo_set(tmp_path / "repos")
    rows = []
    for row in demo.rows[:3]:
        row = json.loads(json.dumps(row))
        del row["metadata"]["eval_cmd"]  # no grader at all: aborted before anything boots
        rows.append(row)
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


async def test_a_run_where_every_episode_aborted_exits_non_zero_and_reruns_add_no_duplicates(
    tmp_path: Path,
) -> None:
    rows = _unevaluable_rows(tmp_path)
    out = tmp_path / "res.msgpack"
    argv = ("run", str(rows), "--out", str(out), "--no-progress", "--no-network")
    rc, text = await _run(*argv, cwd=tmp_path)
    assert rc == 1, text
    assert "every episode of this run was aborted (3)" in text
    first, _ = read_results(out)
    assert sorted(r.abort_reason or "" for r in first) == ["unevaluable"] * 3
    # The rerun does not retry rows the protocol can never grade (issue 26): nothing to run.
    rc, text = await _run(*argv, cwd=tmp_path)
    assert rc == 0, text
    assert "3 row(s) cannot be graded (no_grader): not run again" in text
    second, intact = read_results(out)
    assert intact == out.stat().st_size
    assert [r.episode_id for r in second] == [r.episode_id for r in first]


def _result(iid: str, status: str, patch: str, reward: float = 0.0) -> EpisodeResult:
    return EpisodeResult(
        instance_id=iid,
        episode_id=f"{iid}#{status}",
        protocol="scaleswe",
        status=status,  # type: ignore[arg-type]
        abort_reason="boot_failed" if status == "aborted" else None,
        reward=reward,
        patch=patch.encode(),
    )


async def test_results_shows_and_exports_a_results_file(tmp_path: Path) -> None:
    path = tmp_path / "res.msgpack"
    with ResultsWriter(path) as writer:
        writer.write(_result("a", "completed", "diff a1\n", 1.0))
        writer.write(_result("b", "aborted", ""))
        writer.write(_result("a", "truncated", "diff a2\n"))
        writer.write(_result("c", "completed", "diff c\n", 1.0))

    rc, table = await _run("results", str(path), cwd=tmp_path)
    assert rc == 0, table
    assert "aborted: boot_failed" in table
    assert "summary" in table

    rc, text = await _run("results", str(path), "--format", "jsonl", cwd=tmp_path)
    assert rc == 0, text
    docs = [json.loads(line) for line in text.splitlines()]
    assert [(d["instance_id"], d["status"], d["patch"]) for d in docs] == [
        ("a", "completed", "diff a1\n"),
        ("b", "aborted", ""),
        ("a", "truncated", "diff a2\n"),
        ("c", "completed", "diff c\n"),
    ]
    assert all(d["n_samples"] == 0 and "samples" not in d for d in docs)
    # Each line reads back as the EpisodeResult it came from.
    doc = {k: v for k, v in docs[0].items() if k != "n_samples"}
    doc["patch"] = doc["patch"].encode()
    assert msgspec.convert(doc, EpisodeResult) == _result("a", "completed", "diff a1\n", 1.0)

    predictions = tmp_path / "predictions.jsonl"
    rc, text = await _run(
        "results", str(path), "--format", "predictions", "--model", "m1", "-o", str(predictions),
        cwd=tmp_path,
    )  # fmt: skip
    assert rc == 0, text
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    # One per instance: its last episode that was not aborted; aborted-only instances left out.
    assert lines == [
        {"instance_id": "a", "model_name_or_path": "m1", "model_patch": "diff a2\n"},
        {"instance_id": "c", "model_name_or_path": "m1", "model_patch": "diff c\n"},
    ]


async def test_results_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    rc, out = await _run("results", "nope.msgpack", cwd=tmp_path)
    assert rc == 2
    assert out.strip() == "error: results file 'nope.msgpack' does not exist"
