"""Is the engine ever starved by trio_swe? A rollout against a real vLLM beside a direct loop.

A rollout of 32 demo episodes (the eight demo instances four times) at concurrency 8, with the
bash agent on the tiny Qwen3 served by vLLM (``scripts/engine-env``), records every policy call
(prompt, sampling parameters, output) and when it was in flight. The baseline replays exactly
those calls with eight workers, each sending one episode's calls back to back, as a loop with no
sandbox, agent or grading around it would. Busy fraction = time with at least one request in
flight / wall time; the goal is rollout >= 0.95 x direct, measured in the same run. The rollout
runs twice per run: as it does by default (agents hold the slots, ``boot_ahead`` episodes boot and
grade beside them) and with ``boot_ahead=0`` (each episode holds its slot from boot to grade,
the behaviour before), to show what booting ahead buys. Also: the
client process's CPU per turn (everything trio_swe does in this process, sandboxes' own
processes excluded) beside the engine's time per turn. Medians of ``BENCH_ENGINE_RUNS`` (3).

Needs the engine's environment (``bash scripts/engine-env``); ``python -m bench engine``.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

from trio_swe import run_rollouts
from trio_swe.agents import BashAgent
from trio_swe.config import SweConfig, replace_option
from trio_swe.demo import build_demo_set
from trio_swe.grading import get_metadata
from trio_swe.models import ChatModel
from trio_swe.policy import PolicyOutput, VLLMPolicy
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing._engine import build_checkpoint, open_vllm_engine

EPISODES = 32
CONCURRENCY = 8
MAX_TURNS = 4
PARAMS: Mapping[str, Any] = {"max_new_tokens": 32, "temperature": 1.0}


class _Timed:
    """Passes calls to ``inner``; keeps each call and the interval it was in flight."""

    def __init__(self, inner: VLLMPolicy) -> None:
        self.inner = inner
        self.intervals: list[tuple[float, float]] = []
        self.calls: dict[str, list[tuple[list[int], dict[str, Any]]]] = {}

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        start = time.perf_counter()
        out = await self.inner.generate(input_ids, sampling_params, session_id=session_id)
        self.intervals.append((start, time.perf_counter()))
        self.calls.setdefault(session_id or "", []).append((list(input_ids), dict(sampling_params)))
        return out


def steady(intervals: list[tuple[float, float]]) -> float:
    """:func:`busy` from the first request's start to the last one's end: without the first
    boot and the last grading, which a rollout of days spreads over thousands of episodes."""
    return busy(intervals, min(a for a, _ in intervals), max(b for _, b in intervals))


def busy(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """The fraction of [start, end] covered by the union of ``intervals``."""
    covered = 0.0
    reach = start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered / (end - start)


def _config() -> SweConfig:
    config = SweConfig()
    for path, value in (
        ("episode.agent_time_budget_sec", 300.0),
        ("episode.eval_timeout_sec", 60.0),
        ("boot.concurrency", CONCURRENCY),
    ):
        config = replace_option(config, path, value)
    return config


async def _rollout(
    url: str, model: ChatModel, work: Path, boot_ahead: int | None = None
) -> tuple[float, float, float, _Timed, tuple[float, float]]:
    demo = build_demo_set(work / "repos")
    mds = [get_metadata(row, "scaleswe") for row in demo.rows]
    mds = (mds * (EPISODES // len(mds) + 1))[:EPISODES]
    async with VLLMPolicy(url, vocab_size=len(model)) as vllm:
        timed = _Timed(vllm)
        agent = BashAgent(timed, model, max_turns=MAX_TURNS, sampling_params=dict(PARAMS))
        cpu0, t0 = time.process_time(), time.perf_counter()
        async with run_rollouts(
            mds,
            agent,
            backend=LocalBackend(state_dir=work / "state"),
            config=_config(),
            concurrency=CONCURRENCY,
            boot_ahead=boot_ahead,
            network=False,
        ) as stream:
            async for _ in stream:
                pass
        t1, cpu1 = time.perf_counter(), time.process_time()
    # Idle before the first request (the first boot) and after the last (the last grading).
    edges = (
        min(a for a, _ in timed.intervals) - t0,
        t1 - max(b for _, b in timed.intervals),
    )
    return t1 - t0, busy(timed.intervals, t0, t1), cpu1 - cpu0, timed, edges


async def _direct(
    url: str, calls: list[list[tuple[list[int], dict[str, Any]]]]
) -> tuple[float, float]:
    intervals: list[tuple[float, float]] = []
    queue = list(calls)
    async with VLLMPolicy(url) as vllm:

        async def worker() -> None:
            while queue:
                for ids, params in queue.pop():
                    start = time.perf_counter()
                    await vllm.generate(ids, params)
                    intervals.append((start, time.perf_counter()))

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
        t1 = time.perf_counter()
    return t1 - t0, busy(intervals, t0, t1)


async def _main() -> None:
    runs = int(os.environ.get("BENCH_ENGINE_RUNS", "3"))
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        root = Path(tmp)
        running = os.environ.get("TRIO_SWE_ENGINE_URL")  # an engine already serving
        if running:
            checkpoint = Path(os.environ["TRIO_SWE_ENGINE_CHECKPOINT"])
        else:
            checkpoint = build_checkpoint(root / "tiny-qwen3")
        model = ChatModel.from_checkpoint(checkpoint, tools=BashAgent.TOOLS)
        rows: list[tuple[float, ...]] = []
        async with AsyncExitStack() as stack:
            url = (
                running
                or (await stack.enter_async_context(open_vllm_engine(checkpoint, workdir=root))).url
            )
            for i in range(runs):
                _, frac0, _, timed0, _ = await _rollout(
                    url, model, root / f"run{i}-0", boot_ahead=0
                )
                wall, frac, cpu, timed, edges = await _rollout(url, model, root / f"run{i}")
                turns = len(timed.intervals)
                engine_per_turn = sum(b - a for a, b in timed.intervals) / turns
                d_wall, d_frac = await _direct(url, list(timed.calls.values()))
                inner, inner0 = steady(timed.intervals), steady(timed0.intervals)
                rows.append(
                    (frac, d_frac, cpu / turns, engine_per_turn, wall, d_wall, frac0, inner, inner0)
                )
                print(
                    f"run {i}: {turns} turns; busy rollout {frac:.3f} (boot_ahead=0: "
                    f"{frac0:.3f}) direct {d_frac:.3f} (ratio {frac / d_frac:.3f}); client "
                    f"CPU/turn {1000 * cpu / turns:.1f} ms, engine time/turn "
                    f"{1000 * engine_per_turn:.0f} ms; wall {wall:.1f} s vs {d_wall:.1f} s; "
                    f"first to last request: {inner:.3f} (boot_ahead=0: {inner0:.3f}); idle "
                    f"{edges[0]:.2f} s before the first request, {edges[1]:.2f} s after the last",
                    flush=True,
                )
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(
        f"median of {runs}: engine busy fraction {med[0]:.3f} in the rollout vs {med[1]:.3f} in "
        f"a direct loop: ratio {med[0] / med[1]:.3f} (goal >= 0.95; boot_ahead=0: "
        f"{med[6] / med[1]:.3f}); from the first request to the last {med[7]:.3f} "
        f"(boot_ahead=0: {med[8]:.3f}); trio_swe's CPU per turn "
        f"{1000 * med[2]:.1f} ms beside the engine's {1000 * med[3]:.0f} ms per turn "
        f"({med[2] / med[3]:.3f}x)"
    )


def main() -> None:
    trio.run(_main)


if __name__ == "__main__":
    main()
