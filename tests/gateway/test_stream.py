"""The gateway streams the policy's output: the sans-IO splitter on Qwen3's tokenizer (what may
be sent before the output ends), and over HTTP (deltas reach the client while the policy is
still generating; a client gone mid-stream aborts it; a failure mid-stream ends the stream
with the API's error event; token-exact with SGLang's cumulative and incremental chunks)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from trio_swe.demo import ScriptedCompletion, scripted_logprob
from trio_swe.demo._cli_scripts import tool_call_text
from trio_swe.gateway import open_gateway
from trio_swe.gateway._common import Reply, ReplyToolCall
from trio_swe.gateway._stream import OutputStream
from trio_swe.models import ChatModel
from trio_swe.policy import PolicyError, PolicyOutput

from ._support import END, qwen3_tokenizer, sampled_ids, scripted_policy
from .test_http import CALL, READ, TASK, chat_body, sse_data, until

CASES = [
    tool_call_text("read_file", {"path": "/t/a.py"}, "Look at it first."),
    "<think>\nThink, then answer.\n</think>\n\nThe answer: 42 ✓ — 日本語 😀.",
    "Plain text, no reasoning.\n\nTwo paragraphs.",
    'Text first. <tool_call>\n{"name": "read_file", "arguments": {"path": "/x"}}\n</tool_call>',
    "<think>\nStill thinking when the output was cut",
    '<think>\nA broken call.\n</think>\n\nLet me. <tool_call>\n{"name": "read_file", "argu',
    "<think>\n\n</think>\n\n",
]


def _model() -> ChatModel:
    return ChatModel(qwen3_tokenizer(), tools=[READ])


def _reply(model: ChatModel, ids: list[int]) -> Reply:
    """What the session answers for ``ids`` (as :meth:`Session.draft` builds it)."""
    parsed = model.parse(ids)
    if parsed.ill_formed and not parsed.error.startswith("no tool call"):
        return Reply(ref="r", text=parsed.text)
    calls = tuple(
        ReplyToolCall(f"c{i}", c.name, dict(c.arguments)) for i, c in enumerate(parsed.tool_calls)
    )
    return Reply(ref="r", text=parsed.content, reasoning=parsed.reasoning, tool_calls=calls)


@pytest.mark.parametrize("text", CASES)
@pytest.mark.parametrize("step", [1, 3])
def test_streamed_pieces_add_up_to_the_delivered_reply(text: str, step: int) -> None:
    model = _model()
    ids = sampled_ids(text) if not text.endswith("argu") and "cut" not in text else (
        list(qwen3_tokenizer().encode(text, add_special_tokens=False))
    )  # fmt: skip
    stream = OutputStream(model)
    sent: dict[str, str] = {"reasoning": "", "text": ""}
    order: list[str] = []
    for i in range(0, len(ids), step):
        for d in stream.feed(ids[i : i + step]):
            sent[d.channel] += d.text
            order.append(d.channel)
            for marker in ("<tool_call>", "</think>", END):
                assert marker not in d.text
    reply = _reply(model, ids)
    rest, delivered = stream.finish(reply)
    for d in rest:
        sent[d.channel] += d.text
        order.append(d.channel)
    # Reasoning comes before text, never after it.
    assert order == sorted(order, key=lambda c: c != "reasoning")
    assert sent["text"] == delivered.text
    assert sent["reasoning"] == (delivered.reasoning or "")
    assert delivered.tool_calls == reply.tool_calls
    well_formed = not model.parse(ids).ill_formed or "no tool call" in model.parse(ids).error
    if well_formed and "cut" not in text:
        # A well-formed output streams exactly what its parse says.
        assert (delivered.text, delivered.reasoning) == (reply.text, reply.reasoning)


def test_text_is_streamed_before_the_output_ends() -> None:
    model = _model()
    ids = sampled_ids("<think>\nHmm.\n</think>\n\nFirst sentence. Second sentence is longer.")
    stream = OutputStream(model)
    deltas = [d for t in ids[:-5] for d in stream.feed([t])]
    assert "".join(d.text for d in deltas if d.channel == "reasoning") == "Hmm."
    assert "".join(d.text for d in deltas if d.channel == "text").startswith("First sentence.")


async def test_deltas_reach_the_client_while_the_policy_generates_and_a_hang_up_aborts() -> None:
    long = "<think>\nA long thought.\n</think>\n\n" + "word " * 200
    scripts = {"http-1": [ScriptedCompletion(long, delay_sec=120.0)]}
    async with (
        scripted_policy(scripts) as (server, policy),
        open_gateway(policy, qwen3_tokenizer()) as gw,
        httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
    ):
        session = gw.open_session("ep-stream")
        body = chat_body([{"role": "user", "content": TASK}], stream=True)
        with trio.fail_after(240):  # a hang guard
            async with client.stream(
                "POST",
                "/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {session.api_key}"},
            ) as r:
                assert r.status_code == 200
                got = ""
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        got += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    if "word" in got:
                        break
                # The first words arrived; the policy is still generating the rest.
                assert server.statistics().active == 1
            # The client hung up mid-generation: the gateway aborted the policy's request.
            await until(lambda: server.statistics().aborts == 1)
            await until(lambda: session.statistics().failed == 1)
        assert session.statistics().turns == 0
        assert gw.statistics().disconnects == 1


class _FailsMidStream:
    """The policy streaming a first piece, then failing (a dropped SGLang connection)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def generate(self, ids: Any, params: Any, *, session_id: str | None = None) -> Any:
        return await self.inner.generate(ids, params, session_id=session_id)

    async def generate_stream(
        self, ids: Any, params: Any, *, on_tokens: Any, session_id: str | None = None
    ) -> PolicyOutput:
        pieces = 0

        async def relay(new: list[int]) -> None:
            nonlocal pieces
            pieces += 1
            if pieces > 3:
                raise PolicyError("policy /generate failed: RemoteProtocolError: injected")
            await on_tokens(new)

        out: PolicyOutput = await self.inner.generate_stream(
            ids, params, on_tokens=relay, session_id=session_id
        )
        return out


