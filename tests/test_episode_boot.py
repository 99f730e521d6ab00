"""Boot failures that can never succeed are not retried (issue 9, item 10).

Each spec fails the same way every time: the episode must abort after one attempt with the
reason, where it used to try ``boot_retries + 1`` times.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from trio_swe import PermanentBootError, open_sandbox, run_episode
from trio_swe.agents import BashAgent
from trio_swe.grading import get_metadata
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.sandbox.local import LocalBackend
from trio_swe.sandbox.local._rootfs import workdir_problem

from .test_episode_support import assert_nothing_left, build_demo, demo_config


def _cases(repo: str) -> dict[str, tuple[dict[str, str], str]]:
    path, _, _ = repo.rpartition("@")
    return {
        "workdir_usr": ({"workdir": "/usr"}, "would hide /usr/bin"),
        "workdir_proc": ({"workdir": "/proc/wd"}, "inside /proc"),
        "missing_image_dir": ({"image": f"{path}-missing"}, "not a directory"),
        "missing_commit": ({"image": f"{path}@{'0' * 40}"}, f"no commit {'0' * 40!r}"),
        "not_a_repo": ({"image": "/nonexistent/repo@HEAD"}, "not a git repository"),
    }


# An image that cannot exist is caught before anything boots by the backend's image check
# (``evaluability_check`` with the backend): the episode is ``unevaluable`` with no boot at all.
# A bad workdir passes that check and fails at boot, once.
PRE_BOOT = {"missing_image_dir", "missing_commit", "not_a_repo"}


@pytest.mark.parametrize(
    "case", ["workdir_usr", "workdir_proc", "missing_image_dir", "missing_commit", "not_a_repo"]
)
async def test_permanent_boot_failure_is_tried_once(tmp_path: Path, case: str) -> None:
    demo, _, backend = build_demo(tmp_path)
    row = msgspec.json.decode(msgspec.json.encode(demo.rows[0]))
    changes, reason = _cases(row["metadata"]["image"])[case]
    row["metadata"].update(changes)
    md = get_metadata(row, "scaleswe")
    agent = BashAgent(SGLangPolicy("http://127.0.0.1:9"), ByteTokenizer())
    result = await run_episode(md, agent, backend=backend, config=demo_config(boot_retries=2))
    assert result.status == "aborted"
    assert reason in (result.error or ""), result.error
    if case in PRE_BOOT:
        assert result.abort_reason == "unevaluable"
        assert (result.error or "").startswith("image_"), result.error
        assert (result.boot_attempts, result.boot_retries) == (0, 0)
    else:
        assert result.abort_reason == "boot_failed"
        assert (result.boot_attempts, result.boot_retries) == (1, 0)
    assert_nothing_left(tmp_path, backend)


@pytest.mark.parametrize("case", ["missing_image_dir", "missing_commit", "not_a_repo"])
async def test_unbootable_image_raises_permanent_boot_error(tmp_path: Path, case: str) -> None:
    # Past the pre-boot check (open_sandbox called directly), the same images fail the boot
    # itself with the typed, never-retried error.
    demo, _, backend = build_demo(tmp_path)
    changes, reason = _cases(demo.rows[0]["metadata"]["image"])[case]
    with pytest.raises(PermanentBootError, match=re.escape(reason)):
        async with open_sandbox(backend, changes["image"], workdir="/testbed"):
            pass
    assert_nothing_left(tmp_path, backend)


async def test_permanent_boot_error_is_typed(tmp_path: Path) -> None:
    with pytest.raises(PermanentBootError, match="inside /proc"):
        async with open_sandbox(LocalBackend(), str(tmp_path), workdir="/proc/x"):
            pass


def test_workdir_problem() -> None:
    for bad in ("/", "/usr", "/usr/bin", "/bin", "/lib/x", "/etc", "/proc", "/sys/x", "/dev"):
        assert workdir_problem(bad) is not None, bad
    for ok in ("/testbed", "/app", "/usr/src/app", "/usr/local/src/x", "/home/u/r", "/tmp/w"):
        assert workdir_problem(ok) is None, ok
