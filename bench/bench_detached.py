"""Detached execution: how fast a finished command is noticed, and how many RPCs it costs.

For a command of ``BENCH_DETACHED_SEC`` seconds (default 10) on the local backend, ``N`` runs of
each scheme at once in one sandbox (``BENCH_DETACHED_N``, default 5). Run ``i`` lasts
``10 + 5 * i / N`` seconds, so the command ends are spread evenly over one 5 s polling period
(a 10 s command would otherwise end exactly on a poll tick of the baseline):

* ``exec_and_wait``: trio_swe's long-poll (one in-sandbox ``flock`` wait per RPC, up to 20 s);
* ``fixed 5 s poll``: slime's scheme, re-implemented here from its description: launcher with
  ``echo $? > done``, spawn behind a ``mkdir`` lock, then ``sleep 5`` + ``test -f done && cat``.

Wake-up latency = the caller's wall clock when the call returns minus the command's last
``date +%s.%N`` (the local sandbox shares the host's clock). RPCs = exec + write_file +
read_file calls counted by a forwarding wrapper. Also: the whole-call time of a no-op command.

Run: ``python -m bench detached`` (or ``nox -s bench -- detached``).
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trio_swe import ExecResult, Sandbox, exec_and_wait, open_sandbox
from trio_swe.sandbox import SandboxStatistics
from trio_swe.sandbox.local import LocalBackend

DURATION = float(os.environ.get("BENCH_DETACHED_SEC", "10"))
N = int(os.environ.get("BENCH_DETACHED_N", "5"))
SLIME_POLL_SEC = 5.0


class Counting:
    """Forwards to a sandbox and counts the RPCs made through it."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb
        self.rpcs = 0

    @property
    def id(self) -> str:
        return self._sb.id

    @property
    def workdir(self) -> str:
        return self._sb.workdir

    def start_background(self, async_fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        self._sb.start_background(async_fn, *args)

    async def exec(self, cmd: str, **kw: Any) -> ExecResult:
        self.rpcs += 1
        return await self._sb.exec(cmd, **kw)

    async def write_file(self, path: str, data: bytes | str, **kw: Any) -> None:
        self.rpcs += 1
        await self._sb.write_file(path, data, **kw)

    async def read_file(self, path: str, **kw: Any) -> bytes:
        self.rpcs += 1
        return await self._sb.read_file(path, **kw)

    async def kill(self) -> None:
        await self._sb.kill()

    def statistics(self) -> SandboxStatistics:
        return self._sb.statistics()


async def slime_style(sb: Sandbox, cmd: str, *, time_budget_sec: float) -> tuple[int, str]:
    """The baseline: fixed-interval polling of a done marker (slime's exec_and_wait, §1.2-1.3)."""
    tag = uuid.uuid4().hex
    launcher, out, done, lock = (f"/tmp/.{tag}.{s}" for s in ("sh", "out", "done", "spawned"))
    await sb.write_file(launcher, f"#!/bin/bash\ncd {sb.workdir}\n{cmd}\necho $? > {done}\n")
    await sb.exec(f"rm -rf {lock}; rm -f {out} {done}", timeout=30, idempotent=True)
    await sb.exec(
        f"chmod +x {launcher}; mkdir {lock} 2>/dev/null || exit 0; "
        f"setsid bash {launcher} < /dev/null > {out} 2>&1 &",
        timeout=30,
        idempotent=True,
    )
    deadline = time.time() + time_budget_sec
    while time.time() < deadline:
        await trio.sleep(SLIME_POLL_SEC)
        r = await sb.exec(f"test -f {done} && cat {done}", timeout=15)
        if r.exit_code == 0 and r.output.strip():
            data = await sb.read_file(out)
            return int(r.output.strip()), data.decode(errors="replace")
    return -1, ""


async def ours(sb: Sandbox, cmd: str, *, time_budget_sec: float) -> tuple[int, str]:
    r = await exec_and_wait(sb, cmd, time_budget_sec=time_budget_sec, want_output=True)
    return r.exit_code, r.output


Scheme = Callable[..., Awaitable[tuple[int, str]]]


async def measure(sb: Sandbox, scheme: Scheme, duration: float) -> tuple[float, int, float]:
    """(wake-up latency after the command's end, RPCs, whole-call seconds) of one call."""
    counting = Counting(sb)
    cmd = f"sleep {duration}; date +%s.%N"
    t0 = time.perf_counter()
    code, output = await scheme(counting, cmd, time_budget_sec=duration + 60)
    woke = time.time()
    total = time.perf_counter() - t0
    assert code == 0, output
    ended = float(output.split()[-1])
    return woke - ended, counting.rpcs, total


async def run() -> None:
    image = tempfile.mkdtemp(prefix="bench_detached_")
    results: dict[str, list[tuple[float, int, float]]] = {"exec_and_wait": [], "fixed 5 s poll": []}
    noop: dict[str, list[float]] = {"exec_and_wait": [], "fixed 5 s poll": []}
    schemes: dict[str, Scheme] = {"exec_and_wait": ours, "fixed 5 s poll": slime_style}
    async with open_sandbox(LocalBackend(), image) as sb:

        async def one(name: str, duration: float) -> None:
            results[name].append(await measure(sb, schemes[name], duration))

        async def one_noop(name: str) -> None:
            noop[name].append((await measure(sb, schemes[name], 0))[2])

        print(
            f"{N} concurrent runs per scheme of a {DURATION:g}-{DURATION + SLIME_POLL_SEC:g} s "
            "command (ends spread over one poll period), local backend"
        )
        async with trio.open_nursery() as n:
            for i in range(N):
                for name in schemes:
                    # Spread the ends over one 5 s poll period, so no scheme is lucky with phase.
                    n.start_soon(one, name, DURATION + i * SLIME_POLL_SEC / N)
        async with trio.open_nursery() as n:
            for _ in range(N):
                for name in schemes:
                    n.start_soon(one_noop, name)

    print(
        f"{'scheme':<16}{'wake-up after end (median)':>28}{'max':>10}"
        f"{'RPCs/command':>14}{'no-op call (median)':>22}"
    )
    for name in schemes:
        lat = [r[0] for r in results[name]]
        rpcs = [r[1] for r in results[name]]
        print(
            f"{name:<16}{statistics.median(lat) * 1000:>25.1f} ms{max(lat) * 1000:>7.0f} ms"
            f"{statistics.median(rpcs):>14g}{statistics.median(noop[name]) * 1000:>19.1f} ms"
        )
    ours_lat = statistics.median(r[0] for r in results["exec_and_wait"])
    base_lat = statistics.median(r[0] for r in results["fixed 5 s poll"])
    ours_rpc = statistics.median(r[1] for r in results["exec_and_wait"])
    base_rpc = statistics.median(r[1] for r in results["fixed 5 s poll"])
    print(
        f"ratio (fixed poll / exec_and_wait): wake-up latency {base_lat / ours_lat:.0f}x, "
        f"RPCs {base_rpc / ours_rpc:.2f}x"
    )


def main() -> None:
    trio.run(run)


if __name__ == "__main__":
    main()
