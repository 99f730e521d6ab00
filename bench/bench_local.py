"""Local sandbox boot time for a 10k-file image, beside a plain recursive copy of that image.

The copy is what a sandbox backend without copy-on-write pays per boot (and what the local
backend's ``workspace="copy"`` fallback does). Boot here is the whole ``open_sandbox`` entry:
image resolution, state directory, overlay mount, bwrap namespaces, init ready.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import trio

from trio_swe import open_sandbox
from trio_swe.sandbox.local import LocalBackend

FILES = 10_000
RUNS = 10
COPY_RUNS = 5  # copying 10k files is slow; fewer runs keep the benchmark short


def make_image(root: Path) -> Path:
    image = root / "image"
    for i in range(FILES):
        d = image / f"pkg{i % 100:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"mod{i}.py").write_text(f"VALUE_{i} = {i}\n" * 20)
    return image


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def boot_times(backend: LocalBackend, image: Path) -> list[float]:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        async with open_sandbox(backend, str(image)) as sb:
            times.append(time.perf_counter() - t0)
            await sb.exec("true")
    return times


def copy_times(image: Path, scratch: Path) -> list[float]:
    times = []
    for i in range(COPY_RUNS):
        t0 = time.perf_counter()
        shutil.copytree(image, scratch / f"copy{i}", symlinks=True)
        times.append(time.perf_counter() - t0)
        shutil.rmtree(scratch / f"copy{i}")
    return times


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        root = Path(tmp)
        image = make_image(root)
        backend = LocalBackend(state_dir=root / "state")
        trio.run(boot_times, backend, image)  # warm-up: overlay probe, page cache
        boots = trio.run(boot_times, backend, image)
        copies = copy_times(image, root)
        mode = backend.statistics().workspace_mode
        print(f"image: {FILES} files; {RUNS} boots, {COPY_RUNS} copies; workspace mode: {mode}")
        print(f"{'':28}{'median s':>10}{'p95 s':>10}")
        print(
            f"{'open_sandbox (boot)':28}{statistics.median(boots):>10.4f}{pct(boots, 0.95):>10.4f}"
        )
        print(
            f"{'recursive copy (baseline)':28}{statistics.median(copies):>10.4f}{pct(copies, 0.95):>10.4f}"
        )
        print(
            f"boot is {statistics.median(copies) / statistics.median(boots):.1f}x faster than a copy (median)"
        )


if __name__ == "__main__":
    main()
