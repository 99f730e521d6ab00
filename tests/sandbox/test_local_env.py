"""A command's environment applies inside the sandbox only (issue 9, item 2).

The host-side launcher (``nsenter``, root, before it enters the namespaces) once ran with the
command's environment: a host directory first on ``PATH`` chose which ``nsenter`` ran, and
``LD_PRELOAD`` loaded a host library into it. Each payload here writes a canary file on the host
(under the test's directory, which the sandbox cannot see: its /tmp is private).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import trio

from trio_swe import InvalidArgumentError, open_sandbox
from trio_swe.sandbox.local import LocalBackend


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir()
    return img


async def test_path_does_not_pick_the_host_launcher(image: Path, tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    canary = tmp_path / "nsenter-ran"
    for tool in ("nsenter", "setpriv", "env"):
        (fake / tool).write_text(f"#!/bin/sh\necho {tool} >> {canary}\nexit 99\n")
        (fake / tool).chmod(0o755)
    path = f"{fake}:/usr/bin:/bin"
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        for user in ("root", "agent"):
            r = await sb.exec('echo "$PATH"', env={"PATH": path}, user=user)
            assert r.ok, r
            assert r.output == f"{path}\n"  # the command got its PATH, inside the sandbox
    assert not canary.exists(), canary.read_text()


async def test_ld_preload_is_not_loaded_on_the_host(image: Path, tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the preload library (scripts/bootstrap installs gcc)")
    canary = tmp_path / "preload-ran"
    src = tmp_path / "evil.c"
    src.write_text(
        "#include <stdio.h>\n"
        "__attribute__((constructor)) static void run(void) {\n"
        f'  FILE *f = fopen("{canary}", "a"); if (f) {{ fputs("loaded\\n", f); fclose(f); }}\n'
        "}\n"
    )
    lib = tmp_path / "evil.so"
    await trio.run_process([cc, "-shared", "-fPIC", "-o", str(lib), str(src)])
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        # The library is under the host's /tmp: inside the sandbox the path does not exist, so
        # the loader inside complains and the command still runs.
        r = await sb.exec("echo ran", env={"LD_PRELOAD": str(lib)})
        assert r.ok, r
        assert "ran" in r.output
        env_inside = await sb.exec('printf %s "$LD_PRELOAD"', env={"LD_PRELOAD": str(lib)})
        assert env_inside.output.rstrip().endswith(str(lib))
    assert not canary.exists()


async def test_argv0_with_an_equals_sign_is_refused(image: Path) -> None:
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        with pytest.raises(InvalidArgumentError, match="argv"):
            await sb.start_process(["A=B", "true"])
