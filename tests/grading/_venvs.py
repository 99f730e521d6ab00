"""Real virtualenvs for grading tests (``python -m venv``), with a module of their own."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import uuid
from pathlib import Path


def make_venv(root: Path, *, with_test_env: bool = True) -> tuple[Path, str]:
    """A real venv at ``root`` with its own module; returns (bin dir, module name).

    ``with_test_env``: reach the test environment's packages (pytest) through a ``.pth``;
    without it the venv has a ``pytest`` script but no pytest, like an environment whose test
    runner is missing.
    """
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run(
        [base, "-m", "venv", "--without-pip", str(root)],
        check=True,
        capture_output=True,
    )
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = root / "lib" / ver / "site-packages"
    assert site.is_dir(), list(root.rglob("site-packages"))
    module = f"trio_swe_venv_probe_{uuid.uuid4().hex[:8]}"
    (site / f"{module}.py").write_text("WHERE = __file__\n")
    # The test environment's packages (pytest), reachable only through the venv's lib/.
    if with_test_env:
        (site / "test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # The console script pip would write: its shebang names the venv's python.
    script = root / "bin" / "pytest"
    script.write_text(
        f"#!{root}/bin/python\nimport sys\nfrom pytest import console_main\n"
        "sys.exit(console_main())\n"
    )
    script.chmod(0o755)
    return root / "bin", module
