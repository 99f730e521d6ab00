"""Relative paths given to the local backend, and what a failed workspace mount says."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import trio

from trio_swe import SandboxBootError, open_sandbox
from trio_swe.sandbox._writes import parent as _parent
from trio_swe.sandbox.local import LocalBackend
from trio_swe.sandbox.local._backend import _read_child_pid

from ..conftest import GitRepoFactory, git


@pytest.mark.parametrize("workspace", ["overlay", "copy"])
async def test_relative_state_dir_boots_path_at_commit_images(
    make_git_repo: GitRepoFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workspace: str,
) -> None:
    repo, first = make_git_repo({"pkg/mod.py": "VALUE = 1\n"})
    (repo / "pkg/mod.py").write_text("VALUE = 2\n")
    git(repo, "commit", "-qam", "second")
    monkeypatch.chdir(tmp_path)
    backend = LocalBackend(state_dir="state", workspace=workspace)  # type: ignore[arg-type]
    os.chdir("/")  # the working directory at boot differs from the one at construction
    async with open_sandbox(backend, f"{repo}@{first}") as sb:
        assert (await sb.exec("cat pkg/mod.py")).output == "VALUE = 1\n"
        assert sb.statistics().workspace_mode == workspace
    assert (tmp_path / "state" / "images").is_dir()


async def test_a_failed_overlay_mount_names_what_was_mounted() -> None:
    # A real process failing as `mount` does before bwrap starts.
    r = os.memfd_create("info")  # as the backend's: bwrap never got to write it
    proc = await trio.lowlevel.open_process(
        ["sh", "-c", "echo 'mount: /x/merged: special device overlay does not exist.' >&2"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # As when the mount fails: the process has exited (so its stdout is at EOF, no "ready")
    # and its message waits in the stderr pipe.
    await proc.wait()
    what = " (overlay mount of image '/src@abc': lowerdir=/s/lower, on /s/merged)"
    with pytest.raises(SandboxBootError) as info:
        await _read_child_pid(r, proc, 10.0, what)
    message = str(info.value)
    assert "special device overlay does not exist" in message
    assert "lowerdir=/s/lower" in message
    assert "'/src@abc'" in message


@pytest.mark.parametrize("path", ["/a/b", "/a/b/", "/a", "/", "//a//b", "/a//b//", "/a b/c d"])
def test_write_files_parent_is_dirnames(path: str) -> None:
    """write_file's parent, computed in Python (no process), is what dirname(1) says."""
    out = subprocess.run(["dirname", "--", path], capture_output=True, text=True, check=True)
    assert _parent(path) == out.stdout.rstrip("\n")
