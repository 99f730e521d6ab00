"""VLLMPolicy's bad-input paths against engines that misbehave: one down, one answering 5xx, a
malformed body, log-probs that are not log-probs, a stream cut mid-reply. Each is a PolicyError
naming the engine, the route and the request; none becomes an output. The engine here is a raw
HTTP/1.1 server on loopback playing exactly the reply under test (the real engine's happy paths
are the engine suite's, tests/engine)."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio

from trio_swe.policy import PolicyError, VLLMPolicy, open_policy
from trio_swe.policy._vllm import vllm_sampling_params

Reply = Callable[[bytes], bytes]


@asynccontextmanager
async def engine_replying(reply: Reply) -> AsyncIterator[str]:
    """A loopback server that reads one request and writes ``reply(request)`` as is, then
    closes the connection."""

    async def serve(stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            body += await stream.receive_some(65536)
        await stream.send_all(reply(body))
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        yield f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def http(status: int, body: bytes, *, content_type: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


def reply_of(ids: list[int], logprobs: list[float | None], finish: str = "length") -> bytes:
    content = [{"token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs, strict=False)]
    choice = {
        "index": 0,
        "token_ids": ids,
        "logprobs": {"content": content},
        "finish_reason": finish,
    }
    return json.dumps({"request_id": "x", "choices": [choice]}).encode()


NAMED = r"vLLM at http://127\.0\.0\.1:\d+ POST /inference/v1/generate \(request trio-swe-\w+\)"


async def test_a_well_formed_reply_is_the_output() -> None:
    async with (
        engine_replying(lambda _: http(200, reply_of([5, 6], [-0.5, -1.25]))) as url,
        VLLMPolicy(url, vocab_size=10) as policy,
    ):
        out = await policy.generate([1, 2], {"max_new_tokens": 2})
    assert (out.output_ids, out.log_probs, out.finish_reason) == ([5, 6], [-0.5, -1.25], "length")


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (http(503, b'{"error": "overloaded"}'), "answered HTTP 503"),
        (http(200, b"{not json"), "malformed reply"),
        (http(200, b'{"choices": []}'), "malformed reply"),
        (http(200, reply_of([5, 6], [-0.5])), "no token_ids or no log-probs|log-probs' token ids"),
        (http(200, reply_of([5, 6], [-0.5, None])), r"log-prob None of token 1 is not one"),
        (http(200, reply_of([5, 6], [-0.5, 0.7])), r"log-prob 0\.7 of token 1 is not one"),
        (http(200, reply_of([5, 60], [-0.5, -1.0])), r"token id 60 at position 1 is outside"),
        (http(200, reply_of([-1], [-0.5])), r"token id -1 at position 0 is outside"),
        (b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"choi', "failed: RemoteProtocolError"),
    ],
)
async def test_a_bad_reply_is_a_policy_error_naming_engine_and_request(
    body: bytes, why: str
) -> None:
    async with engine_replying(lambda _: body) as url, VLLMPolicy(url, vocab_size=10) as policy:
        with pytest.raises(PolicyError, match=NAMED + ".*(" + why + ")"):
            await policy.generate([1, 2], {"max_new_tokens": 2})
        assert policy.statistics().errors == 1
        assert policy.statistics().output_tokens == 0


async def test_an_engine_that_is_down_is_a_policy_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        async with VLLMPolicy(f"http://127.0.0.1:{port}") as policy:
            with pytest.raises(PolicyError, match=NAMED + " failed: ConnectError"):
                await policy.generate([1], {"max_new_tokens": 2})


def sse(*events: object, done: bool = True) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    if done:
        body += b"data: [DONE]\n\n"
    return http(200, body, content_type="text/event-stream")


def chunk(ids: list[int], logprobs: list[float], finish: str | None = None) -> object:
    content = [{"token_id": t, "logprob": lp} for t, lp in zip(ids, logprobs, strict=True)]
    return {
        "choices": [
            {
                "index": 0,
                "token_ids": ids,
                "logprobs": {"content": content},
                "finish_reason": finish,
            }
        ]
    }


async def test_a_stream_is_handed_over_as_it_comes_and_a_cut_one_is_an_error() -> None:
    whole = sse(chunk([3], [-0.1]), chunk([4, 5], [-0.2, -0.3], "stop"))
    got: list[list[int]] = []

    async def on_tokens(ids: list[int]) -> None:
        got.append(ids)

    async with engine_replying(lambda _: whole) as url, VLLMPolicy(url, vocab_size=10) as policy:
        out = await policy.generate_stream([1], {"max_new_tokens": 3}, on_tokens=on_tokens)
    assert got == [[3], [4, 5]]
    assert (out.output_ids, out.finish_reason) == ([3, 4, 5], "stop")

    cut = sse(chunk([3], [-0.1]), done=False)
    async with engine_replying(lambda _: cut) as url, VLLMPolicy(url, vocab_size=10) as policy:
        with pytest.raises(PolicyError, match=NAMED + ": the stream ended without"):
            await policy.generate_stream([1], {"max_new_tokens": 3}, on_tokens=on_tokens)
        stats = policy.statistics()
        assert (stats.errors, stats.aborts, stats.output_tokens) == (1, 1, 0)


async def test_the_request_carries_the_translated_sampling_parameters() -> None:
    seen: list[dict[str, object]] = []

    def record(body: bytes) -> bytes:
        seen.append(json.loads(body))
        return http(200, reply_of([5], [-0.5]))

    async with (
        engine_replying(record) as url,
        open_policy("vllm", url, defaults={"temperature": 0.7, "seed": 3}) as policy,
    ):
        await policy.generate([1, 2], {"max_new_tokens": 9, "seed": 4, "no_stop_trim": True})
    (body,) = seen
    assert body["token_ids"] == [1, 2]
    assert str(body["request_id"]).startswith("trio-swe-")
    assert body["sampling_params"] == {
        "temperature": 0.7, "seed": 4, "max_tokens": 9, "n": 1, "logprobs": 0,
    }  # fmt: skip


def test_sampling_parameters_ask_for_one_sequence() -> None:
    from trio_swe import InvalidArgumentError

    assert vllm_sampling_params({"n": 1, "min_new_tokens": 2})["min_tokens"] == 2
    with pytest.raises(InvalidArgumentError, match="n=4"):
        vllm_sampling_params({"n": 4})


def test_a_parameter_vllm_does_not_know_is_refused_not_ignored() -> None:
    # vLLM drops unknown sampling fields: a misspelt temperature would sample at T=1.
    from trio_swe import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="'temperatur': not a vLLM sampling parameter"):
        vllm_sampling_params({"temperatur": 0.7})
    with pytest.raises(InvalidArgumentError, match="'json_schema'"):
        vllm_sampling_params({"json_schema": "{}"})  # SGLang's, vLLM spells it otherwise
    # SGLang's names vLLM spells otherwise, and its text-only options, still pass.
    params = {"max_new_tokens": 5, "top_k": 3, "stop_token_ids": [2], "no_stop_trim": True}
    assert vllm_sampling_params(params) == {
        "max_tokens": 5, "top_k": 3, "stop_token_ids": [2], "n": 1, "logprobs": 0,
    }  # fmt: skip