@pytest.mark.parametrize("api", ["anthropic", "responses", "chat"])
async def test_a_failure_mid_stream_ends_it_with_the_apis_error_event(api: str) -> None:
    text = "<think>\nThinking for a while before it breaks.\n</think>\n\nSome text " * 3
    async with (
        scripted_policy({"http-1": [text]}) as (server, policy),
        open_gateway(_FailsMidStream(policy), qwen3_tokenizer()) as gw,
        httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
    ):
        session = gw.open_session("ep-fail")
        auth = {"authorization": f"Bearer {session.api_key}", "x-api-key": session.api_key}
        user = {"role": "user", "content": TASK}
        path, body = {
            "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 100, "messages": [user]}),
            "responses": ("/v1/responses", {"model": "m", "input": [user], "tools": []}),
            "chat": ("/v1/chat/completions", chat_body([user])),
        }[api]
        r = await client.post(path, json={**body, "stream": True}, headers=auth)
        assert r.status_code == 200  # the stream had started
        last = sse_data(r.text)[-1]
        if api == "chat":
            assert last["error"]["type"] == "server_error"
        elif api == "anthropic":
            assert last == {
                "type": "error",
                "error": {"type": "api_error", "message": last["error"]["message"]},
            }
        else:
            assert last["type"] == "error"
        assert "injected" in r.text
        assert "data: [DONE]" not in r.text
        stats = session.statistics()
        assert (stats.turns + stats.side_turns, stats.failed) == (0, 1)
        assert server.statistics().aborts == 1  # the failed stream was aborted on the server


@pytest.mark.parametrize("incremental", [False, True])
async def test_streamed_turns_are_recorded_token_exact(incremental: bool) -> None:
    async with (
        scripted_policy({"http-1": [CALL]}, incremental_streaming=incremental) as (_, policy),
        open_gateway(policy, qwen3_tokenizer()) as gw,
        httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
    ):
        session = gw.open_session("ep-exact")
        r = await client.post(
            "/v1/chat/completions",
            json=chat_body([{"role": "user", "content": TASK}], stream=True),
            headers={"authorization": f"Bearer {session.api_key}"},
        )
        assert r.status_code == 200
        chunks = sse_data(r.text)
        calls = [c["choices"][0]["delta"]["tool_calls"] for c in chunks if c["choices"] and "tool_calls" in c["choices"][0]["delta"]]  # fmt: skip
        assert len(calls) == 1  # the call was sent once, whole, after it parsed
        assert json.loads(calls[0][0]["function"]["arguments"]) == {"path": "/testbed/a.py"}
        reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"])  # fmt: skip
        assert reasoning == "Look at it first."
        (turn,) = session.turns()
        # The policy's own ids and log-probs, not a re-tokenization of the text.
        ids = turn.output_ids_list()
        assert ids == sampled_ids(CALL)
        lps = list(turn.output_log_probs)
        assert lps == pytest.approx([scripted_logprob(t, i) for i, t in enumerate(ids)])
