"""One-time preparation of ``bench_grading``'s real-repository case (uses PyPI, nothing else).

SWE-bench Lite's ``pallets__flask-4992`` needs Flask's source at the row's commit, with its tests.
Flask 2.2.5's sdist is that tree as far as the row goes (the row's test patch and gold patch apply
to it). This downloads the sdist and builds the test environment (the versions swebench 4.x's
specs pin for flask 2.3, and pytest) under ``~/.cache/trio_swe/bench`` (``BENCH_CACHE``). The
benchmark itself sends nothing off the machine.

Run: ``python -m bench.prepare_grading``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLASK_ROW = ROOT / "tests" / "grading" / "rows" / "swebench_classic__pallets__flask-4992.json"
FLASK = "2.2.5"
TEST_ENV = [
    "Werkzeug==2.3.7",
    "Jinja2==3.1.2",
    "itsdangerous==2.1.2",
    "click==8.1.3",
    "MarkupSafe==2.1.1",
    "blinker==1.6.2",
    "pytest==7.4.4",
]


def cache_dir() -> Path:
    return Path(os.environ.get("BENCH_CACHE", Path.home() / ".cache" / "trio_swe" / "bench"))


def prepared_flask() -> tuple[Path, str] | None:
    """(Flask source tree, test environment's bin) if prepared."""
    d = cache_dir() / f"flask-{FLASK}"
    src, env_bin = d / "src", d / "env" / "bin"
    if (src / "tests" / "test_config.py").is_file() and (env_bin / "pytest").is_file():
        return src, str(env_bin)
    return None


def main() -> None:
    d = cache_dir() / f"flask-{FLASK}"
    if prepared_flask() is not None:
        print(f"already prepared: {d}")
        return
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
        subprocess.run([*pip, f"flask=={FLASK}", "-d", tmp], check=True)
        (sdist,) = Path(tmp).glob("*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        shutil.move(str(next(p for p in Path(tmp).iterdir() if p.is_dir())), d / "src")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(d / "env")], check=True)
    subprocess.run([str(d / "env" / "bin" / "pip"), "install", "-q", *TEST_ENV], check=True)
    print(f"prepared: {d}")


if __name__ == "__main__":
    main()
