"""End-to-end episodes on the local backend: throughput, and the library's own overhead.

The demo set (minus its deliberately slow instance) runs through the bash agent and the scripted
policy server on loopback, at concurrency 1, 4 and 16:

* episodes per minute at each concurrency, side by side, with the speed-up over concurrency 1
  (the baseline, measured in the same run);
* the library's own overhead per episode: wall time minus the agent's commands, the policy's
  replies and the graded test run (so: two sandbox boots and kills, workspace setup, patch
  extraction, grading's apply/setup, sample building), median and p95, beside the backend's
  bare cost measured in the same run (``open_sandbox`` + one ``exec`` + kill, twice, i.e. what
  any harness booting an agent sandbox and an eval sandbox pays at least).

Run: ``python -m bench episode``. ``BENCH_EPISODE_CONCURRENCY`` (default ``1,4,16``) and
``BENCH_EPISODE_PER_LEVEL`` (default ``7,14,32``) change the levels and episode counts.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import trio

from trio_swe import EpisodeResult, SweConfig, open_sandbox, run_rollouts
from trio_swe.agents import BashAgent
from trio_swe.config import BashAgentOptions, BootPolicy, EpisodeBudgets
from trio_swe.demo import build_demo_set, open_scripted_policy_server
from trio_swe.grading import get_metadata
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.sandbox.local import LocalBackend

LEVELS = [int(x) for x in os.environ.get("BENCH_EPISODE_CONCURRENCY", "1,4,16").split(",")]
COUNTS = [int(x) for x in os.environ.get("BENCH_EPISODE_PER_LEVEL", "7,14,32").split(",")]
BARE_RUNS = 10


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _bare_boot_cost(backend: LocalBackend, image: str) -> list[float]:
    """Two sandbox lifecycles (boot, one exec, kill): the floor of any agent+eval episode."""
    costs = []
    for _ in range(BARE_RUNS):
        t0 = time.monotonic()
        for _ in range(2):
            async with open_sandbox(backend, image, network=False) as sb:
                await sb.exec("true")
        costs.append(time.monotonic() - t0)
    return costs


async def _run() -> None:
    with tempfile.TemporaryDirectory(prefix="bench_episode-") as tmp:
        demo = build_demo_set(f"{tmp}/repos")
        rows = [r for r in demo.rows if r["metadata"]["instance_id"] not in demo.timeouts]
        mds = [get_metadata(r, "scaleswe") for r in rows]
        backend = LocalBackend(state_dir=f"{tmp}/state")
        config = SweConfig(
            episode=EpisodeBudgets(
                agent_time_budget_sec=120, eval_timeout_sec=120, setup_timeout_sec=120
            ),
            boot=BootPolicy(concurrency=16),
            bash=BashAgentOptions(max_turns=10),
        )
        bare = await _bare_boot_cost(backend, mds[0].image)
        table: list[tuple[int, int, float, float]] = []
        overheads: list[float] = []
        totals: list[float] = []
        phases: dict[str, list[float]] = {}
        async with (
            open_scripted_policy_server(demo.scripts) as server,
            SGLangPolicy(server.url) as policy,
        ):
            agent = BashAgent(policy, ByteTokenizer(), max_turns=10)
            for level, count in zip(LEVELS, COUNTS, strict=True):
                instances = [mds[i % len(mds)] for i in range(count)]
                results: list[EpisodeResult] = []
                t0 = time.monotonic()
                async with run_rollouts(
                    instances,
                    agent,
                    backend=backend,
                    config=config,
                    concurrency=level,
                    network=False,
                ) as stream:
                    async for result in stream:
                        results.append(result)
                wall = time.monotonic() - t0
                bad = [r for r in results if r.status == "aborted"]
                if bad:
                    raise RuntimeError(f"aborted episodes in the benchmark: {bad[0].error}")
                table.append((level, count, wall, count / wall * 60))
                if level == LEVELS[0]:
                    # Overhead is measured without contention (concurrency 1).
                    overheads = [r.timings.overhead for r in results]
                    totals = [r.timings.total for r in results]
                    phases = {
                        "agent sandbox boot": [r.timings.boot for r in results],
                        "workspace setup": [r.timings.setup for r in results],
                        "agent loop (minus commands, policy)": [
                            r.timings.agent - r.timings.agent_commands - r.timings.agent_policy
                            for r in results
                        ],
                        "patch extraction": [r.timings.patch for r in results],
                        "agent sandbox kill (overlaps grading)": [r.timings.kill for r in results],
                        "grading (minus the test run)": [
                            r.timings.eval - r.timings.eval_tests for r in results
                        ],
                    }

    base = table[0][3]
    print(f"{'concurrency':>11} {'episodes':>8} {'wall s':>8} {'episodes/min':>13} {'vs c=1':>7}")
    for level, count, wall, rate in table:
        print(f"{level:>11} {count:>8} {wall:>8.1f} {rate:>13.1f} {rate / base:>6.2f}x")
    print()
    print("per episode at concurrency 1 (seconds)     median      p95")
    print(
        f"  wall time                              {statistics.median(totals):>8.3f} {_pct(totals, 0.95):>8.3f}"
    )
    print(
        f"  library overhead                       {statistics.median(overheads):>8.3f} {_pct(overheads, 0.95):>8.3f}"
    )
    print(
        f"  bare 2x(boot+exec+kill) baseline       {statistics.median(bare):>8.3f} {_pct(bare, 0.95):>8.3f}"
    )
    ratio = statistics.median(overheads) / statistics.median(bare)
    print(f"  overhead / bare baseline (median)      {ratio:>8.2f}x")
    print("  overhead by phase:")
    for name, values in phases.items():
        print(f"    {name:<38} {statistics.median(values):>8.3f} {_pct(values, 0.95):>8.3f}")


def main() -> None:
    trio.run(_run)


if __name__ == "__main__":
    main()
