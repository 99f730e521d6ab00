"""Exit codes and messages that tell the truth (issue 26 item 1), each tried as a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import EpisodeResult, ResultsWriter
from trio_swe.demo import build_demo_set

from .qwen3 import qwen3_dir

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "TMPDIR": str(tmp), "COLUMNS": "200", **extra}
    for var in ("RAY_ADDRESS", "SWE_DOCKER_BASE_IMAGE", "SWE_TRAIN_PROTOCOL", "SWE_EVAL_PROTOCOL"):
        env.pop(var, None)
    return env


async def _cli(
    *argv: str, cwd: Path, env: dict[str, str] | None = None, argv0: list[str] | None = None
) -> tuple[int, str]:
    with trio.fail_after(120):  # a hang guard only
        proc = await trio.run_process(
            [*(argv0 or [TRIO_SWE]), *argv],
            cwd=str(cwd),
            env=env or _env(cwd),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return proc.returncode, proc.stdout.decode() + proc.stderr.decode()


def _demo_rows(tmp: Path, n: int = 1) -> tuple[Path, list[dict[str, Any]]]:
    rows = build_demo_set(tmp / "repos").rows[:n]
    path = tmp / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path, rows


def _assert_refused(rc: int, out: str, *needles: str) -> None:
    assert rc == 2, out
    assert "Traceback" not in out, out
    for needle in needles:
        assert needle in " ".join(out.split()), out


# --- run: what it was asked to run ---------------------------------------------------------------


async def test_limit_below_one_is_refused(tmp_path: Path) -> None:
    rows, _ = _demo_rows(tmp_path)
    rc, out = await _cli("run", str(rows), "--limit", "-1", cwd=tmp_path)
    _assert_refused(rc, out, "--limit", "must be a whole number >= 1")


async def test_an_empty_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    rc, out = await _cli("run", "empty.jsonl", cwd=tmp_path)
    _assert_refused(rc, out, "'empty.jsonl' has no rows")
    assert not (tmp_path / "results.msgpack").exists()


async def test_a_dataset_whose_every_row_is_skipped_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"instance_id": "a"}\n{"instance_id": "b"}\n')
    rc, out = await _cli("run", "rows.jsonl", cwd=tmp_path)
    _assert_refused(rc, out, "every row of 'rows.jsonl' (2) was skipped", "skipping line 2")


async def test_checkouts_without_the_swebench_protocol_is_refused(tmp_path: Path) -> None:
    rows, _ = _demo_rows(tmp_path)
    rc, out = await _cli(
        "run", str(rows), "--protocol", "scaleswe", "--checkouts", str(tmp_path), cwd=tmp_path
    )
    _assert_refused(rc, out, "--checkouts", "--protocol swebench")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--ray-workers", "2"], "--ray-workers: only used with --ray"),
        (["--max-alive", "3", "--max-booting", "1"], "--max-alive, --max-booting: only used"),
        (["--run-id", "x"], "--run-id names the outputs of --harness-dir"),
    ],
)
async def test_run_flags_that_would_do_nothing_are_refused(
    tmp_path: Path, argv: list[str], needle: str
) -> None:
    rows, _ = _demo_rows(tmp_path)
    rc, out = await _cli("run", str(rows), *argv, cwd=tmp_path)
    _assert_refused(rc, out, needle)


async def test_a_bad_agent_budget_is_named_as_the_flag(tmp_path: Path) -> None:
    rows, _ = _demo_rows(tmp_path)
    rc, out = await _cli("run", str(rows), "--agent-budget", "-1", cwd=tmp_path)
    _assert_refused(rc, out, "--agent-budget -1.0: must be a number of seconds > 0")
    assert "Expected float" not in out
    rc, out = await _cli("demo", "--agent-budget", "0", cwd=tmp_path)
    _assert_refused(rc, out, "--agent-budget", "must be a number of seconds > 0")


async def test_never_gradable_rows_are_not_rerun_on_resume(tmp_path: Path) -> None:
    # Scale-SWE rows under the swebench protocol: each episode is `unevaluable`, no sandbox.
    rows, _ = _demo_rows(tmp_path, n=2)
    argv = ("run", str(rows), "--protocol", "swebench", "--no-progress")
    rc, out = await _cli(*argv, cwd=tmp_path)
    assert rc == 1, out  # every episode aborted
    assert out.count("aborted: unevaluable") >= 1, out
    rc, out = await _cli(*argv, cwd=tmp_path)
    assert rc == 0, out
    flat = " ".join(out.split())
    assert "2 row(s) cannot be graded (protocol_row_mismatch:looks_scaleswe): not run again" in flat
    assert "nothing to run" in flat


# --- results -------------------------------------------------------------------------------------


async def test_results_of_a_file_that_is_not_a_results_file(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"instance_id": "a"}\n')
    rc, out = await _cli("results", "bad.jsonl", cwd=tmp_path)
    _assert_refused(rc, out, "'bad.jsonl' is not a results file")


async def test_results_exported_into_a_missing_folder(tmp_path: Path) -> None:
    result = EpisodeResult(
        instance_id="a", episode_id="a#1", protocol="scaleswe", status="completed", reward=1.0
    )
    with ResultsWriter(tmp_path / "r.msgpack") as writer:
        writer.write(result)
    missing = tmp_path / "nope" / "x.jsonl"
    rc, out = await _cli(
        "results", "r.msgpack", "--format", "jsonl", "-o", str(missing), cwd=tmp_path
    )
    _assert_refused(rc, out, f"-o '{missing}'", "No such file or directory")
    rc, out = await _cli("results", "r.msgpack", "--samples", cwd=tmp_path)
    _assert_refused(rc, out, "--samples: not used with --format table")


# --- grade ---------------------------------------------------------------------------------------


def _predictions(tmp: Path, rows: list[dict[str, Any]], patch: str) -> Path:
    path = tmp / "preds.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "instance_id": r["metadata"]["instance_id"],
                    "model_name_or_path": "m",
                    "model_patch": patch,
                }
            )
            + "\n"
            for r in rows
        )
    )
    return path


async def test_grade_rows_of_another_protocol_are_refused(tmp_path: Path) -> None:
    rows_path, rows = _demo_rows(tmp_path, n=2)
    preds = _predictions(tmp_path, rows, "diff --git a/x b/x\n")
    rc, out = await _cli("grade", str(preds), "--dataset", str(rows_path), cwd=tmp_path)
    _assert_refused(rc, out, "--protocol swebench: every row is another protocol's", "scaleswe")


async def test_grade_reads_slime_style_rows_as_run_does(tmp_path: Path) -> None:
    rows_path, rows = _demo_rows(tmp_path, n=2)
    preds = _predictions(tmp_path, rows, "")  # empty patches: counted, not run
    rc, out = await _cli(
        "grade", str(preds), "--dataset", str(rows_path), "--protocol", "scaleswe", cwd=tmp_path
    )
    assert rc == 0, out
    assert "Instances with empty patches: 2" in out, out


async def test_grade_refuses_a_negative_timeout_and_documents_itself(tmp_path: Path) -> None:
    rows_path, rows = _demo_rows(tmp_path)
    preds = _predictions(tmp_path, rows, "")
    rc, out = await _cli(
        "grade", str(preds), "--dataset", str(rows_path), "--timeout", "-1", cwd=tmp_path
    )
    _assert_refused(rc, out, "--timeout", "must be a number of seconds > 0")
    rc, out = await _cli("grade", "--help", cwd=tmp_path)
    flat = " ".join(out.split())
    assert rc == 0
    assert "Grade existing predictions" in flat
    assert "gradings running at once (default: 4)" in flat


# --- backends, agents, Ray -----------------------------------------------------------------------


async def test_an_unreachable_docker_daemon_is_one_error_at_start(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text(
        json.dumps({"instance_id": "a", "image": "python:3.12", "eval_cmd": "true"}) + "\n"
    )
    env = _env(tmp_path, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    rc, out = await _cli("run", "rows.jsonl", "--backend", "docker", cwd=tmp_path, env=env)
    _assert_refused(rc, out, "the Docker daemon cannot be reached", "DOCKER_HOST")
    assert "boot_failed" not in out


async def test_host_path_rows_on_docker_name_swe_docker_base_image(tmp_path: Path) -> None:
    rows, _ = _demo_rows(tmp_path)
    env = _env(tmp_path, DOCKER_HOST=f"unix://{tmp_path}/no-docker.sock")
    rc, out = await _cli("run", str(rows), "--backend", "docker", cwd=tmp_path, env=env)
    _assert_refused(rc, out, "SWE_DOCKER_BASE_IMAGE")
    rc, out = await _cli("run", "--help", cwd=tmp_path)
    assert "SWE_DOCKER_BASE_IMAGE" in out


async def test_a_cli_agent_without_hypercorn_fails_once_at_start(tmp_path: Path) -> None:
    rows, _ = _demo_rows(tmp_path, n=2)
    # This interpreter with hypercorn made unimportable, as an install without the extra.
    argv0 = [
        sys.executable,
        "-c",
        "import sys; sys.modules['hypercorn'] = None; sys.argv[0] = 'trio-swe'; "
        "from trio_swe.cli import main; sys.exit(main())",
    ]
    env = _env(tmp_path, SWE_TOKENIZER=str(qwen3_dir()))
    rc, out = await _cli(
        "run", str(rows), "--agent", "claude-code", "--no-progress", cwd=tmp_path, env=env,
        argv0=argv0,
    )  # fmt: skip
    _assert_refused(rc, out, "pip install 'trio-swe[gateway]'")
    assert "internal_error" not in out


async def test_ray_auto_without_a_cluster_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    rows, _ = _demo_rows(tmp_path)
    # Ray's "auto" finds a cluster two ways: the last cluster's address in its temp folder (give
    # it an empty one) and any running GCS server in the process table (run the CLI in a PID
    # namespace of its own), so a cluster another test or user runs on this machine is not found.
    env = _env(tmp_path, RAY_TMPDIR=str(tmp_path / "ray"), SWE_RAY_CONNECT_TIMEOUT_SEC="20")
    argv0 = ["bwrap", "--dev-bind", "/", "/", "--unshare-pid", "--proc", "/proc", TRIO_SWE]
    rc, out = await _cli(
        "run", str(rows), "--ray", "auto", "--no-progress", cwd=tmp_path, env=env, argv0=argv0
    )
    _assert_refused(rc, out, "error: --ray auto: Could not find any running Ray instance")
    assert "ExceptionGroup" not in out


async def test_ray_at_an_address_nobody_answers_is_bounded_and_sigterm_is_143(
    tmp_path: Path,
) -> None:
    pytest.importorskip("ray")
    rows, _ = _demo_rows(tmp_path)
    argv = ("run", str(rows), "--ray", "127.0.0.1:1", "--no-progress")
    env = _env(tmp_path, SWE_RAY_CONNECT_TIMEOUT_SEC="2")
    rc, out = await _cli(*argv, cwd=tmp_path, env=env)
    _assert_refused(rc, out, "--ray 127.0.0.1:1: no Ray cluster answered within 2 s")
    # A SIGTERM while connecting ends the run as a signal does: 143, no traceback.
    async with trio.open_nursery() as nursery:
        cmd = [TRIO_SWE, *argv]
        proc: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                cmd,
                cwd=str(tmp_path),
                env=_env(tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
        )
        assert proc.stdout is not None
        seen = b""
        with trio.fail_after(60):
            while b"connecting to the Ray cluster" not in seen:
                chunk = await proc.stdout.receive_some()
                assert chunk, seen.decode()
                seen += chunk
            proc.send_signal(signal.SIGTERM)
            while chunk := await proc.stdout.receive_some():
                seen += chunk
            await proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, seen.decode()
    assert b"Traceback" not in seen, seen.decode()


# --- why, not just what (issue 26 item 2) --------------------------------------------------------


async def test_the_summary_names_each_abort_reason_with_its_message(tmp_path: Path) -> None:
    def aborted(iid: str, reason: str, error: str) -> EpisodeResult:
        return EpisodeResult(
            instance_id=iid,
            episode_id=f"{iid}#1",
            protocol="scaleswe",
            status="aborted",
            abort_reason=reason,  # type: ignore[arg-type]
            error=error,
        )

    with ResultsWriter(tmp_path / "r.msgpack") as writer:
        writer.write(aborted("a", "boot_failed", "ConnectError: all attempts failed"))
        writer.write(aborted("b", "boot_failed", "ConnectError: all attempts failed"))
        writer.write(aborted("c", "boot_failed", "repo has no commit '0123abc'"))
        writer.write(aborted("d", "policy_error", "PolicyError: 503 from the server"))
    rc, out = await _cli("results", "r.msgpack", cwd=tmp_path)
    assert rc == 0, out
    assert "why episodes aborted" in out, out
    lines = out.splitlines()
    first = next(line for line in lines if "ConnectError: all attempts failed" in line)
    assert [c.strip() for c in first.split("│")][1:3] == ["boot_failed", "3"], out
    assert "(2) ConnectError" in first, out
    assert any("(1) repo has no commit '0123abc'" in line for line in lines), out
    assert any("policy_error" in ln and "PolicyError: 503 from the server" in ln for ln in lines)
    # A run says it too, from its own episodes: no policy answers at this address.
    rows, _ = _demo_rows(tmp_path)
    rc, out = await _cli(
        "run", str(rows), "--policy-url", "http://127.0.0.1:1", "--no-progress", cwd=tmp_path
    )
    assert rc == 1, out
    table = out[out.index("why episodes aborted") :]
    assert "policy_error" in table, out
    assert "127.0.0.1:1" in table, out


async def test_policy_flags_are_checked_at_start(tmp_path: Path) -> None:
    """The engine's API and the sampling flags: refused with the flag named, before any run.
    (Six independent CLI runs, at once.)"""
    path, _ = _demo_rows(tmp_path)
    runs = {
        "vllm": ["demo", "--policy-api", "vllm", "--no-progress"],
        "url": ["demo", "--policy-url", "http://127.0.0.1:9"],
        "openai": ["run", str(path), "--policy-api", "openai"],
    }
    for flag, value in (("--temperature", "-1"), ("--top-p", "0"), ("--seed", "-3")):
        runs[flag] = ["run", str(path), flag, value, "--out", "r.msgpack"]
    got: dict[str, tuple[int, str]] = {}

    async def one(name: str) -> None:
        got[name] = await _cli(*runs[name], cwd=tmp_path)

    async with trio.open_nursery() as nursery:
        for name in runs:
            nursery.start_soon(one, name)
    _assert_refused(*got["vllm"], "--policy-api names a real engine's API: give --policy-url")
    _assert_refused(*got["url"], "--policy-url", "give --tokenizer PATH")
    for flag in ("--temperature", "--top-p", "--seed"):
        _assert_refused(*got[flag], flag)
        assert not (tmp_path / "r.msgpack").exists()
    rc, out = got["openai"]
    assert rc == 2, out
    assert "invalid choice: 'openai'" in out
