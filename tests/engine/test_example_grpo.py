"""examples/grpo_step.py as a user runs it: in the engine's environment, against the engine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from trio_swe.testing._engine import VLLMEngine, engine_python

EXAMPLE = Path(__file__).parents[2] / "examples" / "grpo_step.py"


def test_one_grpo_step_on_policy_at_step_zero(engine: VLLMEngine, checkpoint: Path) -> None:
    done = subprocess.run(
        [
            str(engine_python()), str(EXAMPLE), "--policy-url", engine.url,
            "--checkpoint", str(checkpoint), "--limit", "2", "--n-per-instance", "3",
            "--temperature", "0.7",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(EXAMPLE.parents[1]), "HF_HUB_OFFLINE": "1"},
        timeout=900,
        check=False,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    groups = re.findall(r"group (\S+): rewards \[([^\]]*)\]", done.stdout)
    assert len(groups) == 2
    assert all(len(rewards.split(",")) == 3 for _, rewards in groups)
    m = re.search(r"(\d+) trained tokens; loss (\S+); \|ratio - 1\| max (\S+) mean", done.stdout)
    assert m is not None, done.stdout
    assert int(m.group(1)) > 0
    assert float(m.group(3)) <= 1e-3
