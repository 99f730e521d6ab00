"""One error type per failure, on every backend (issue 9 item 9; the ``backend`` fixture).

A refused argument is :class:`InvalidArgumentError`, a denied access
:class:`SandboxPermissionError`, never an infrastructure error such as
``SandboxUnreachableError`` (which a trainer would drop an episode for).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe import (
    InvalidArgumentError,
    SandboxError,
    SandboxPermissionError,
    open_sandbox,
)
from trio_swe.sandbox import Backend


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir(exist_ok=True)
    return img


async def test_refusals_have_one_type_on_every_backend(backend: Backend, image: Path) -> None:
    async with open_sandbox(backend, str(image)) as sb:
        # Denied: a read-only system directory, root's home as the unprivileged user, a file
        # only root may read.
        denied = [("/etc/passwd", "agent")]
        if backend.name != "docker":  # the host's root, read-only (a container's root is its own)
            denied.append(("/usr/trio-swe-new", None))
        for path, user in denied:
            # One byte, and more than a pipe holds: a writer that refuses before reading its
            # input closed the pipe under a write still in flight (BrokenResourceError, when
            # the refusal came first).
            for data in (b"x", b"x" * 1_000_000):
                with pytest.raises(SandboxPermissionError, match=r"not permitted|denied|read-only"):
                    await sb.write_file(path, data, user=user)
        assert (await sb.exec("mkdir -p /root/p && echo s > /root/p/f && chmod 600 /root/p/f")).ok
        with pytest.raises(SandboxPermissionError):
            await sb.read_file("/root/p/f", user="agent")
        with pytest.raises(SandboxPermissionError):
            await sb.write_file("/root/p/g", b"x", user="agent")
        # Arguments: a directory where a file goes, unknown users, a missing cwd.
        with pytest.raises(InvalidArgumentError):
            await sb.write_file("/tmp", b"x")
        with pytest.raises(InvalidArgumentError, match="nosuchuser"):
            await sb.exec("true", user="nosuchuser")
        with pytest.raises(InvalidArgumentError, match="nosuchuser"):
            await sb.write_file("/tmp/x", b"x", user="nosuchuser")
        with pytest.raises(InvalidArgumentError, match="nosuchuser"):
            await sb.read_file("/etc/hostname", user="nosuchuser")
        with pytest.raises(InvalidArgumentError, match="/no/such/dir"):
            await sb.exec("pwd", cwd="/no/such/dir")
        # A NUL cannot be part of an argument (local raised a bare ValueError, docker did not
        # check at all).
        with pytest.raises(InvalidArgumentError, match="NUL"):
            await sb.exec("echo a\x00b")
        # Sizes: one argument, one environment string, and all of them together.
        with pytest.raises(InvalidArgumentError, match="cmd is too long"):
            await sb.exec("echo " + "a" * 200_000)
        with pytest.raises(InvalidArgumentError, match="environment variable BIG is too long"):
            await sb.exec("true", env={"BIG": "x" * 200_000})
        many = {f"V{i}": "y" * 120_000 for i in range(24)}  # 2.9 MB: over ARG_MAX in total
        with pytest.raises(InvalidArgumentError, match="E2BIG"):
            await sb.exec("true", env=many)
        # None of those broke anything.
        res = await sb.exec("echo ok")
        assert (res.exit_code, res.output) == (0, "ok\n")


async def test_refusals_are_not_infrastructure_errors() -> None:
    # The types' roots: a trainer drops an episode for SandboxError only.
    assert not issubclass(SandboxPermissionError, SandboxError)
    assert issubclass(SandboxPermissionError, PermissionError)
    assert not issubclass(InvalidArgumentError, SandboxError)
