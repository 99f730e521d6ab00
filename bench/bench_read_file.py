"""Cost of ``read_file``'s checks (issue 9, item 3), per backend, as ratios in the same run.

``read_file(path)`` (regular files only, capped) against ``read_file(path, special=True,
max_bytes=None)`` (no type check, no cap: what the old ``read_file`` did), on a 4 KiB file,
medians of ``ROUNDS`` rounds of ``CALLS`` sequential reads.

* local: one ``sh`` script either way; the checks are shell tests and a ``stat``.
* e2b (the ``trio_swe.testing`` server over h2c, in this process): the default path adds one
  ``filesystem.Filesystem/Stat`` RPC. The test server answers ``Stat`` by running a small
  Python program in the sandbox, so this overstates the cost against real envd (a Go
  ``os.Stat``), where the extra round trip is the cost.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import trio

from trio_swe import Sandbox, open_sandbox
from trio_swe.sandbox import Backend
from trio_swe.sandbox.local import LocalBackend

ROUNDS = 5
CALLS = 40


async def _time_reads(sb: Sandbox, **kw: object) -> float:
    t0 = time.perf_counter()
    for _ in range(CALLS):
        data = await sb.read_file("/tmp/f", **kw)  # type: ignore[arg-type]
        assert len(data) == 4096
    return (time.perf_counter() - t0) / CALLS


async def _measure(backend: Backend, image: str) -> tuple[float, float]:
    checked: list[float] = []
    bare: list[float] = []
    async with open_sandbox(backend, image) as sb:
        await sb.write_file("/tmp/f", bytes(4096))
        for _ in range(ROUNDS):
            checked.append(await _time_reads(sb))
            bare.append(await _time_reads(sb, special=True, max_bytes=None))
    return statistics.median(checked), statistics.median(bare)


def main() -> None:
    from trio_swe.sandbox.e2b import E2BBackend
    from trio_swe.testing import open_envd_server

    async def run() -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        with tempfile.TemporaryDirectory() as tmp:
            image = str(Path(tmp))
            out["local"] = await _measure(LocalBackend(), image)
            async with (
                open_envd_server(templates={"base": image}) as server,
                E2BBackend(
                    api_key=server.api_key,
                    api_url=server.api_url,
                    sandbox_url=server.sandbox_url,
                    h2c=True,
                ) as backend,
            ):
                out["e2b (test server)"] = await _measure(backend, "base")
        return out

    results = trio.run(run)
    print(f"{'backend':<20} {'checked ms':>11} {'unchecked ms':>13} {'ratio':>6}")
    for name, (checked, bare) in results.items():
        print(f"{name:<20} {checked * 1e3:>11.2f} {bare * 1e3:>13.2f} {checked / bare:>6.2f}")
