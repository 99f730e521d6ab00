"""``trio-swe run --backend docker`` as a real process, against the test dockerd."""

from __future__ import annotations

import json
import os
import subprocess
from functools import partial
from pathlib import Path

import trio

from trio_swe.demo import build_demo_set, open_scripted_policy_server
from trio_swe.results import read_results

from .dockerenv import DockerEnv
from .test_cli import TRIO_SWE

PICKED = ("demo__calc-1", "demo__words-1", "demo__stack-1")


async def test_run_on_the_docker_backend(docker_env: DockerEnv, tmp_path: Path) -> None:
    demo = build_demo_set(tmp_path / "repos")
    rows = [r for r in demo.rows if r["label"] in PICKED]
    dataset = tmp_path / "rows.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "results.msgpack"
    env = {
        **os.environ,
        "COLUMNS": "160",
        "TMPDIR": str(tmp_path),
        "DOCKER_HOST": docker_env.docker_host,
        # The demo rows are path@commit images: copied into containers of the base image.
        "SWE_DOCKER_BASE_IMAGE": docker_env.base_image,
    }
    log = tmp_path / "cli.log"
    async with open_scripted_policy_server(demo.scripts) as policy, trio.open_nursery() as nursery:
        with open(log, "wb") as sink:  # noqa: ASYNC230 (a local log file, opened once)
            proc: trio.Process = await nursery.start(
                partial(
                    trio.run_process,
                    [
                        TRIO_SWE, "run", str(dataset), "--out", str(out), "--backend", "docker",
                        "--no-progress", "--no-network", "--policy-url", policy.url,
                        "--concurrency", "3", "--agent-budget", "60", "--eval-timeout", "60",
                    ],
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            )  # fmt: skip
            await proc.wait()
    text = log.read_text()
    assert proc.returncode == 0, text
    results, _ = read_results(out)
    assert {r.instance_id: r.reward for r in results} == {
        i: demo.expected_rewards[i] for i in PICKED
    }, text
    # Every container the CLI made is gone (their owner label names its pid).
    owners = docker_env.docker(
        "ps", "-a", "--filter", "label=trio_swe.sandbox", "--format", '{{.Label "trio_swe.owner"}}'
    ).split()
    assert [o for o in owners if o.split("/")[2] == str(proc.pid)] == []
