"""The ``trio-swe`` console script, run as a real process: ``demo``, and ``run`` with resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio

from trio_swe.demo import build_demo_set, open_scripted_policy_server
from trio_swe.results import read_results

from .test_episode_support import processes_mentioning

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")


def _env(tmp_path: Path) -> dict[str, str]:
    # TMPDIR puts the local backend's state under tmp_path, so leftovers can be checked.
    return {**os.environ, "TMPDIR": str(tmp_path), "COLUMNS": "160"}


def _assert_no_sandboxes(tmp_path: Path) -> None:
    state = tmp_path / f"trio_swe-{os.getuid()}"
    assert processes_mentioning(str(state)) == []
    assert sorted(state.glob("sb-*")) == []


async def _signal_run(
    cmd: list[str], tmp_path: Path, *, after: bytes, signum: int
) -> tuple[trio.Process, bytes]:
    """Start ``trio-swe run``, send ``signum`` once its output shows ``after``, await the exit."""
    async with trio.open_nursery() as nursery:
        proc: trio.Process = await nursery.start(
            partial(trio.run_process, cmd, env=_env(tmp_path), stdout=subprocess.PIPE, check=False)
        )
        assert proc.stdout is not None
        seen = b""
        while after not in seen:
            chunk = await proc.stdout.receive_some()
            assert chunk, seen.decode()
            seen += chunk
        proc.send_signal(signum)
        with trio.fail_after(120):
            while chunk := await proc.stdout.receive_some():
                seen += chunk
            await proc.wait()
    return proc, seen


@pytest.mark.slow
async def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    result = await trio.run_process(
        [TRIO_SWE, "demo", "--no-progress", "--concurrency", "4"],
        env=_env(tmp_path),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert "8/8 episodes earned the reward their script plays for" in out
    assert "MISMATCH" not in out
    _assert_no_sandboxes(tmp_path)
    assert _demo_dirs(tmp_path) == []  # demo repositories removed


def _demo_dirs(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("trio_swe-demo-*"))


@pytest.mark.slow
async def test_run_interrupted_then_resumed_loses_nothing(tmp_path: Path) -> None:
    demo = build_demo_set(tmp_path / "repos")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in demo.rows))
    out = tmp_path / "results.msgpack"
    async with open_scripted_policy_server(demo.scripts) as server:
        cmd = [
            TRIO_SWE, "run", str(rows), "--out", str(out), "--no-progress", "--no-network",
            "--policy-url", server.url, "--concurrency", "4", "--agent-budget", "8",
            "--eval-timeout", "60",
        ]  # fmt: skip
        # First run: interrupt it (Ctrl-C) as soon as one episode has finished.
        proc, _ = await _signal_run(cmd, tmp_path, after=b"\ndone ", signum=signal.SIGINT)
        assert proc.returncode == 130
        first, _ = read_results(out)
        assert 1 <= len(first) < 8
        _assert_no_sandboxes(tmp_path)

        # Second run: resumes, skipping what finished.
        second_run = await trio.run_process(
            cmd, env=_env(tmp_path), capture_stdout=True, capture_stderr=True, check=False
        )
    text = second_run.stdout.decode()
    assert second_run.returncode == 0, text + second_run.stderr.decode()
    finished_before = sum(1 for r in first if r.status != "aborted")
    assert f"{8 - finished_before} episodes to run ({finished_before} already finished" in text
    results, intact = read_results(out)
    assert intact == out.stat().st_size
    done = [r for r in results if r.status != "aborted"]
    assert sorted(r.instance_id for r in done) == sorted(demo.expected_rewards)
    for r in done:
        assert r.reward == demo.expected_rewards[r.instance_id]
        assert len(r.samples) == 1
    _assert_no_sandboxes(tmp_path)


async def test_sigterm_cancels_the_run_cleanly(tmp_path: Path) -> None:
    # A scheduler's SIGTERM is handled as Ctrl-C is: the run is cancelled, sandboxes are
    # killed, and the exit code says which signal (128 + 15).
    demo = build_demo_set(tmp_path / "repos")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in demo.rows))
    out = tmp_path / "results.msgpack"
    async with open_scripted_policy_server(demo.scripts) as server:
        cmd = [
            TRIO_SWE, "run", str(rows), "--out", str(out), "--no-progress", "--no-network",
            "--policy-url", server.url, "--concurrency", "2", "--agent-budget", "8",
            "--eval-timeout", "60",
        ]  # fmt: skip
        proc, seen = await _signal_run(
            cmd, tmp_path, after=b"episodes to run", signum=signal.SIGTERM
        )
    assert proc.returncode == 143, seen.decode()
    assert b"interrupted: cleaning up" in seen
    assert b"rerun the same command to resume" in seen
    _assert_no_sandboxes(tmp_path)
