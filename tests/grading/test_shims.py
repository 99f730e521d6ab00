"""The local-backend shims for SWE-bench's Docker assumptions, exercised with a real bash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trio_swe.grading import local_backend_shims
from trio_swe.grading._shims import ACTIVATE_PATH, ENV_BIN_PATH


def _source(shim: str, body: str) -> subprocess.CompletedProcess[str]:
    script = f"set -uo pipefail\nsource {shim}\n{body}\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, check=False
    )


def test_shim_paths_and_environment(tmp_path: Path) -> None:
    kw = local_backend_shims(tmp_path)
    assert kw["extra_path"] == [str(tmp_path)]
    assert kw["ro_binds"][ENV_BIN_PATH] == str(tmp_path)
    assert Path(kw["ro_binds"][ACTIVATE_PATH]).is_file()
    assert kw["env"]["GIT_CONFIG_GLOBAL"].startswith("/tmp/")
    # Default: the running interpreter's environment.
    assert local_backend_shims()["extra_path"] == [os.path.dirname(sys.executable)]


def test_conda_activate_succeeds_and_sets_the_editable_path() -> None:
    shim = local_backend_shims()["ro_binds"][ACTIVATE_PATH]
    out = _source(shim, 'conda activate testbed && echo "PP=$PYTHONPATH NOIDX=$PIP_NO_INDEX"')
    assert out.returncode == 0, out.stderr
    assert "PP=/testbed NOIDX=1" in out.stdout
    # Sourcing twice (SWE-bench scripts do) does not stack the path.
    twice = _source(shim, f'source {shim}; echo "PP=$PYTHONPATH"')
    assert "PP=/testbed\n" in twice.stdout


def test_other_conda_commands_fail_loudly() -> None:
    shim = local_backend_shims()["ro_binds"][ACTIVATE_PATH]
    out = _source(shim, "conda install numpy; echo rc=$?")
    assert "rc=1" in out.stdout
    assert "not available on the local backend" in out.stderr
