"""The gateway's work and memory are bounded by what it serves, not by what a client sends:
caps refuse early in each API's error shape, a continued history renders only its new part,
and one session's big prompts do not keep another's small request from a tokenizing thread."""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from trio_swe.gateway import Gateway, open_gateway
from trio_swe.gateway._server import BIG_RENDER_TOKENS, BIG_REQUEST_BYTES

from ._support import WatchedTokenizer, scripted_policy
from .test_http import READ, SYSTEM, TASK, assert_error_shape, chat_body, until

ANTHROPIC_TOOL = {"name": "read_file", "input_schema": READ["function"]["parameters"]}
RESPONSES_TOOL = {**READ["function"], "type": "function"}


@asynccontextmanager
async def watched_gateway(
    tok: WatchedTokenizer, **kwargs: Any
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    async with (
        scripted_policy({"http-1": ["It is fine."] * 100}) as (_, policy),
        open_gateway(policy, tok, **kwargs) as gw,
        httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
    ):
        yield gw, client


def request(path: str, text: str) -> dict[str, Any]:
    """A first request of each API whose user message is ``text``."""
    if path == "/v1/chat/completions":
        return chat_body([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}])
    if path == "/v1/responses":
        return {"model": "m", "instructions": SYSTEM, "input": text, "tools": [RESPONSES_TOOL]}
    return {
        "model": "m",
        "max_tokens": 64,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": text}],
        "tools": [ANTHROPIC_TOOL],
    }


ROUTES = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens")


def assert_context_error(path: str, r: httpx.Response, limit: int) -> None:
    assert r.status_code == 400, (path, r.text)
    assert_error_shape(path, r)
    error = r.json()["error"]
    if "/messages" in path:
        assert error["message"].startswith("prompt is too long: "), r.text
        assert error["message"].endswith(f" > {limit} maximum"), r.text
    else:
        assert error["code"] == "context_length_exceeded", r.text
        assert str(limit) in error["message"], r.text


async def test_caps_refuse_early_in_each_apis_error_shape() -> None:
    tok = WatchedTokenizer()
    limit = 2048
    async with watched_gateway(tok, max_body_bytes=1024 * 1024) as (gw, client):
        session = gw.open_session("ep-caps", max_context_tokens=limit)
        headers = {"authorization": f"Bearer {session.api_key}", "x-api-key": session.api_key}
        for path in ROUTES:
            # Over the body cap: 413 in the API's shape, the body never parsed.
            big = json.dumps(request(path, TASK + "x" * 1_100_000)).encode()
            # (connection: close: a keep-alive connection whose body was not read is closed)
            r = await client.post(path, content=big, headers={**headers, "connection": "close"})
            assert r.status_code == 413, (path, r.text)
            assert_error_shape(path, r)
            # Longer than the context could hold even at the vocabulary's longest token:
            # refused before anything of it is rendered or tokenized.
            before = tok.encoded_chars
            r = await client.post(path, json=request(path, TASK + "\n" + "word " * 120_000), headers=headers)  # fmt: skip
            assert_context_error(path, r, limit)
            # (A chat model built for the route's tools encodes its few probes: <1 KB.)
            assert tok.encoded_chars - before < 1000, path
            # Within that bound but over the cap (~40k tokens > 2048): refused after the piece
            # of tokenizing that passes the cap, not after the whole 200 KB.
            before = tok.encoded_chars
            text = TASK + "\n" + "word " * 40_000
            r = await client.post(path, json=request(path, text), headers=headers)
            assert_context_error(path, r, limit)
            assert tok.encoded_chars - before < len(text) // 2, path
        stats = session.statistics()
        assert stats.overflows == 6  # count_tokens counts, it records nothing
        assert stats.turns == 0  # a first prompt refused before it was tokenized: no turn


def open_conversation(
    gw: Any, key: str, task: str
) -> tuple[Any, dict[str, str], list[dict[str, Any]]]:
    """A session for a chat conversation: its handle, auth headers, first two messages."""
    session = gw.open_session(key, sampling_params={"max_new_tokens": 64})
    auth = {"authorization": f"Bearer {session.api_key}"}
    return session, auth, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]


async def test_a_continued_history_renders_and_tokenizes_only_its_new_part() -> None:
    tok = WatchedTokenizer()
    async with watched_gateway(tok) as (gw, client):
        session, auth, messages = open_conversation(gw, "ep-long", TASK)
        encoded: list[int] = []
        for turn in range(40):
            before = tok.encoded_chars
            r = await client.post("/v1/chat/completions", json=chat_body(messages), headers=auth)
            assert r.status_code == 200, r.text
            encoded.append(tok.encoded_chars - before)
            reply = r.json()["choices"][0]["message"]
            messages.append({"role": "assistant", "content": reply["content"]})
            messages.append({"role": "user", "content": f"Go on ({turn}): " + "x = 1\n" * 50})
        stats = session.statistics()
        turns = session.turns()
        assert (stats.chains, stats.appended, stats.turns) == (1, 39, 40)
        # Tokens rendered: the first prompt whole, then each request's delta only.
        assert stats.rendered_tokens == len(turns[0].prompt_ids)
        deltas = [
            len(b.prompt_ids) - len(a.prompt_ids) - len(a.output_ids)
            for a, b in itertools.pairwise(turns)
        ]
        assert stats.delta_tokens == sum(deltas)
        # What the tokenizer was given per request does not grow with the history (each
        # delta: one ~330-character message and the template's markers around it).
        assert max(encoded[1:]) < 600, encoded
        assert len(turns[-1].prompt_ids) > 40 * 100
        # Each delta is the template's rendering of the user message after the turn's end,
        # and the sampled turns stay as sampled (the earlier ones are not re-rendered).
        prompt = tok.decode(turns[-1].prompt_ids_list())
        tail = f"<|im_end|>\n<|im_start|>user\n{messages[-3]['content']}<|im_end|>\n<|im_start|>assistant\n"
        assert prompt.endswith(tail)
        for a, b in itertools.pairwise(turns):
            assert b.prompt_ids_list()[: len(a.prompt_ids) + len(a.output_ids)] == (
                a.prompt_ids_list() + a.output_ids_list()
            )


