"""Run every benchmark module (``bench/bench_*.py``), or those named on the command line.

Each module defines ``main() -> None`` that prints its own table; figures are ratios against a
baseline measured in the same run, medians over several runs.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> None:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    wanted = [a.removeprefix("bench_") for a in argv]
    if wanted:
        names = [n for n in names if n.removeprefix("bench_") in wanted]
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        t0 = time.perf_counter()
        importlib.import_module(f"bench.{name}").main()
        print(f"--- {name}: {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
