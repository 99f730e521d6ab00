"""``trio-swe run --backend e2b`` as a real process, against the local envd server over TLS."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from trio_swe.demo import build_demo_set
from trio_swe.results import read_results
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing import open_envd_server, open_scripted_policy_server

from .test_cli import TRIO_SWE
from .test_episode_support import processes_mentioning

PICKED = ("demo__calc-1", "demo__leap-1", "demo__words-1")


@pytest.mark.slow
async def test_run_on_the_e2b_backend_interrupted_then_resumed(tmp_path: Path) -> None:
    demo = build_demo_set(tmp_path / "repos")
    rows = [r for r in demo.rows if r["label"] in PICKED]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "results.msgpack"
    images = [r["metadata"]["image"] for r in rows]
    state = tmp_path / "state"
    async with (
        open_envd_server(
            backend=LocalBackend(state_dir=state), templates={i: i for i in images}, tls=True
        ) as server,
        open_scripted_policy_server(demo.scripts) as policy,
    ):
        # E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN, E2B_API_KEY and SSL_CERT_FILE (the test CA).
        env = {**os.environ, "COLUMNS": "160", "TMPDIR": str(tmp_path), **server.sdk_env()}
        env.pop("E2B_DEBUG", None)
        cmd = [
            TRIO_SWE, "run", str(dataset), "--out", str(out),
            "--no-progress", "--no-network", "--policy-url", policy.url,
            "--agent-budget", "30", "--eval-timeout", "60",
        ]  # fmt: skip

        # First run, one episode at a time: Ctrl-C once the first has finished, so the second
        # is cancelled midway; the CLI must kill its sandbox on the server before exiting.
        async with trio.open_nursery() as nursery:
            proc: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [*cmd, "--backend", "e2b", "--concurrency", "1"],
                    env=env,
                    stdout=subprocess.PIPE,
                    check=False,
                )
            )
            assert proc.stdout is not None
            seen = b""
            while b"\ndone " not in b"\n" + seen:
                chunk = await proc.stdout.receive_some()
                assert chunk, seen.decode()
                seen += chunk
            # The second episode's sandbox is up on the server: interrupt now.
            with trio.fail_after(60):
                while not server.live_sandbox_ids():  # noqa: ASYNC110 - polls server state
                    await trio.sleep(0.01)
            proc.send_signal(signal.SIGINT)
            # The CLI turns the signal into a cancellation (a KeyboardInterrupt raised wherever
            # the code was once left a sandbox alive: 1 run in 17), then says so and cleans up.
            with trio.fail_after(120):
                while chunk := await proc.stdout.receive_some():
                    seen += chunk
                await proc.wait()
        assert proc.returncode == 130
        assert b"interrupted: cleaning up" in seen, seen.decode()
        assert server.live_sandbox_ids() == []
        first, _ = read_results(out)
        finished = [r.instance_id for r in first if r.status != "aborted"]
        assert 1 <= len(finished) < len(PICKED)

        # Second run: the rest, concurrently; the backend from SWE_BACKEND this time.
        second = await trio.run_process(
            [*cmd, "--concurrency", "3"],
            env={**env, "SWE_BACKEND": "e2b"},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        live = server.live_sandbox_ids()
        stats = server.statistics()
    text = second.stdout.decode() + second.stderr.decode()
    assert second.returncode == 0, text
    assert f"{len(PICKED) - len(finished)} episodes to run ({len(finished)} already" in text
    assert "backend e2b" in text
    results, intact = read_results(out)
    assert intact == out.stat().st_size
    done = [r for r in results if r.status != "aborted"]
    assert sorted(r.instance_id for r in done) == sorted(PICKED)
    for r in done:
        assert r.status == "completed", (r.instance_id, r.abort_reason, r.error)
        assert r.reward == demo.expected_rewards[r.instance_id]
        assert len(r.samples) == 1
    # Nothing left on the server: every sandbox either run created was killed by the client.
    assert live == []
    assert stats.sandboxes_created == stats.sandboxes_killed, stats
    assert processes_mentioning(str(state)) == []


async def test_run_with_an_unknown_swe_backend_names_the_choices(tmp_path: Path) -> None:
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("")
    proc = await trio.run_process(
        [TRIO_SWE, "run", str(dataset), "--out", str(tmp_path / "out.msgpack")],
        env={**os.environ, "SWE_BACKEND": "podman", "COLUMNS": "160"},  # docker is one now
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    text = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 2, text
    assert "SWE_BACKEND='podman'" in text
    assert "'local', 'e2b'" in text
