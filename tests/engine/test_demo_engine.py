"""``trio-swe demo --policy-url`` against the real engine, as a user runs it (a process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trio_swe.results import read_results
from trio_swe.testing._engine import VLLMEngine


def test_the_demo_runs_against_the_engine_and_reports_what_it_recorded(
    engine: VLLMEngine, checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "results.msgpack"
    done = subprocess.run(
        [
            sys.executable, "-m", "trio_swe.cli", "demo",
            "--policy-url", engine.url, "--policy-api", "vllm", "--tokenizer", str(checkpoint),
            "--max-new-tokens", "32", "--temperature", "0.7", "--seed", "5",
            "--no-progress", "--out", str(out),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "SWE_ILL_FORMED_POLICY": "train", "COLUMNS": "200"},
        timeout=900,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"the engine at {engine.url} (vllm)" in done.stdout
    results, _ = read_results(out)
    assert len(results) == 8
    assert all(r.status != "aborted" for r in results)
    trained = sum(sum(s.loss_mask) for r in results for s in r.samples)
    assert trained > 0
    assert f"({trained} trained)" in done.stdout
    # The seed reached the engine: each episode's turns were sampled with their own seeds.
    assert all(r.n_turns > 0 for r in results)
