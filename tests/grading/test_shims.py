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


def test_the_repository_reinstall_is_skipped_and_nothing_else() -> None:
    shim = local_backend_shims()["ro_binds"][ACTIVATE_PATH]
    body = (
        "conda activate testbed\n"
        "python -m pip install -e . && echo skipped1\n"
        "python -m pip install -v --no-use-pep517 --no-build-isolation -e . && echo skipped2\n"
        "pip install -e '.[test]' && echo skipped3\n"
        "python setup.py develop && echo skipped4\n"
        "python -c 'print(40 + 2)'\n"
        "python -m pip --version >/dev/null && echo pip-runs\n"
        "python -m pip install --no-index no-such-package-xyz; echo rc=$?\n"
    )
    out = _source(shim, body)
    for n in range(1, 5):
        assert f"skipped{n}" in out.stdout
    assert out.stderr.count("trio_swe shim: skipped") == 4
    assert "42" in out.stdout
    assert "pip-runs" in out.stdout
    assert "rc=0" not in out.stdout  # an install of another package is not skipped
    forced = _source(shim, "TRIO_SWE_REINSTALL=1 python -m pip install --no-index -e /nonexistent")
    assert "trio_swe shim: skipped" not in forced.stderr
    assert forced.returncode != 0
