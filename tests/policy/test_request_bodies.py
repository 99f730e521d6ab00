"""What the policy clients send: the prompt's ids as the engine's JSON, with a content-length,
whatever buffer holds them, and never as a list of the whole prompt (a gateway's 2 MB tool
result is ~400k ids: ~36 bytes each as Python ints)."""

from __future__ import annotations

import json
import re
import tracemalloc
from array import array
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from trio_swe.policy import SGLangPolicy, VLLMPolicy
from trio_swe.policy._http import IdsBody

from .test_vllm_errors import http, reply_of

SGLANG_REPLY = json.dumps(
    {"output_ids": [5], "meta_info": {"output_token_logprobs": [[-0.5, 5, None]]}}
).encode()


@asynccontextmanager
async def engine_reading(
    on_body: Callable[[bytes, AsyncIterator[bytes]], Any],
) -> AsyncIterator[str]:
    """A loopback server handing each request's head and body chunks to ``on_body``, then
    answering with what it returns."""

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, first = data.partition(b"\r\n\r\n")

        async def chunks() -> AsyncIterator[bytes]:
            match = re.search(rb"content-length: (\d+)", head, re.I)
            assert match is not None, head  # no chunked transfer-encoding
            left = int(match.group(1)) - len(first)
            yield first
            while left > 0:
                chunk = await stream.receive_some(min(left, 65536))
                left -= len(chunk)
                yield chunk

        await stream.send_all(await on_body(head, chunks()))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        yield f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        nursery.cancel_scope.cancel()


def client(kind: str, url: str) -> SGLangPolicy | VLLMPolicy:
    if kind == "sglang":
        return SGLangPolicy(url)
    return VLLMPolicy(url, route=kind, model="m")  # type: ignore[arg-type]


REPLIES = {"sglang": SGLANG_REPLY, "generate": reply_of([5], [-0.5])}
REPLIES["completions"] = json.dumps(
    {
        "choices": [
            {"token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}
        ]
    }
).encode()
IDS_KEY = {"sglang": "input_ids", "generate": "token_ids", "completions": "prompt"}


@pytest.mark.parametrize("kind", ["sglang", "generate", "completions"])
@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("holder", [list, tuple, lambda ids: array("i", ids), memoryview])
async def test_the_prompt_arrives_whole_from_any_buffer(
    kind: str, streamed: bool, holder: Callable[[Any], Any]
) -> None:
    ids = [(i * 7919) % 151_000 for i in range(20_001)]  # crosses the encoding's slices
    prompt = holder(array("i", ids)) if holder is memoryview else holder(ids)
    seen: list[dict[str, Any]] = []

    async def record(head: bytes, chunks: AsyncIterator[bytes]) -> bytes:
        seen.append(json.loads(b"".join([c async for c in chunks])))
        reply = REPLIES[kind]
        if streamed and kind != "completions":  # that route's stream is one plain reply
            events = b"data: " + reply + b"\n\ndata: [DONE]\n\n"
            return http(200, events, content_type="text/event-stream")
        return http(200, reply)

    async with engine_reading(record) as url, client(kind, url) as policy:
        params = {"max_new_tokens": 1, "temperature": 1.0}
        if streamed:

            async def on_tokens(new: list[int]) -> None:
                pass

            out = await policy.generate_stream(prompt, params, on_tokens=on_tokens)
        else:
            out = await policy.generate(prompt, params)
    assert list(out.output_ids) == [5]
    (body,) = seen
    assert body[IDS_KEY[kind]] == ids


async def test_a_big_prompt_is_sent_without_a_list_of_its_ids() -> None:
    # 1M ids in an int32 buffer (4 MB). As a list of ints and its JSON, 44 MB more; sent a
    # slice at a time, well under the buffer's own size (Python's allocations, traced:
    # deterministic, unlike the RSS the benchmark reports).
    prompt = array("i", range(100_000, 1_100_000))
    received = 0

    async def count(head: bytes, chunks: AsyncIterator[bytes]) -> bytes:
        nonlocal received
        async for chunk in chunks:
            received += len(chunk)
        return http(200, SGLANG_REPLY)

    async with engine_reading(count) as url, SGLangPolicy(url) as policy:
        tracemalloc.start()
        try:
            await policy.generate(prompt, {"max_new_tokens": 1})
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert received > 7 * len(prompt)
    assert peak < len(prompt) * prompt.itemsize // 2, peak


class _Unkept(IdsBody):
    KEEP_BYTES = 16  # past it at once: the ids are encoded again as they are sent


@given(
    ids=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=40)
    | st.integers(0, 3).map(lambda k: list(range(8192 * k - 1 if k else 0))),
    fields=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
    kind=st.sampled_from([IdsBody, _Unkept]),
)
async def test_the_body_is_the_json_of_fields_and_ids(
    ids: list[int], fields: dict[str, Any], kind: type[IdsBody]
) -> None:
    fields.pop("ids", None)
    body = kind(fields, "ids", ids)
    data = b"".join([piece async for piece in body])
    assert len(data) == len(body) == int(body.headers["content-length"])
    assert json.loads(data) == {**fields, "ids": ids}
    assert b"".join([piece async for piece in body]) == data  # sent again, the same bytes
