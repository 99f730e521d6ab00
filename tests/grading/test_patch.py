"""The apply ladder: path extraction, verdict parsing, and the script on real git repositories."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trio_swe.grading._patch import (
    NOT_APPLIED_STATUS,
    apply_script,
    is_empty_patch,
    parse_head,
    parse_refusal,
    parse_verdict,
    printf_bytes,
    refused_paths,
    touched_paths,
    wrong_head,
)

from ._calc import git


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "i")
    return repo


def _diff_of(repo: Path, edits: dict[str, str]) -> str:
    """The diff of ``edits`` against HEAD; the tree is left at HEAD."""
    for rel, text in edits.items():
        (repo / rel).write_text(text)
    git(repo, "add", "-N", *edits)
    diff = git(repo, "diff", "--binary")
    git(repo, "reset", "-q", "--hard")
    git(repo, "clean", "-qfd")
    return diff


def _apply(
    repo: Path,
    patch: str | bytes,
    tmp_path: Path,
    *,
    inline: bool = True,
    expect_head: str | None = None,
) -> tuple[bool, str | None, str]:
    """Run the ladder as the graders do: the touched paths inline in the script (default), or
    written to a list file first (the fallback for very large patches)."""
    out = _run_script(repo, patch, tmp_path, inline=inline, expect_head=expect_head)
    applied, rung = parse_verdict(out)
    log_path = tmp_path / "state" / "apply.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    return applied, rung, log + (parse_refusal(out) or "")


def _run_script(
    repo: Path,
    patch: str | bytes,
    tmp_path: Path,
    *,
    inline: bool = True,
    expect_head: str | None = None,
    env: dict[str, str] | None = None,
) -> str:
    data = patch.encode() if isinstance(patch, str) else patch
    paths = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in touched_paths(data))
    (tmp_path / "p.diff").write_bytes(data)
    if not inline:
        (tmp_path / "p.list").write_bytes(paths)
    script = apply_script(
        workdir=str(repo),
        patch_path=None if is_empty_patch(data) else str(tmp_path / "p.diff"),
        list_path=str(tmp_path / "p.list"),
        state_dir=str(tmp_path / "state"),
        paths=paths if inline else None,
        expect_head=expect_head,
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, check=False, env=env)
    out = done.stdout.decode(errors="replace")
    # The exit status says what the verdict says: 0 after `ok`, NOT_APPLIED_STATUS otherwise
    # (graders gate the tests on it).
    assert done.returncode == (0 if parse_verdict(out)[0] else NOT_APPLIED_STATUS), out
    return out


def _status(repo: Path) -> str:
    return git(repo, "status", "--porcelain=v1", "--untracked-files=all")


LINES = "".join(f"{i}\n" for i in range(1, 31))


def test_clean_patch_applies_with_git_apply(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    patch = _diff_of(repo, {"f.txt": LINES.replace("15\n", "fifteen\n")})
    assert _apply(repo, patch, tmp_path)[:2] == (True, "git_apply")
    assert "fifteen" in (repo / "f.txt").read_text()


def test_drifted_context_falls_through_to_patch_fuzz(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    patch = _diff_of(repo, {"f.txt": LINES.replace("15\n", "fifteen\n")})
    # The file drifted under the patch's context lines (and is committed, so no 3-way base).
    (repo / "f.txt").write_text(LINES.replace("13\n", "thirteen\n").replace("17\n", "x\n"))
    git(repo, "commit", "-qam", "drift")
    git(repo, "gc", "-q", "--prune=now")
    applied, rung, _ = _apply(repo, patch, tmp_path)
    assert applied
    assert rung in ("git_apply_3way", "patch_fuzz")
    assert "fifteen" in (repo / "f.txt").read_text()
    assert not list(repo.glob("*.rej"))
    assert not list(repo.glob("*.orig"))


@pytest.mark.parametrize("inline", [True, False], ids=["paths_inline", "paths_in_a_file"])
def test_failed_rungs_leave_the_tree_as_it_was(tmp_path: Path, inline: bool) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES, "g.txt": "g\n"})
    # A two-hunk patch whose second hunk cannot apply anywhere: --reject and patch would each
    # apply the first hunk and leave .rej files; git apply --3way would leave conflict markers.
    good = _diff_of(repo, {"f.txt": LINES.replace("15\n", "fifteen\n")})
    bad = good + (
        "diff --git a/g.txt b/g.txt\n--- a/g.txt\n+++ b/g.txt\n@@ -1 +1 @@\n-nothere\n+x\n"
        "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n"
        "@@ -0,0 +1 @@\n+new\n"
    )
    # Local state from setup commands that the ladder must not destroy.
    (repo / "g.txt").write_text("g changed by setup\n")
    (repo / "untracked.txt").write_text("keep me\n")
    before = _status(repo)
    applied, rung, log = _apply(repo, bad, tmp_path, inline=inline)
    assert (applied, rung) == (False, None)
    for name in ("git_apply", "git_apply_3way", "git_apply_reject", "patch_fuzz"):
        assert f"+ {name}" in log
    assert _status(repo) == before
    assert (repo / "f.txt").read_text() == LINES
    assert (repo / "g.txt").read_text() == "g changed by setup\n"
    assert not (repo / "new.txt").exists()
    assert git(repo, "ls-files", "-u") == ""  # no conflicted index entries


def test_three_way_merge_rung(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    patch = _diff_of(repo, {"f.txt": LINES.replace("2\n", "two\n", 1)})
    # An unrelated change right next to the hunk: plain apply fails, a 3-way merge succeeds.
    (repo / "f.txt").write_text(LINES.replace("3\n", "three\n", 1))
    git(repo, "commit", "-qam", "next to it")
    applied, rung, _ = _apply(repo, patch, tmp_path)
    assert applied
    assert rung in ("git_apply_3way", "patch_fuzz")
    text = (repo / "f.txt").read_text()
    assert "two\n" in text
    assert "three\n" in text


def test_binary_patch(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"a.txt": "a\n"})
    blob = bytes(range(256)) * 8
    (repo / "b.bin").write_bytes(blob)
    git(repo, "add", "-N", "b.bin")
    patch = git(repo, "diff", "--binary")
    git(repo, "rm", "-q", "--cached", "b.bin")
    (repo / "b.bin").unlink()
    assert "GIT binary patch" in patch
    assert _apply(repo, patch, tmp_path)[:2] == (True, "git_apply")
    assert (repo / "b.bin").read_bytes() == blob


@pytest.mark.parametrize("patch", ["", "\n", "  \n\t\n"])
def test_empty_patch_is_applied(tmp_path: Path, patch: str) -> None:
    repo = _repo(tmp_path, {"a.txt": "a\n"})
    assert is_empty_patch(patch)
    assert _apply(repo, patch, tmp_path)[:2] == (True, "empty")


def test_touched_paths() -> None:
    patch = (
        "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n"
        "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n"
        "diff --git a/old b/nw\nsimilarity index 90%\nrename from old\nrename to nw\n"
        'diff --git "a/p\\303\\244th" "b/p\\303\\244th"\n--- "a/p\\303\\244th"\n+++ "b/p\\303\\244th"\n'
        "diff --git a/img.png b/img.png\nBinary files a/img.png and b/img.png differ\n"
        "--- a/../../etc/passwd\n+++ /abs/path\n"
    )
    assert touched_paths(patch) == ["src/x.py", "new.txt", "old", "nw", "päth", "img.png"]


def test_parse_verdict() -> None:
    assert parse_verdict("noise\n@@TRIO_SWE_APPLY ok git_apply\n") == (True, "git_apply")
    assert parse_verdict("@@TRIO_SWE_APPLY failed\n") == (False, None)
    assert parse_verdict("@@TRIO_SWE_APPLY ok bogus\n") == (False, None)
    assert parse_verdict("") == (False, None)


@given(st.text())
@example("diff --git ")  # an empty rest once raised IndexError (any text can come from an agent)
@example("diff --git a/x  b/x")
def test_touched_paths_never_escape(patch: str) -> None:
    for path in touched_paths(patch):
        assert path
        assert not path.startswith("/")
        assert ".." not in path.split("/")


def test_refused_paths() -> None:
    ok = (
        "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n"
        "@@ -1,2 +1,2 @@\n"
        "--- a/.git/config\n"  # a removed line that reads like a header: content
        "+++ /etc/passwd\n"  # an added one: content too
        " keep\n"
        "diff --git a/docs/link b/docs/link\nnew file mode 120000\n--- /dev/null\n+++ b/docs/link\n"
        "@@ -0,0 +1 @@\n+../README\n\\ No newline at end of file\n"
    )
    assert refused_paths(ok) == []
    assert refused_paths(b"") == []
    bad = {
        "--- a/x\n+++ b/.git/hooks/pre-commit\n@@ -0,0 +1 @@\n+x\n": ".git/hooks/pre-commit",
        "--- a/sub/.GIT/config\n+++ b/sub/.GIT/config\n": "sub/.GIT/config",
        "Index: .git/config\n": ".git/config",
        "*** a/.git/config\n--- b/.git/config\n": ".git/config",
        "diff --git a/x b/x\nrename from x\nrename to .git/x\n": ".git/x",
        "--- /etc/passwd\n+++ /etc/passwd\n": "/etc/passwd",
        "--- a/../outside\n+++ b/../outside\n": "../outside",
        "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+/etc\n": "'l'",
        "diff --git a/d/l b/d/l\nindex 1..2 120000\n--- a/d/l\n+++ b/d/l\n@@ -1 +1 @@\n-x\n+../..\n": "d/l",
        "diff --git a/l b/l\nnew file mode 120000\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+.git\n": "'l'",
    }
    for patch, path in bad.items():
        refused = refused_paths(patch)
        assert any(path in r for r in refused), (patch, refused)
        assert refused_paths(patch.encode()) == refused


def test_patch_rung_never_writes_beyond_a_symlink(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"a.txt": "a\n"})
    outside = tmp_path / "outside"
    outside.mkdir()
    (repo / "escape").symlink_to(outside)
    # git apply refuses it (beyond a symlink); git 2.39's --3way fallback and patch wrote it.
    patch = "--- a/escape/planted\n+++ b/escape/planted\n@@ -0,0 +1 @@\n+x\n"
    assert refused_paths(patch) == []  # lexically fine: the symlink is in the tree already
    applied, rung, log = _apply(repo, patch, tmp_path)
    assert (applied, rung) == (False, None)
    assert not (outside / "planted").exists()
    assert "escape/planted is beyond the symlink escape" in log


@given(st.binary(max_size=300))
def test_printf_bytes_writes_exactly_the_bytes(data: bytes) -> None:
    arg = printf_bytes(data)
    assert arg.isascii()
    out = subprocess.run(["bash", "-c", 'printf %b "$1"', "-", arg], capture_output=True)
    assert out.stdout == data


def test_inline_paths_restore_files_with_any_name(tmp_path: Path) -> None:
    # Names with spaces, quotes, a backslash and bytes that are not UTF-8 reach the snapshot
    # intact: a failing patch leaves each file as it was.
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    names = [b"sp ace.txt", b"q'uo\"te\\.txt", b"lat\xe9n1.txt", b"%s%b.txt"]
    for n in names:
        (repo / os.fsdecode(n)).write_bytes(b"old\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "i")
    for n in names:
        (repo / os.fsdecode(n)).write_bytes(b"new\n")
    diff = subprocess.run(
        ["git", "-C", str(repo), "-c", "core.quotepath=off", "diff", "--binary"],
        capture_output=True,
        check=True,
    ).stdout
    git(repo, "checkout", "-q", ".")
    # The first file's hunk applies, the last cannot: rungs that apply partially must roll back.
    bad = diff + b"diff --git a/zz.txt b/zz.txt\n--- a/zz.txt\n+++ b/zz.txt\n@@ -1 +1 @@\n-no\n+x\n"
    assert {os.fsencode(p) for p in touched_paths(bad)} >= set(names)
    (repo / "zz.txt").write_bytes(b"other\n")
    applied, rung, log = _apply(repo, bad, tmp_path)
    assert (applied, rung) == (False, None), log
    assert "+ patch_fuzz" in log
    for n in names:
        assert (repo / os.fsdecode(n)).read_bytes() == b"old\n", n
    assert _apply(repo, diff, tmp_path)[:2] == (True, "git_apply")
    for n in names:
        assert (repo / os.fsdecode(n)).read_bytes() == b"new\n", n


def _head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.mark.parametrize("want", ["full", "prefix", "upper"])
def test_expected_head_applies(tmp_path: Path, want: str) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    patch = _diff_of(repo, {"f.txt": LINES.replace("15\n", "fifteen\n")})
    head = _head(repo)
    expect = {"full": head, "prefix": head[:7], "upper": head.upper()}[want]
    out = _run_script(repo, patch, tmp_path, expect_head=expect)
    assert parse_head(out) == head
    assert not wrong_head(out)
    assert parse_verdict(out) == (True, "git_apply")
    assert "fifteen" in (repo / "f.txt").read_text()


@pytest.mark.parametrize("want", ["other_commit", "too_short", "not_hex"])
def test_another_head_applies_nothing(tmp_path: Path, want: str) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    base = _head(repo)
    patch = _diff_of(repo, {"f.txt": LINES.replace("15\n", "fifteen\n")})
    (repo / "g.txt").write_text("g\n")
    git(repo, "add", "g.txt")
    git(repo, "commit", "-qm", "later")
    head = _head(repo)
    expect = {"other_commit": base, "too_short": head[:6], "not_hex": "main"}[want]
    out = _run_script(repo, patch, tmp_path, expect_head=expect)
    assert wrong_head(out)
    assert parse_head(out) == head
    assert parse_verdict(out) == (False, None)
    assert (repo / "f.txt").read_text() == LINES  # nothing applied
    assert not (tmp_path / "state" / "files.tar").exists()


def test_expected_head_with_an_empty_patch(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    head = _head(repo)
    out = _run_script(repo, "", tmp_path, expect_head=head)
    assert (parse_head(out), wrong_head(out), parse_verdict(out)) == (head, False, (True, "empty"))
    out = _run_script(repo, "", tmp_path, expect_head="0" * 40)
    assert (parse_head(out), wrong_head(out)) == (head, True)


def test_a_workdir_without_commits_is_not_checked(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "f.txt").write_text(LINES)
    out = _run_script(repo, "", tmp_path, expect_head="0" * 40)
    assert (parse_head(out), wrong_head(out), parse_verdict(out)) == ("", False, (True, "empty"))
    assert parse_head("@@TRIO_SWE_APPLY ok empty\n") is None  # not asked for


def _git_logging(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``git`` logs its arguments (one line per call) and runs git."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "git.calls"
    real = subprocess.run(["bash", "-c", "command -v git"], capture_output=True, text=True)
    wrapper = bin_dir / "git"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real.stdout.strip()} "$@"\n')
    wrapper.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def _rev_parse_calls(log: Path) -> int:
    return sum("rev-parse" in line for line in log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("layout", ["branch", "detached"])
def test_the_head_check_reads_a_plain_head_without_git(tmp_path: Path, layout: str) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    patch = _diff_of(repo, {"f.txt": LINES.replace("15\n", "fifteen\n")})
    head = _head(repo)
    if layout == "detached":
        git(repo, "checkout", "-q", "--detach", head)
    env, log = _git_logging(tmp_path)
    out = _run_script(repo, patch, tmp_path, expect_head=head, env=env)
    assert (parse_head(out), wrong_head(out), parse_verdict(out)) == (
        head,
        False,
        (True, "git_apply"),
    )
    assert _rev_parse_calls(log) == 0, log.read_text()
    # The same read refuses another commit.
    git(repo, "checkout", "-q", "--", "f.txt")
    out = _run_script(repo, patch, tmp_path, expect_head="0" * 40, env=env)
    assert (parse_head(out), wrong_head(out)) == (head, True)


@pytest.mark.parametrize("layout", ["packed", "worktree", "git_dir", "symref", "not_hex"])
def test_the_head_check_asks_git_for_anything_else(tmp_path: Path, layout: str) -> None:
    repo = _repo(tmp_path, {"f.txt": LINES})
    patch = _diff_of(repo, {"f.txt": LINES.replace("15\n", "fifteen\n")})
    head = _head(repo)
    env, log = _git_logging(tmp_path)
    workdir = repo
    if layout == "packed":
        git(repo, "pack-refs", "--all")
        assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    elif layout == "worktree":  # .git is a file
        workdir = tmp_path / "wt"
        git(repo, "worktree", "add", "-q", "--detach", str(workdir), head)
    elif layout == "git_dir":  # the repository is named by the environment, not found in cwd
        workdir = tmp_path / "plain"
        workdir.mkdir()
        (workdir / "f.txt").write_text(LINES)
        env = {**env, "GIT_DIR": str(repo / ".git"), "GIT_WORK_TREE": str(workdir)}
    elif layout == "symref":  # HEAD -> refs/heads/alias, itself a symbolic ref to main
        git(repo, "symbolic-ref", "refs/heads/alias", "refs/heads/main")
        git(repo, "symbolic-ref", "HEAD", "refs/heads/alias")
    elif layout == "not_hex":  # a loose ref file that is no commit id: git decides
        git(repo, "branch", "-q", "other")
        (repo / ".git" / "refs" / "heads" / "other").write_text("nonsense\n")
        git(repo, "symbolic-ref", "HEAD", "refs/heads/main")
        (repo / ".git" / "HEAD").write_text("ref: refs/heads/other\n")
    out = _run_script(workdir, patch, tmp_path, expect_head=head, env=env)
    want = "" if layout == "not_hex" else head  # git cannot resolve it either: not checked
    assert (parse_head(out), wrong_head(out)) == (want, False), out
    assert parse_verdict(out) == (True, "git_apply")
    assert _rev_parse_calls(log) == 1, log.read_text()
