"""The agent's workspace: prepare it (pre-commands, git base, problem statement, ownership),
and take the agent's patch out of it.

The harness's own files in the workdir (the problem statement, ``.harness/``) are never part of
the patch.
"""

from __future__ import annotations

import shlex
import uuid

from ._errors import PatchFailedError, SandboxFileTooLargeError, SetupFailedError
from .config import SweConfig
from .grading import InstanceMetadata, diff_script
from .sandbox import Sandbox, exec_and_wait

__all__ = ["HARNESS_DIR", "PROBLEM_STATEMENT_FILE", "prepare_workspace", "take_patch"]

#: The harness's own files in the workdir, never part of the patch.
PROBLEM_STATEMENT_FILE = "PROBLEM_STATEMENT.md"
HARNESS_DIR = ".harness"
_EXCLUDES = (PROBLEM_STATEMENT_FILE, HARNESS_DIR)
SHORT_TIMEOUT_SEC = 120.0
#: Problem statements up to this size travel inside the setup command (one spawn fewer).
_INLINE_STATEMENT_MAX = 64 * 1024


async def prepare_workspace(
    sb: Sandbox, md: InstanceMetadata, agent_user: str, config: SweConfig
) -> str:
    """Run the pre-commands, make the workdir the agent's, write the problem statement.

    Returns the base commit the patch will be taken against (recorded after the pre-commands,
    which often check out the instance's base).
    """
    wd = shlex.quote(md.workdir)
    script = md.setup_script()
    if script is not None:
        result = await exec_and_wait(
            sb,
            script,
            time_budget_sec=config.episode.setup_timeout_sec,
            user="root",
            workdir=md.workdir,
            want_output=True,
        )
        if not result.ok:
            raise SetupFailedError(
                f"pre-commands failed (exit {result.exit_code}, {result.reason}): "
                f"{result.output[-500:]}",
            )
    # One command: give a non-git workdir a repository (so the patch has a base), keep the
    # harness's files out of git, write the problem statement, hand the tree to the agent, and
    # print the base commit last. Each exec is a process spawn, so they are batched.
    statement_path = f"{md.workdir.rstrip('/')}/{PROBLEM_STATEMENT_FILE}"
    inline = len(md.problem_statement.encode()) <= _INLINE_STATEMENT_MAX
    excludes = "".join(f"/{name}\n" for name in _EXCLUDES)
    steps = [
        f"cd {wd}",
        "(git rev-parse -q --verify HEAD >/dev/null || (git init -q && git add -A && "
        "git -c user.name=trio-swe -c user.email=trio-swe@localhost commit -q "
        "--allow-empty -m base))",
        f"printf %s {shlex.quote(excludes)} >> .git/info/exclude",
    ]
    if inline:
        steps.append(
            f"printf %s {shlex.quote(md.problem_statement)} > {shlex.quote(statement_path)}"
        )
    if agent_user != "root":
        user = shlex.quote(agent_user)
        # Images without the user (plain E2B templates) get one, as slime's harness does.
        steps.append(f"(id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user})")
        steps.append(f"chown -R {user}: .")
    steps.append("git rev-parse HEAD")
    prep = await sb.exec(" && ".join(steps), user="root", timeout=SHORT_TIMEOUT_SEC)
    lines = prep.output.strip().splitlines()
    commit = lines[-1].strip() if prep.ok and lines else ""
    if len(commit) < 40 or not all(c in "0123456789abcdef" for c in commit):
        raise SetupFailedError(f"workspace preparation failed: {prep.output[-300:]}")
    if not inline:
        await sb.write_file(statement_path, md.problem_statement, user=agent_user)
    return commit


async def take_patch(sb: Sandbox, workdir: str, base_commit: str, *, agent_user: str) -> bytes:
    """The agent's change, as bytes: new files included (``git add -N``), binary-safe, against
    the base.

    The agent's leftover processes are killed first so the tree is not changing under ``git``.
    Harness files (the problem statement, ``.harness/``) are excluded. Nothing the agent
    configured in git (hooks, fsmonitor, filters...) runs: see :func:`~trio_swe.grading.diff_script`.
    """
    token = uuid.uuid4().hex[:12]
    out = f"/tmp/trio_swe-patch-{token}.diff"
    err = f"/tmp/trio_swe-patch-{token}.err"  # stderr must not mix into the patch
    kill = f"pkill -KILL -u {shlex.quote(agent_user)} 2>/dev/null\n" if agent_user != "root" else ""
    script = diff_script(
        workdir=workdir, base_commit=base_commit, out_path=out, err_path=err, excludes=_EXCLUDES
    )
    # The diff goes to a file and to stdout: a short one arrives with the exec's output, a long
    # one (the exec's output is capped) is read back from the file, and so is one that was not
    # UTF-8 (the output is decoded with replacement characters; the file has the bytes).
    result = await sb.exec(kill + script, user="root", timeout=SHORT_TIMEOUT_SEC)
    if not result.ok:
        raise PatchFailedError(f"git diff failed (exit {result.exit_code}): {result.output}")
    if not result.output_truncated and "\ufffd" not in result.output:
        return result.output.encode()
    try:
        return await sb.read_file(out)
    except SandboxFileTooLargeError as exc:
        raise PatchFailedError(f"the agent's patch is too large to take: {exc}") from exc
