"""The docker test fixture's sweep of roots that killed test runs left behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.dockerenv import _mounts_under, sweep_stale_roots

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


def _stale_root(parent: Path, name: str, *, user: int) -> Path:
    """A root as a SIGKILLed run leaves it: dockerd's data root bound on itself, a dead daemon."""
    root = parent / f"trio_swe-dk-{name}"
    data = root / "dk" / "data"
    data.mkdir(parents=True)
    (data / "f").write_text("x")
    (root / f"user-{user}").touch()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (root / "state.json").write_text(
        json.dumps({"dockerd_pid": dead.pid, "registry_pid": dead.pid})
    )
    subprocess.run(["mount", "--bind", str(data), str(data)], check=True)
    old = time.time() - 3600
    os.utime(root, (old, old))
    return root


def test_a_stale_root_is_unmounted_and_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = _stale_root(tmp_path, "stale", user=dead.pid)
    live = _stale_root(tmp_path, "live", user=os.getpid())  # a worker of it is alive
    try:
        assert _mounts_under(stale) == [str(stale / "dk" / "data")]
        sweep_stale_roots(tmp_path)
        assert _mounts_under(stale) == []
        assert not stale.exists()
        assert _mounts_under(live) == [str(live / "dk" / "data")]
        assert (live / "dk" / "data" / "f").read_text() == "x"
    finally:
        for root in (stale, live):
            for mount in _mounts_under(root):
                subprocess.run(["umount", "--lazy", mount], check=False)
