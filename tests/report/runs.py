"""Results of real runs for the report's tests: ``trio-swe run`` as a process on the demo set.

Three runs into one results file (frames concatenate): the demo's rows twice over with the
scripted policy (two episodes per instance, each row its own group; completed and truncated
episodes), three rows against a policy URL where nothing listens (``policy_error`` aborts), and
one row whose image does not exist (an ``unevaluable`` abort).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import trio

from trio_swe.demo import build_demo_set, open_scripted_policy_server

TRIO_SWE = str(Path(sys.executable).parent / "trio-swe")


def env(tmp: Path) -> dict[str, str]:
    # TMPDIR keeps the local backend's state under tmp; PYTHONPATH: this checkout's trio_swe.
    root = str(Path(__file__).resolve().parents[2])
    pythonpath = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "TMPDIR": str(tmp), "COLUMNS": "160", "PYTHONPATH": pythonpath}


async def _run(tmp: Path, rows: list[dict[str, object]], out: Path, policy_url: str) -> None:
    path = out.with_suffix(".jsonl")
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cmd = [
        TRIO_SWE, "run", str(path), "--out", str(out), "--no-progress", "--no-network",
        "--policy-url", policy_url, "--concurrency", "2", "--agent-budget", "4",
        "--eval-timeout", "60",
    ]  # fmt: skip
    done = await trio.run_process(
        cmd, env=env(tmp), capture_stdout=True, capture_stderr=True, check=False
    )
    # 0: some episodes were graded; 1: every one was aborted (what the abort runs are for).
    assert done.returncode in (0, 1), done.stdout.decode() + done.stderr.decode()


async def make_results(tmp: Path) -> Path:
    """A results file of 20 real episodes: 16 graded (8 instances x 2), 4 aborted."""
    demo = build_demo_set(tmp / "repos")
    parts = [tmp / "graded.msgpack", tmp / "no-policy.msgpack", tmp / "no-repo.msgpack"]
    missing = json.loads(json.dumps(demo.rows[0]))
    meta = missing["metadata"]
    meta["instance_id"] = "demo__missing-1"
    meta["image"] = f"{tmp}/repos/no-such-repo@{meta['image'].rpartition('@')[2]}"

    async def graded() -> None:
        async with open_scripted_policy_server(demo.scripts) as server:
            await _run(tmp, demo.rows * 2, parts[0], server.url)

    # The three runs are independent: at once. Nothing listens on the discard port of
    # loopback: the policy is unreachable.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(graded)
        nursery.start_soon(_run, tmp, demo.rows[:3], parts[1], "http://127.0.0.1:9")
        nursery.start_soon(_run, tmp, [missing], parts[2], "http://127.0.0.1:9")
    out = tmp / "results.msgpack"
    out.write_bytes(b"".join(p.read_bytes() for p in parts))
    return out
