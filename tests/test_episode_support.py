"""Helpers shared by the episode, rollout, aio and CLI tests (no tests here)."""

from __future__ import annotations

import os
from pathlib import Path

from trio_swe import Sample, SweConfig
from trio_swe.config import replace_option
from trio_swe.demo import DemoSet, build_demo_set
from trio_swe.grading import InstanceMetadata, get_metadata
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing import ScriptedCompletion, scripted_logprob

END = "<|im_end|>"


#: demo_config's keywords -> the option they set.
_OPTION_PATHS = {
    "agent_time_budget_sec": "episode.agent_time_budget_sec",
    "eval_timeout_sec": "episode.eval_timeout_sec",
    "setup_timeout_sec": "episode.setup_timeout_sec",
    "rollout_guard_sec": "episode.rollout_guard_sec",
    "guard_headroom_sec": "episode.guard_headroom_sec",
    "max_context_tokens": "episode.max_context_tokens",
    "ill_formed_policy": "episode.ill_formed_policy",
    "boot_concurrency": "boot.concurrency",
    "boot_retries": "boot.retries",
    "boot_backoff_sec": "boot.backoff_sec",
    "max_turns": "bash.max_turns",
    "policy_url": "bash.policy_url",
    "command_timeout_sec": "bash.command_timeout_sec",
    "backend": "backend",
}


def demo_config(**overrides: object) -> SweConfig:
    """Budgets for the demo set in tests: an 8 s agent budget makes the slow script time out."""
    values: dict[str, object] = {
        "agent_time_budget_sec": 8.0,
        "eval_timeout_sec": 60.0,
        "setup_timeout_sec": 60.0,
        "guard_headroom_sec": 60.0,
        "boot_concurrency": 8,
        "max_turns": 10,
        "command_timeout_sec": 30.0,
        "boot_backoff_sec": 0.1,
    }
    values.update(overrides)
    config = SweConfig()
    for name, value in values.items():
        config = replace_option(config, _OPTION_PATHS[name], value)
    return config


def build_demo(tmp_path: Path) -> tuple[DemoSet, list[InstanceMetadata], LocalBackend]:
    """The demo set under ``tmp_path``, its metadata, and a backend whose state lives there."""
    demo = build_demo_set(tmp_path / "repos")
    mds = [get_metadata(row, "scaleswe") for row in demo.rows]
    return demo, mds, LocalBackend(state_dir=tmp_path / "state")


def processes_mentioning(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (our sandboxes: their state dir)."""
    found = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def assert_nothing_left(tmp_path: Path, backend: LocalBackend) -> None:
    """No live sandbox, no process of ours, no sandbox state directory."""
    stats = backend.statistics()
    assert stats.live == 0, stats
    assert stats.created == stats.killed, stats
    assert processes_mentioning(str(tmp_path / "state")) == []
    assert sorted((tmp_path / "state").glob("sb-*")) == []


def script_text(completion: str | ScriptedCompletion) -> str:
    return completion.text if isinstance(completion, ScriptedCompletion) else completion


def trained_runs(sample: Sample) -> list[list[int]]:
    """Indices (in the response region) of each maximal run of loss-1 tokens."""
    mask = sample.loss_mask_list()
    runs: list[list[int]] = []
    current: list[int] = []
    for i, m in enumerate(mask):
        if m:
            current.append(i)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return runs


def assert_sample_matches_script(sample: Sample, trained_texts: list[str]) -> None:
    """Every loss-1 token is an output token of the script, with its own scripted log-prob."""
    tokens = sample.tokens_list()
    log_probs = sample.rollout_log_probs_list()
    mask = sample.loss_mask_list()
    rl = sample.response_length
    assert len(mask) == len(log_probs) == rl > 0
    start = len(tokens) - rl
    texts = []
    for run in trained_runs(sample):
        ids = [tokens[start + i] for i in run]
        for j, i in enumerate(run):
            # The scripted server's log-prob of this token at this position of its output.
            assert abs(log_probs[i] - scripted_logprob(ids[j], j)) < 1e-6
        texts.append(bytes(ids).decode())
    assert texts == [t + END for t in trained_texts]