async def test_a_big_history_resent_with_a_small_delta_leaves_the_heap_alone() -> None:
    # The heap is trimmed after a request that rendered a big prompt (its transient memory),
    # not after every big body: a long history resent whole renders only its new part.
    tok = WatchedTokenizer()
    big = TASK + "\n" + "word " * (BIG_RENDER_TOKENS + 1000)
    async with watched_gateway(tok) as (gw, client):
        session, auth, messages = open_conversation(gw, "ep-big", big)
        sizes = []
        for turn in range(2):
            body = json.dumps(chat_body(messages)).encode()
            sizes.append(len(body))
            r = await client.post(
                "/v1/chat/completions",
                content=body,
                headers={**auth, "content-type": "application/json"},
            )
            assert r.status_code == 200, r.text
            reply = r.json()["choices"][0]["message"]
            messages.append({"role": "assistant", "content": reply["content"]})
            messages.append({"role": "user", "content": f"Go on ({turn})."})
        stats = session.statistics()
    assert min(sizes) >= BIG_REQUEST_BYTES
    assert stats.rendered_tokens >= BIG_RENDER_TOKENS  # the first prompt, whole
    assert stats.delta_tokens < 100  # then a small delta
    # Read once the server has ended: every request's handler (and its trims) is done. The
    # first request trims before and after building its prompt; the second, none.
    assert gw.statistics().heap_trims == 2


class _TrimsAtCall:
    """The real policy, noting the gateway's heap trims at each call."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.gateway: Gateway | None = None
        self.trims_at_call: list[int] = []

    async def generate(self, input_ids: Any, sampling_params: Any, **kwargs: Any) -> Any:
        assert self.gateway is not None
        self.trims_at_call.append(self.gateway.statistics().heap_trims)
        return await self.policy.generate(input_ids, sampling_params, **kwargs)


async def test_a_big_prompts_transient_memory_is_given_back_before_the_policy_call() -> None:
    # The policy may take minutes: the body, its decoding, the rendered prompt and the
    # tokenizer's memory are freed by then, and are handed back before the call, not after.
    big = TASK + "\n" + "word " * (BIG_RENDER_TOKENS + 1000)
    async with scripted_policy({"http-1": ["It is fine."] * 10}) as (_, policy):
        spy = _TrimsAtCall(policy)
        async with (
            open_gateway(spy, WatchedTokenizer()) as gw,
            httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
        ):
            spy.gateway = gw
            _, auth, messages = open_conversation(gw, "ep-big", big)
            body = json.dumps(chat_body(messages)).encode()
            assert len(body) >= BIG_REQUEST_BYTES
            r = await client.post(
                "/v1/chat/completions",
                content=body,
                headers={**auth, "content-type": "application/json"},
            )
            assert r.status_code == 200, r.text
            # A small prompt: no trim, before or after.
            small = json.dumps(chat_body([{"role": "user", "content": TASK}])).encode()
            other = gw.open_session("ep-small")
            r = await client.post(
                "/v1/chat/completions",
                content=small,
                headers={
                    "authorization": f"Bearer {other.api_key}",
                    "content-type": "application/json",
                },
            )
            assert r.status_code == 200, r.text
    # Before the build (the body and its decoding) and after it (the rendering), none after.
    assert spy.trims_at_call == [2, 2]
    assert gw.statistics().heap_trims == 2


async def test_a_small_request_is_served_while_big_ones_of_other_sessions_tokenize() -> None:
    # Two big prompts of one session and one of another, each held inside the tokenizer
    # until released; a small request of a fourth session is answered meanwhile. Before, the
    # two threads both tokenized one session's big prompts and everyone else waited.
    tok = WatchedTokenizer(marker="HOLD-ME")
    big = TASK + "\nHOLD-ME\n" + "word " * (BIG_REQUEST_BYTES // 5 + 1000)
    async with watched_gateway(tok, tokenizer_threads=2) as (gw, client):
        a, c, b = (gw.open_session(n) for n in ("ep-a", "ep-c", "ep-b"))
        order: list[str] = []

        async def ask(session: Any, text: str, name: str) -> None:
            auth = {"authorization": f"Bearer {session.api_key}"}
            body = chat_body([{"role": "user", "content": text}])
            r = await client.post("/v1/chat/completions", json=body, headers=auth)
            assert r.status_code == 200, r.text
            order.append(name)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask, a, big, "a1")
                nursery.start_soon(ask, a, big, "a2")
                nursery.start_soon(ask, c, big, "c")
                await until(tok.held.is_set)  # one big prompt is in the tokenizer, held
                with trio.fail_after(120):  # a hang guard: before, it never came back
                    await ask(b, TASK, "b")
                assert order == ["b"]  # served while the big ones wait or tokenize
                tok.release.set()
        finally:
            tok.release.set()
        assert sorted(order) == ["a1", "a2", "b", "c"]
        assert a.statistics().turns == 2
