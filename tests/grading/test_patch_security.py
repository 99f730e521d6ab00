"""A patch must not make the grader run code: hooks, filters, fsmonitor (issue 9, item 1).

Each payload, if it ever ran, creates ``/tmp/canary`` in the eval sandbox; the graded command
(an ``eval_cmd`` that runs git the way graders do) passes exactly when the canary exists. So
reward 1.0 would mean the payload executed; every case must give reward 0 with a reason that
names the refused path, and the log must not show the canary.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe import InvalidArgumentError
from trio_swe.grading import get_metadata, local_backend_shims, run_evaluation
from trio_swe.sandbox.local import LocalBackend

from ._calc import CalcRepo, build_calc_repo

CANARY = "/tmp/canary"
# What a grader does after the patch: restore the graded tests with git, look at the tree.
EVAL_CMD = (
    "git checkout -q HEAD -- tests; git status --porcelain >/dev/null 2>&1; "
    "git diff HEAD >/dev/null 2>&1; "
    f"if [ -e {CANARY} ]; then echo PAYLOAD-EXECUTED; exit 0; fi; exit 1"
)
PAYLOAD = f"touch {CANARY}"


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> CalcRepo:
    return build_calc_repo(tmp_path_factory.mktemp("calc"))


@pytest.fixture
def grading_backend() -> LocalBackend:
    kw = local_backend_shims()
    return LocalBackend(ro_binds=kw["ro_binds"], extra_path=kw["extra_path"], env=kw["env"])


def _new_file(path: str, text: str, mode: str = "100644") -> str:
    lines = text.splitlines(keepends=True)
    body = "".join(f"+{line}" for line in lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode {mode}\nindex 0000000..1111111\n"
        f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"
    )


def _append_to_git_config(text: str) -> str:
    """A hunk without context that inserts ``text`` after ``[core]`` in ``.git/config``:
    ``git apply`` refuses it, ``patch --fuzz`` applies it."""
    lines = text.splitlines(keepends=True)
    body = "".join(f"+{line}" for line in lines)
    return f"--- a/.git/config\n+++ b/.git/config\n@@ -1,0 +2,{len(lines)} @@\n{body}"


HOOK = _new_file(".git/hooks/post-checkout", f"#!/bin/sh\n{PAYLOAD}\n", mode="100755")
FILTER = _new_file(".gitattributes", "* filter=evil\n") + _append_to_git_config(
    f"\tattributesfile = /dev/null\n[filter \"evil\"]\n\tsmudge = sh -c '{PAYLOAD}; cat'\n"
    f"\tclean = sh -c '{PAYLOAD}; cat'\n[core]\n"
)
FSMONITOR = _append_to_git_config(f"\tfsmonitor = {PAYLOAD}; echo\n")
# The same hook through a path that climbs back into the repository.
HOOK_DOTDOT = _new_file("tests/../.git/hooks/post-checkout", f"#!/bin/sh\n{PAYLOAD}\n", "100755")
# A symlink into .git, then a file written through it (git apply refuses; patch may not).
SYMLINK = (
    "diff --git a/gitdir b/gitdir\nnew file mode 120000\nindex 0000000..1111111\n"
    "--- /dev/null\n+++ b/gitdir\n@@ -0,0 +1 @@\n+.git\n\\ No newline at end of file\n"
    + _new_file("gitdir/hooks/post-checkout", f"#!/bin/sh\n{PAYLOAD}\n", mode="100755")
)


@pytest.mark.parametrize(
    ("patch", "refused"),
    [
        pytest.param(HOOK, ".git/hooks/post-checkout", id="hook"),
        pytest.param(FILTER, ".git/config", id="gitattributes_filter"),
        pytest.param(FSMONITOR, ".git/config", id="fsmonitor"),
        pytest.param(HOOK_DOTDOT, "..", id="dotdot_hook"),
        pytest.param(SYMLINK, "gitdir", id="symlink_into_git"),
    ],
)
async def test_patch_that_plants_executable_git_state_is_refused(
    calc: CalcRepo, grading_backend: LocalBackend, patch: str, refused: str
) -> None:
    md = get_metadata(calc.slime_eval_cmd_sample(eval_cmd=EVAL_CMD), "scaleswe")
    result = await run_evaluation(grading_backend, md, patch, timeout_sec=60)
    assert "PAYLOAD-EXECUTED" not in result.log_tail, result
    assert (result.reward, result.resolved) == (0.0, False), result
    assert result.reason == "patch_refused", result
    assert not result.applied_cleanly
    assert result.apply_method is None
    assert refused in result.detail, result.detail
    assert not result.infra_failure  # the patch's fault: train on the zero


async def test_a_hook_already_in_the_image_does_not_run(
    calc: CalcRepo, grading_backend: LocalBackend, tmp_path: Path
) -> None:
    """Hooks are off for the grader's git commands even when the repository ships one."""
    from tests.conftest import git

    repo = tmp_path / "hooked"
    git(calc.path.parent, "clone", "-q", str(calc.path), str(repo))
    hook = repo / ".git" / "hooks" / "post-checkout"
    hook.write_text(f"#!/bin/sh\n{PAYLOAD}\n")
    hook.chmod(0o755)
    (repo / ".git" / "hooks" / "post-index-change").write_text(f"#!/bin/sh\n{PAYLOAD}\n")
    (repo / ".git" / "hooks" / "post-index-change").chmod(0o755)
    row = calc.slime_eval_cmd_sample(eval_cmd=EVAL_CMD)
    row["metadata"]["image"] = str(repo)
    row["metadata"]["remote_env_info"] = {}
    md = get_metadata(row, "scaleswe")
    result = await run_evaluation(grading_backend, md, calc.gold, timeout_sec=60)
    assert result.applied_cleanly, result
    assert "PAYLOAD-EXECUTED" not in result.log_tail, result
    assert (result.reward, result.reason) == (0.0, "tests_failed"), result


async def test_a_patch_with_a_lone_surrogate_is_a_typed_error(
    calc: CalcRepo, grading_backend: LocalBackend
) -> None:
    """Issue 9, item 8: InvalidArgumentError naming the patch, before any sandbox boots."""
    md = get_metadata(calc.slime_eval_cmd_sample(), "scaleswe")
    bad = calc.gold.replace("return", "return \ud800", 1)
    with pytest.raises(InvalidArgumentError, match=r"patch: .*'\\ud800'.* lone surrogate"):
        await run_evaluation(grading_backend, md, bad, timeout_sec=60)
    with pytest.raises(InvalidArgumentError, match="patch must be str or bytes"):
        await run_evaluation(grading_backend, md, 42, timeout_sec=60)  # type: ignore[arg-type]
    assert grading_backend.statistics().created == 0
    # The surrogates a surrogateescape decode makes stand for bytes: accepted as those bytes.
    gold = calc.gold.encode().decode("utf-8", "surrogateescape")
    result = await run_evaluation(grading_backend, md, gold, timeout_sec=60)
    assert result.reward == 1.0, result


async def test_a_log_over_the_read_cap_keeps_its_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """read_text (grading's log reader) past LOG_MAX_BYTES returns the head, not an error."""
    from trio_swe import open_sandbox
    from trio_swe.grading import _run

    monkeypatch.setattr(_run, "LOG_MAX_BYTES", 1000)
    async with open_sandbox(LocalBackend(), str(tmp_path)) as sb:
        await sb.write_file("/tmp/log", b"start\n" + b"x" * 3000)
        text = await _run.read_text(sb, "/tmp/log")
        assert text == "start\n" + "x" * 994
        assert await _run.read_text(sb, "/tmp/none") == ""
