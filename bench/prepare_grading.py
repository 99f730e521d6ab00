"""One-time preparation of ``bench_grading``'s real SWE-bench rows (uses PyPI, nothing else).

A real row needs its repository at the row's commit, with its tests, and a test environment.
Each row here is graded against a release's sdist that is that tree as far as the row goes (the
row's test patch and gold patch apply to it, and the row's tests fail and pass as the dataset
says): SWE-bench Lite's ``pallets__flask-4992`` against Flask 2.2.5, ``pvlib__pvlib-python-1072``
against pvlib 0.8.0 (released two weeks before the row's base commit). This downloads each sdist
and builds its test environment (pinned versions that install on this Python) under
``~/.cache/trio_swe/bench`` (``BENCH_CACHE``). The benchmark itself sends nothing off the machine.

Run: ``python -m bench.prepare_grading``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS_DIR = ROOT / "tests" / "grading" / "rows"


@dataclass(frozen=True)
class RealRow:
    """A real SWE-bench row and what grading it locally needs."""

    instance_id: str
    row_file: Path
    sdist: str  # "project==version"
    env: tuple[str, ...]  # the test environment's packages, pinned
    tests: str  # the row's test file, relative to the tree (the tests alone run it)

    @property
    def dir(self) -> Path:
        return cache_dir() / self.sdist.replace("==", "-")


FLASK = RealRow(
    instance_id="pallets__flask-4992",
    row_file=ROWS_DIR / "swebench_classic__pallets__flask-4992.json",
    sdist="flask==2.2.5",
    # The versions swebench 4.x's specs pin for flask 2.3, and pytest.
    env=(
        "Werkzeug==2.3.7",
        "Jinja2==3.1.2",
        "itsdangerous==2.1.2",
        "click==8.1.3",
        "MarkupSafe==2.1.1",
        "blinker==1.6.2",
        "pytest==7.4.4",
    ),
    tests="tests/test_config.py",
)
PVLIB = RealRow(
    instance_id="pvlib__pvlib-python-1072",
    row_file=ROWS_DIR / "swebench_classic__pvlib__pvlib-python-1072.json",
    sdist="pvlib==0.8.0",
    # pvlib's install_requires and swebench's conda packages for it (pandas, scipy), at
    # versions with wheels for this Python; setuptools for conftest's pkg_resources.
    env=(
        "numpy==1.26.4",
        "pandas==1.5.3",
        "scipy==1.11.4",
        "pytz==2026.6",
        "python-dateutil==4.0.0",
        "requests==2.34.2",
        "setuptools==65.5.0",
        "pytest==7.4.4",
    ),
    tests="pvlib/tests/test_temperature.py",
)
REAL_ROWS = (FLASK, PVLIB)


def cache_dir() -> Path:
    return Path(os.environ.get("BENCH_CACHE", Path.home() / ".cache" / "trio_swe" / "bench"))


def prepared(real: RealRow) -> tuple[Path, str] | None:
    """(source tree, test environment's bin) of ``real`` if prepared."""
    src, env_bin = real.dir / "src", real.dir / "env" / "bin"
    if (src / real.tests).is_file() and (env_bin / "pytest").is_file():
        return src, str(env_bin)
    return None


def prepare(real: RealRow) -> None:
    d = real.dir
    if prepared(real) is not None:
        print(f"already prepared: {d}")
        return
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, real.sdist, "-d", tmp], check=True)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        shutil.move(str(next(p for p in Path(tmp).iterdir() if p.is_dir())), d / "src")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(d / "env")], check=True)
    subprocess.run([str(d / "env" / "bin" / "pip"), "install", "-q", *real.env], check=True)
    print(f"prepared: {d}")


def main() -> None:
    for real in REAL_ROWS:
        prepare(real)


if __name__ == "__main__":
    main()
