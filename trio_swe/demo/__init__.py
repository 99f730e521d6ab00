"""The bundled demo set: small real git repositories with real bugs, built on the fly.

:func:`build_demo_set` writes one git repository per :data:`DEMO_INSTANCES` entry under a
directory of your choice and returns dataset rows (slime-style, ``scaleswe`` protocol, graded by
an ``eval_cmd`` that runs the grader's own copy of the tests) whose images are
``<repo path>@<commit>`` for the local backend, plus each instance's gold patch and the scripted
policy's scripts. ``trio-swe demo`` runs them end to end; the tests use them too.

The scripted policy (:func:`open_scripted_policy_server`) is part of the demo: an SGLang-compatible
server on loopback that replays each instance's script. It lives here, not in
:mod:`trio_swe.testing`, because ``trio-swe demo`` is production code and production code never
imports the test package (which re-exports these names for tests).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ._cli_scripts import cli_scripts
from ._instances import DEMO_INSTANCES, DemoInstance
from ._policy_server import (
    ScriptedCompletion,
    ScriptedPolicyServer,
    ScriptedServerStatistics,
    open_scripted_policy_server,
    scripted_logprob,
)

__all__ = [
    "DEMO_INSTANCES",
    "DemoInstance",
    "DemoSet",
    "ScriptedCompletion",
    "ScriptedPolicyServer",
    "ScriptedServerStatistics",
    "build_demo_set",
    "cli_scripts",
    "open_scripted_policy_server",
    "scripted_logprob",
]

_GIT_ENV = {
    "GIT_AUTHOR_NAME": "trio-swe demo",
    "GIT_AUTHOR_EMAIL": "demo@trio-swe.invalid",
    "GIT_COMMITTER_NAME": "trio-swe demo",
    "GIT_COMMITTER_EMAIL": "demo@trio-swe.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


class DemoSet(msgspec.Struct, frozen=True, kw_only=True):
    """A built demo set.

    Attributes:
        rows: dataset rows, one per instance (``get_metadata(row, "scaleswe")`` reads them).
        gold_patches: instance id -> the gold fix as a ``git diff --binary``.
        scripts: instance id -> the scripted policy's completions.
        expected_rewards: instance id -> the reward its script earns.
        timeouts: ids of the instances whose script overruns a small agent budget.
    """

    rows: list[dict[str, Any]]
    gold_patches: dict[str, str]
    scripts: dict[str, list[str | ScriptedCompletion]]
    expected_rewards: dict[str, float]
    timeouts: frozenset[str]


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV, "HOME": str(repo)}
    out = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, env=env, text=True
    )
    return out.stdout


def eval_command(instance: DemoInstance) -> str:
    """The grader's command: the tests as first committed, run from the command line, so a
    patch that edits the repository's test file changes nothing."""
    return f"python3 -B -c {shlex.quote(instance.test_source)}"


def build_demo_set(
    root: str | os.PathLike[str], instances: Sequence[DemoInstance] = DEMO_INSTANCES
) -> DemoSet:
    """Build the demo repositories under ``root`` (created if needed) and return the set.

    Synchronous (a few ``git`` calls per instance, well under a second in all); call it through
    ``trio.to_thread.run_sync`` from async code.
    """
    base = Path(root)
    base.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    gold: dict[str, str] = {}
    for inst in instances:
        repo = base / inst.instance_id
        repo.mkdir()
        _git(repo, "init", "-q", "-b", "main")
        _write(repo, inst.files)
        _write(repo, {"README.md": f"# {inst.instance_id}\n\n{inst.problem_statement}\n"})
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "demo: buggy version")
        commit = _git(repo, "rev-parse", "HEAD").strip()
        _write(repo, inst.fixed)
        gold[inst.instance_id] = _git(repo, "diff", "--binary")
        _git(repo, "checkout", "-q", "--", ".")
        rows.append(
            {
                "prompt": inst.problem_statement,
                "label": inst.instance_id,
                "metadata": {
                    "instance_id": inst.instance_id,
                    "image": f"{repo}@{commit}",
                    "workdir": "/testbed",
                    "problem_statement": inst.problem_statement,
                    "eval_cmd": eval_command(inst),
                },
            }
        )
    return DemoSet(
        rows=rows,
        gold_patches=gold,
        scripts={i.instance_id: list(i.script) for i in instances},
        expected_rewards={i.instance_id: i.expected_reward for i in instances},
        timeouts=frozenset(i.instance_id for i in instances if i.times_out),
    )


def _write(repo: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
