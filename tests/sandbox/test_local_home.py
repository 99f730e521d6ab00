"""root's home in local sandboxes: private, writable, gone with the sandbox; the host's untouched."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from trio_swe import open_sandbox
from trio_swe.sandbox.local import LocalBackend
from trio_swe.sandbox.local._backend import _outermost, _venv_base

from ..conftest import host_pids_gone

_PROBE = ".trio_swe_probe-"


def host_root_state() -> tuple[list[str], bytes | None]:
    """The names in the host's /root (less other tests' probes) and its git config."""
    names = sorted(n for n in os.listdir("/root") if not n.startswith(_PROBE))
    try:
        gitconfig: bytes | None = Path("/root/.gitconfig").read_bytes()
    except FileNotFoundError:
        gitconfig = None
    return names, gitconfig


def on_host(*paths: str) -> bool:
    """Does any of ``paths`` exist on the host?"""
    return any(os.path.lexists(p) for p in paths)


def shown_under_root() -> set[str]:
    """Top-level names the sandbox's /root has anyway: mount points of the shown interpreter."""
    return {
        Path(p).relative_to("/root").parts[0]
        for p in (sys.prefix, sys.base_prefix)
        if p.startswith("/root/")
    }


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir()
    (img / "hello.txt").write_text("hello\n")
    return img


async def test_root_home_is_writable_private_and_removed_with_the_sandbox(
    image: Path, tmp_path: Path
) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    state = tmp_path / "state"
    backend = LocalBackend(state_dir=state)
    before = host_root_state()
    async with open_sandbox(backend, str(image)) as a, open_sandbox(backend, str(image)) as b:
        home = await a.exec("echo $HOME; id -un; stat -c %a /root")
        assert home.output == "/root\nroot\n700\n"
        # One mount at /root, standing in for the host's read-only bind: no extra boot cost.
        at_root = await a.exec("awk '$5 == \"/root\"' /proc/self/mountinfo | wc -l")
        assert at_root.output.strip() == "1"
        assert (await a.exec("echo $HOME", user="agent")).output == "/home/agent\n"
        wrote = await a.exec(
            f"mkdir -p ~/.cache && echo {marker} > ~/.cache/x && cat /root/.cache/x"
            f" && git config --global user.name {marker} && git config --global user.name"
        )
        assert wrote.output == f"{marker}\n{marker}\n", wrote.output
        # A fresh home, not the host's: its files (git identity, tokens) stay out of sight.
        assert set((await b.exec("ls -A /root")).output.split()) == shown_under_root()
        assert (await b.exec("test -e /root/.cache/x")).exit_code == 1
        assert (await b.exec("git config --global user.name")).exit_code == 1
        await b.write_file("/root/.config/tool/b.txt", "from b")
        assert (await a.exec("test -e /root/.config/tool/b.txt")).exit_code == 1
        # The unprivileged user cannot look into root's home, as on a normal machine.
        assert (await a.exec("ls /root", user="agent")).exit_code != 0
        # A daemon still writing to ~ when the sandbox is killed must leave nothing behind.
        started = await a.exec(
            f"setsid sh -c 'while :; do echo {marker} >> ~/.cache/log; done' "
            "</dev/null >/dev/null 2>&1 & until test -s ~/.cache/log; do :; done; echo up",
            timeout=30,
        )
        assert started.output == "up\n"
    assert await host_pids_gone(marker) == []
    await backend.aclose()  # the state directories' removal runs in the background
    # Only what the backend shares between sandboxes remains (image checkouts, passwd/group).
    assert {p.name for p in state.iterdir()} <= {"trash", "images", "shared"}
    assert list((state / "trash").iterdir()) == []
    assert host_root_state() == before
    assert not on_host("/root/.cache/x", "/root/.config/tool/b.txt")


async def test_running_interpreter_under_root_is_still_shown(image: Path, tmp_path: Path) -> None:
    """The sandbox must still run the host's venv, whose python may link into /root/.pyenv."""
    venv_bin = os.path.dirname(sys.executable)
    backend = LocalBackend(state_dir=tmp_path / "state", extra_path=[venv_bin])
    async with open_sandbox(backend, str(image)) as sb:
        ran = await sb.exec("python -c 'import sys, trio; print(sys.prefix)'")
        assert ran.output == f"{sys.prefix}\n", ran.output
        # Shown read-only: root cannot change the host's interpreter from inside.
        assert (await sb.exec(f"touch {sys.base_prefix}/trio_swe_probe")).exit_code != 0
    assert not on_host(f"{sys.base_prefix}/trio_swe_probe")


async def test_host_paths_under_root_are_shown_read_only(image: Path, tmp_path: Path) -> None:
    """A tool installed under the host's /root is reachable when asked for by name."""
    probe = Path("/root") / f"{_PROBE}{uuid.uuid4().hex}"
    probe.mkdir()
    try:
        (probe / "tool").write_text("#!/bin/sh\necho tool-ran\n")
        (probe / "tool").chmod(0o755)
        backend = LocalBackend(state_dir=tmp_path / "state", host_paths=[str(probe)])
        async with open_sandbox(backend, str(image)) as sb:
            assert (await sb.exec(f"{probe}/tool")).output == "tool-ran\n"
            assert (await sb.exec(f"touch {probe}/new")).exit_code != 0
            assert (await sb.exec(f"touch /root/{probe.name}-sibling")).exit_code == 0
        assert sorted(os.listdir(probe)) == ["tool"]
        assert not on_host(f"/root/{probe.name}-sibling")
    finally:
        for child in probe.iterdir():
            child.unlink()
        probe.rmdir()


def test_venv_base_reads_pyvenv_cfg(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    assert _venv_base(str(venv / "bin")) is None
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = false\nhome = /root/py/bin\n")
    assert _venv_base(str(venv / "bin")) == "/root/py"


def test_outermost_drops_nested_paths() -> None:
    paths = {"/root/a", "/root/a/b", "/root/ab", "/tmp/x/y", "/tmp/x"}
    assert _outermost(paths) == ["/root/a", "/root/ab", "/tmp/x"]


async def test_host_paths_root_itself_shows_the_hosts_root_read_only(
    image: Path, tmp_path: Path
) -> None:
    backend = LocalBackend(state_dir=tmp_path / "state", host_paths=["/root"])
    async with open_sandbox(backend, str(image)) as sb:
        inside = (await sb.exec("ls -A /root")).output.split()
        assert sorted(n for n in inside if not n.startswith(_PROBE)) == host_root_state()[0]
        assert (await sb.exec(f"touch /root/{_PROBE}opt-out")).exit_code != 0
    assert not on_host(f"/root/{_PROBE}opt-out")
