"""The gateway over real HTTP (httpx on loopback) with the scripted policy on Qwen3's tokenizer:
each API's shapes, history matching, bad input, faults, many sessions."""

from __future__ import annotations

import gc
import json
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from trio_swe import SampleBuilder
from trio_swe.demo import ScriptedCompletion
from trio_swe.demo._cli_scripts import tool_call_text
from trio_swe.gateway import Gateway, open_gateway
from trio_swe.models import ChatModel
from trio_swe.policy import PolicyError, PolicyOutput, SGLangPolicy

from ._support import qwen3_tokenizer, sampled_ids, scripted_policy

READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.\nGive an absolute path.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["path"],
        },
    },
}
CALL = tool_call_text("read_file", {"path": "/testbed/a.py"}, "Look at it first.")
SCRIPT = [CALL, "It is fine."]
SYSTEM = "You are a test agent."
TASK = "Instance: http-1\n\nCheck a.py."


@asynccontextmanager
async def gateway(
    scripts: Mapping[str, Sequence[str | ScriptedCompletion]] | None = None,
    **kwargs: Any,
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, Any]]:
    async with (
        scripted_policy(scripts or {"http-1": SCRIPT}) as (server, policy),
        open_gateway(policy, qwen3_tokenizer(), **kwargs) as gw,
        # A hang guard, not a bound: 100 sessions at once on a loaded 2-core machine took
        # over 30 s (ReadTimeout in a full-suite run).
        httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
    ):
        yield gw, client, server


def chat_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": messages, "tools": [READ], **extra}


async def until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds: every task blocked is not enough, as the gateway
    tokenizes in worker threads, so it is checked again each time things settle."""
    with trio.fail_after(180):
        while not condition():
            await trio.testing.wait_all_tasks_blocked()
            if not condition():
                await trio.sleep(0.002)


def sse_data(text: str) -> list[Any]:
    return [
        json.loads(line[6:])
        for line in text.splitlines()
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def test_chat_completions_two_turns_append_token_exact() -> None:
    async with gateway() as (gw, client, _):
        session = gw.open_session("ep-chat", sampling_params={"max_new_tokens": 256})
        auth = {"authorization": f"Bearer {session.api_key}"}
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        r = await client.post("/v1/chat/completions", json=chat_body(first), headers=auth)
        assert r.status_code == 200, r.text
        body = r.json()
        msg = body["choices"][0]["message"]
        assert body["choices"][0]["finish_reason"] == "tool_calls"
        assert msg["reasoning_content"] == "Look at it first."
        call = msg["tool_calls"][0]
        assert call["function"]["name"] == "read_file"
        assert json.loads(call["function"]["arguments"]) == {"path": "/testbed/a.py"}
        assert body["usage"]["completion_tokens"] == len(sampled_ids(CALL))
        # The client replays the call re-serialised compactly, content "" and a list-of-parts
        # tool result (Qwen Code's habits); the turn still matches ours.
        replay = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path":"/testbed/a.py"}'},
                }
            ],
        }
        result = {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": [{"type": "text", "text": "x = 1\n"}],
        }
        r = await client.post(
            "/v1/chat/completions",
            json=chat_body(
                [*first, replay, result], stream=True, stream_options={"include_usage": True}
            ),
            headers=auth,
        )
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/event-stream")
        chunks = sse_data(r.text)
        assert r.text.rstrip().endswith("data: [DONE]")
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
        assert text == "It is fine."
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == len(sampled_ids("It is fine."))
        stats = session.statistics()
        assert (stats.chains, stats.turns, stats.appended, stats.forks) == (1, 2, 1, 0)
        turns = session.turns()
        assert turns[1].prompt_ids_list()[
            : len(turns[0].prompt_ids) + len(turns[0].output_ids)
        ] == (turns[0].prompt_ids_list() + turns[0].output_ids_list())
        # One recorder per chain: the second turn copied only its delta and its output, and
        # its record shares the first one's history.
        rec = session.session._chains[0].recorder.statistics()
        assert (rec.turns, rec.extended, rec.restarted) == (2, 1, 0)
        assert rec.converted_tokens == len(turns[1].prompt_ids) + len(turns[1].output_ids)
        # The last prompt is the template's own rendering of the conversation as we know it.
        tok = qwen3_tokenizer()
        conversation = session.conversations()[0]
        golden = tok.apply_chat_template(
            conversation[:-1], tools=[READ], tokenize=True, add_generation_prompt=True
        )
        golden = list(golden["input_ids"] if hasattr(golden, "keys") else golden)
        assert turns[1].prompt_ids_list() == golden
        builder = SampleBuilder()
        for t in turns:
            builder.add(t)
        (sample,) = builder.finish(reward=1.0)
        assert sample.metadata["trajectory"]["turn_kinds"] == ["start", "clean"]


async def test_anthropic_stream_and_replay_with_added_default() -> None:
    edit = {
        "name": "Edit",
        "description": "Edit a file",
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"},
            },
            "required": ["file_path", "old_string", "new_string"],
        },
    }
    args = {"file_path": "/t/a.py", "old_string": "1", "new_string": "2"}
    script = [tool_call_text("Edit", args, "Fix it."), "Done."]
    async with gateway({"http-1": script}) as (gw, client, _):
        session = gw.open_session("ep-anthropic")
        head = await client.head("/")
        assert head.status_code == 200
        base = {
            "model": "claude",
            "max_tokens": 32000,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "tools": [edit, {"type": "web_search_20250305", "name": "web_search"}],
            "stream": True,
        }
        user = {"role": "user", "content": [{"type": "text", "text": TASK}]}
        r = await client.post(
            "/v1/messages?beta=true",
            json={**base, "messages": [user]},
            headers={"x-api-key": session.api_key, "anthropic-version": "2023-06-01"},
        )
        assert r.status_code == 200, r.text
        events = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
        assert events[0] == "message_start"
        assert events[-2:] == ["message_delta", "message_stop"]
        data = sse_data(r.text)
        deltas = [d["delta"] for d in data if d["type"] == "content_block_delta"]
        # Streamed from the policy: the thinking comes in pieces as it is generated.
        thinking = [d["thinking"] for d in deltas if d["type"] == "thinking_delta"]
        assert "".join(thinking) == "Fix it."
        (tool_json,) = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
        assert json.loads(tool_json) == args
        starts = [d["content_block"] for d in data if d["type"] == "content_block_start"]
        tool_use = next(b for b in starts if b["type"] == "tool_use")
        signature = next(d["signature"] for d in deltas if d["type"] == "signature_delta")
        stop = next(d for d in data if d["type"] == "message_delta")
        assert stop["delta"]["stop_reason"] == "tool_use"
        # Claude Code's replay: the thinking block with its signature, the input with a
        # default added, cache_control moved onto the newest message.
        replay = {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Fix it.", "signature": signature},
                {
                    "type": "tool_use",
                    "id": tool_use["id"],
                    "name": "Edit",
                    "input": {"replace_all": False, **args},
                },
            ],
        }
        result = {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": tool_use["id"],
                    "content": "ok",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }
        r = await client.post(
            "/v1/messages",
            json={**base, "stream": False, "messages": [user, replay, result]},
            headers={"authorization": f"Bearer {session.api_key}"},
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["stop_reason"] == "end_turn"
        assert body["content"] == [{"type": "text", "text": "Done."}]
        stats = session.statistics()
        assert (stats.chains, stats.turns, stats.appended) == (1, 2, 1)
        count = await client.post(
            "/v1/messages/count_tokens",
            json={**base, "messages": [user]},
            headers={"x-api-key": session.api_key},
        )
        assert count.json()["input_tokens"] == len(session.turns()[0].prompt_ids)


async def test_responses_stream_and_codex_style_replay() -> None:
    exec_tool = {
        "type": "function",
        "name": "exec_command",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    }
    script = [tool_call_text("exec_command", {"cmd": "cat a.py"}, "Read."), "All good."]
    async with gateway({"http-1": script}) as (gw, client, _):
        session = gw.open_session("ep-responses")
        auth = {"authorization": f"Bearer {session.api_key}"}
        head = [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": SYSTEM}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]},
        ]
        tools = [exec_tool, {"type": "web_search"}, {"type": "namespace", "name": "agents"}]
        body = {"model": "m", "input": head, "tools": tools, "stream": True, "store": False}
        r = await client.post("/v1/responses", json=body, headers=auth)
        assert r.status_code == 200, r.text
        data = sse_data(r.text)
        kinds = [d["type"] for d in data]
        assert kinds[0] == "response.created"
        assert kinds[-1] == "response.completed"
        items = data[-1]["response"]["output"]
        reasoning = next(i for i in items if i["type"] == "reasoning")
        call = next(i for i in items if i["type"] == "function_call")
        assert json.loads(call["arguments"]) == {"cmd": "cat a.py"}
        assert data[-1]["response"]["usage"]["output_tokens"] > 0
        # Codex replays reasoning with content null and only encrypted_content.
        replay = [
            {
                "type": "reasoning",
                "summary": [],
                "content": None,
                "encrypted_content": reasoning["encrypted_content"],
            },
            {
                "type": "function_call",
                "call_id": call["call_id"],
                "name": "exec_command",
                "arguments": call["arguments"],
            },
            {"type": "function_call_output", "call_id": call["call_id"], "output": "x = 1"},
        ]
        r = await client.post(
            "/v1/responses", json={**body, "input": [*head, *replay]}, headers=auth
        )
        assert r.status_code == 200, r.text
        final = sse_data(r.text)[-1]["response"]["output"]
        assert final[0]["content"][0]["text"] == "All good."
        stats = session.statistics()
        assert (stats.chains, stats.turns, stats.appended) == (1, 2, 1)


async def test_bad_input_is_an_error_in_each_apis_shape_and_records_nothing() -> None:
    async with gateway(max_body_bytes=64 * 1024) as (gw, client, server):
        bystander = gw.open_session("ep-bystander")
        session = gw.open_session("ep-bad")
        key = {"authorization": f"Bearer {session.api_key}"}
        anthropic_key = {"x-api-key": session.api_key}
        ok = chat_body([{"role": "user", "content": TASK}])

        r = await client.post("/v1/chat/completions", content=b"{not json", headers=key)
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"
        # Nested past the decoder's recursion limit (and under the body cap): a 400 too.
        r = await client.post("/v1/chat/completions", content=b"[" * 60_000, headers=key)
        assert r.status_code == 400
        assert "nested too deeply" in r.json()["error"]["message"]
        r = await client.post("/v1/messages", content=b"[1, 2", headers=anthropic_key)
        assert r.status_code == 400
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
        r = await client.post("/v1/nope", json=ok, headers=key)
        assert r.status_code == 404
        assert "no route" in r.json()["error"]["message"]
        r = await client.post("/v1/messages/batches", json={}, headers=anthropic_key)
        assert r.status_code == 404
        assert r.json()["error"]["type"] == "not_found_error"
        big = chat_body([{"role": "user", "content": "x" * 100_000}])
        r = await client.post("/v1/chat/completions", json=big, headers=key)
        assert r.status_code == 413
        assert "cap" in r.json()["error"]["message"]
        bad_tool = {"type": "function", "function": {"name": "t", "parameters": "a string"}}
        r = await client.post(
            "/v1/chat/completions",
            json={**ok, "tools": [bad_tool]},
            headers=key,
        )
        assert r.status_code == 400
        assert "parameter schema" in r.json()["error"]["message"]
        r = await client.post(
            "/v1/chat/completions", json={**ok, "messages": [{"role": "wizard"}]}, headers=key
        )
        assert r.status_code == 400
        # An assistant turn's tool calls of the wrong shape: 400s naming the field (a function
        # that was not an object, or tool_calls that were not a list, raised out as a 500).
        for calls, field in (
            ([{"id": "c", "type": "function", "function": "read_file"}], "tool_calls.0.function"),
            ([{"id": "c", "function": {"name": {"n": 1}}}], "tool_calls.0.function"),
            (7, "messages.1.tool_calls"),
        ):
            turn = {"role": "assistant", "content": None, "tool_calls": calls}
            messages = [{"role": "user", "content": TASK}, turn]
            r = await client.post("/v1/chat/completions", json=chat_body(messages), headers=key)
            assert r.status_code == 400, r.text
            assert field in r.json()["error"]["message"]
        # Not our session: 401 in each shape.
        r = await client.post(
            "/v1/chat/completions", json=ok, headers={"authorization": "Bearer sk-x"}
        )
        assert r.status_code == 401
        assert r.json()["error"]["code"] == "invalid_api_key"
        r = await client.post(
            "/v1/messages",
            json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
            headers={"x-api-key": "sk-foreign"},
        )
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        r = await client.post("/v1/responses", json={"input": "hi"})
        assert r.status_code == 401
        # A finished session is refused too.
        session.finish()
        r = await client.post("/v1/chat/completions", json=ok, headers=key)
        assert r.status_code == 401
        assert server.statistics().generations == 0
        for s in (session, bystander):
            assert s.statistics().turns == 0
            assert s.turns() == []
        assert bystander.statistics().requests == 0


def assert_error_shape(path: str, r: httpx.Response) -> None:
    """``r`` is an error in the dialect's own shape (Anthropic's, or OpenAI's)."""
    body = r.json()
    assert isinstance(body["error"]["type"], str), r.text
    assert body["error"]["message"], r.text
    if "/messages" in path:
        assert body["type"] == "error", r.text
    else:
        assert set(body["error"]) >= {"message", "type", "param", "code"}, r.text


async def test_a_lone_surrogate_is_a_400_in_each_apis_shape() -> None:
    # JSON may spell "\ud800" alone; the tokenizer raised TypeError on it (an empty 500).
    lone = "see \ud800 here"
    anthropic_tool = {"name": "read_file", "input_schema": READ["function"]["parameters"]}
    bodies: list[tuple[str, dict[str, Any]]] = [
        ("/v1/chat/completions", chat_body([{"role": "user", "content": lone}])),
        (
            "/v1/chat/completions",
            chat_body(
                [{"role": "user", "content": TASK}],
                tools=[{**READ, "function": {**READ["function"], "name": "r\udc00"}}],
            ),
        ),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": lone}]},
        ),
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 9,
                "messages": [{"role": "user", "content": TASK}],
                "tools": [{**anthropic_tool, "name": "\ud800"}],
            },
        ),
        (
            "/v1/messages/count_tokens",
            {"model": "m", "messages": [{"role": "user", "content": lone}]},
        ),
        (
            "/v1/responses",
            {"model": "m", "input": lone, "tools": [{**READ["function"], "type": "function"}]},
        ),
    ]
    async with gateway() as (gw, client, server):
        session = gw.open_session("ep-surrogate")
        headers = {"authorization": f"Bearer {session.api_key}", "x-api-key": session.api_key}
        for path, body in bodies:
            # json.dumps escapes the surrogate as \\ud800, as a client's JSON encoder does.
            r = await client.post(path, content=json.dumps(body).encode(), headers=headers)
            assert r.status_code == 400, (path, r.status_code, r.text)
            assert_error_shape(path, r)
            assert "surrogate" in r.text
        # A valid pair (an emoji, escaped) is text, not an error.
        emoji = chat_body([{"role": "user", "content": TASK + " \ud83d\ude00"}])
        r = await client.post(
            "/v1/chat/completions", content=json.dumps(emoji).encode(), headers=headers
        )
        assert r.status_code == 200, r.text
        assert server.statistics().generations == 1


async def test_claude_codes_billing_header_is_not_rendered() -> None:
    header = "x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=sdk-cli;"
    body = {
        "model": "m",
        "max_tokens": 256,
        "system": [{"type": "text", "text": header}, {"type": "text", "text": SYSTEM}],
        "messages": [{"role": "user", "content": TASK}],
        "tools": [{"name": "read_file", "input_schema": READ["function"]["parameters"]}],
    }
    async with gateway() as (gw, client, _):
        session = gw.open_session("ep-billing")
        r = await client.post("/v1/messages", json=body, headers={"x-api-key": session.api_key})
        assert r.status_code == 200, r.text
        (turn,) = session.turns()
        prompt = qwen3_tokenizer().decode(turn.prompt_ids_list())
        assert "x-anthropic-billing-header" not in prompt
        assert session.conversations()[0][0] == {"role": "system", "content": SYSTEM}


async def test_context_overflow_is_the_apis_error_and_a_truncated_sample() -> None:
    async with gateway() as (gw, client, server):
        session = gw.open_session("ep-overflow", max_context_tokens=400)
        auth = {"authorization": f"Bearer {session.api_key}"}
        first = [{"role": "user", "content": TASK}]
        r = await client.post("/v1/chat/completions", json=chat_body(first), headers=auth)
        assert r.status_code == 200, r.text
        call = r.json()["choices"][0]["message"]["tool_calls"][0]
        replay = {"role": "assistant", "content": None, "tool_calls": [call]}
        huge = {"role": "tool", "tool_call_id": call["id"], "content": "line\n" * 400}
        r = await client.post(
            "/v1/chat/completions", json=chat_body([*first, replay, huge]), headers=auth
        )
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert server.statistics().generations == 1
        assert session.statistics().overflows == 1
        # Anthropic's own wording on the same session (Claude Code stops on it).
        r = await client.post(
            "/v1/messages",
            json={
                "model": "m",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": TASK + " word" * 500}],
                "tools": [{"name": "read_file", "input_schema": READ["function"]["parameters"]}],
            },
            headers={"x-api-key": session.api_key},
        )
        assert r.status_code == 400
        assert r.json()["error"]["message"].startswith("prompt is too long")
        # The first chain: the turn, then the overflow as a turn with no output; its sample is
        # cut to the context and marked truncated, the sampled turn still trained.
        turns = session.turns()
        assert [t.finish_reason for t in turns[:2]] == ["stop", "length"]
        builder = SampleBuilder(max_sample_tokens=400)
        for t in turns[:2]:
            builder.add(t)
        (sample,) = builder.finish(reward=0.0)
        assert sample.status == "truncated"
        assert sum(sample.loss_mask_list()) == len(turns[0].output_ids)


class _FailingOnce:
    """A policy whose first call fails as an unreachable server would, then the real one."""

    def __init__(self, inner: SGLangPolicy) -> None:
        self.inner = inner
        self.calls = 0

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        self.calls += 1
        if self.calls == 1:
            raise PolicyError("policy /generate answered HTTP 500: boom")
        return await self.inner.generate(input_ids, sampling_params, session_id=session_id)


async def test_policy_500_then_retry_records_one_turn() -> None:
    async with scripted_policy({"http-1": SCRIPT}) as (_, policy):
        flaky = _FailingOnce(policy)
        async with (
            open_gateway(flaky, qwen3_tokenizer()) as gw,
            httpx.AsyncClient(base_url=str(gw.url), timeout=300) as client,
        ):
            session = gw.open_session("ep-500")
            body = chat_body([{"role": "user", "content": TASK}])
            auth = {"authorization": f"Bearer {session.api_key}"}
            r = await client.post("/v1/chat/completions", json=body, headers=auth)
            assert r.status_code == 500
            assert r.json()["error"]["type"] == "server_error"
            r = await client.post("/v1/chat/completions", json=body, headers=auth)
            assert r.status_code == 200
            stats = session.statistics()
            assert (stats.turns, stats.failed, stats.chains) == (1, 1, 1)
            assert gw.statistics().policy_errors == 1


async def test_client_disconnect_aborts_the_generation() -> None:
    slow = [ScriptedCompletion(CALL, delay_sec=30.0)]
    async with gateway({"http-1": slow}) as (gw, client, server):
        session = gw.open_session("ep-gone")
        body = chat_body([{"role": "user", "content": TASK}], stream=True)
        with trio.move_on_after(30) as scope:
            async with trio.open_nursery() as nursery:

                async def request() -> None:
                    await client.post(
                        "/v1/chat/completions",
                        json=body,
                        headers={"authorization": f"Bearer {session.api_key}"},
                    )

                nursery.start_soon(request)
                await until(lambda: server.statistics().active == 1)  # generation pending
                nursery.cancel_scope.cancel()  # the client goes away mid-generation
            await until(lambda: server.statistics().aborts == 1)
        assert not scope.cancelled_caught
        assert server.statistics().aborts == 1
        assert session.statistics().turns == 0
        assert session.statistics().failed == 1


async def test_hundred_concurrent_sessions() -> None:
    scripts = {f"c-{i}": [f"Answer {i}."] for i in range(100)}
    async with gateway(scripts) as (gw, client, server):
        sessions = [gw.open_session(f"ep-{i}") for i in range(100)]
        codes: dict[int, int] = {}

        async def one(i: int) -> None:
            r = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": f"Instance: c-{i}"}]},
                headers={"authorization": f"Bearer {sessions[i].api_key}"},
            )
            codes[i] = r.status_code
            assert r.json()["choices"][0]["message"]["content"] == f"Answer {i}."

        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(one, i)
        assert set(codes.values()) == {200}
        for i, s in enumerate(sessions):
            (turn,) = s.session.turns(side=True)  # no tools: a side chain
            assert turn.output_ids_list() == sampled_ids(f"Answer {i}.")
        assert gw.statistics().sessions_open == 100
        assert server.statistics().generations == 100


@pytest.mark.parametrize("api", ["chat", "anthropic"])
async def test_ill_formed_tool_call_returned_as_text_and_marked(api: str) -> None:
    broken = '<tool_call>\n{"name": "read_file", "arguments": {"path": \n</tool_call>'
    async with gateway({"http-1": [broken]}) as (gw, client, _):
        session = gw.open_session("ep-ill")
        if api == "chat":
            r = await client.post(
                "/v1/chat/completions",
                json=chat_body([{"role": "user", "content": TASK}]),
                headers={"authorization": f"Bearer {session.api_key}"},
            )
            message = r.json()["choices"][0]["message"]
            assert "tool_calls" not in message
            text = message["content"]
        else:
            r = await client.post(
                "/v1/messages",
                json={
                    "model": "m",
                    "max_tokens": 100,
                    "messages": [{"role": "user", "content": TASK}],
                    "tools": [
                        {"name": "read_file", "input_schema": READ["function"]["parameters"]}
                    ],
                },
                headers={"x-api-key": session.api_key},
            )
            blocks = r.json()["content"]
            assert [b["type"] for b in blocks] == ["text"]
            text = blocks[0]["text"]
        assert r.status_code == 200
        assert text.startswith("<tool_call>")
        (turn,) = session.turns()
        assert turn.ill_formed
        assert turn.output_ids_list() == sampled_ids(broken)
        builder = SampleBuilder(keep_untrained=True)
        builder.add(turn)
        (sample,) = builder.finish(reward=0.0)
        assert sum(sample.loss_mask_list()) == 0  # masked, in place


async def test_rewritten_history_forks_and_the_builder_says_so() -> None:
    script = [CALL, tool_call_text("read_file", {"path": "/testbed/b.py"}), "Fine."]
    async with gateway({"http-1": script}) as (gw, client, _):
        session = gw.open_session("ep-fork", sampling_params={"max_new_tokens": 256})
        auth = {"authorization": f"Bearer {session.api_key}"}
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]

        async def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
            r = await client.post("/v1/chat/completions", json=chat_body(messages), headers=auth)
            assert r.status_code == 200, r.text
            message: dict[str, Any] = r.json()["choices"][0]["message"]
            return message

        a1 = await ask(first)
        result1 = {"role": "tool", "tool_call_id": a1["tool_calls"][0]["id"], "content": "x = 1"}
        await ask([*first, a1, result1])
        # The client asks the answered request again (it lost the reply): the history matches
        # up to the first reply only, so the session branches there.
        await ask([*first, a1, result1])
        stats = session.statistics()
        assert (stats.chains, stats.forks, stats.turns, stats.appended) == (2, 1, 3, 1)
        # A compaction: the history replaced by a summary matches no reply: a new chain.
        await ask([first[0], {"role": "user", "content": TASK + "\n\nSummary: a.py read."}])
        stats = session.statistics()
        assert (stats.chains, stats.forks, stats.turns) == (3, 2, 4)
        builder = SampleBuilder()
        for t in session.turns():
            builder.add(t)
        samples = builder.finish(reward=1.0)
        kinds = [k for s in samples for k in s.metadata["trajectory"]["turn_kinds"]]
        assert kinds[:2] == ["start", "clean"]
        assert kinds[2] in ("realign", "fork")  # the branch, as the builder places it
        assert "fork" in kinds[2:]  # the compacted chain starts a new sample


async def test_a_dropped_reply_starts_a_chain_counted_as_the_fork_the_builder_sees() -> None:
    # The CLI drops our first reply and asks the same first request again: the history
    # matches no reply, so a new chain starts; the builder makes it a new sample ("fork"),
    # and statistics().forks said 0.
    script = [CALL, tool_call_text("read_file", {"path": "/testbed/b.py"})]
    async with gateway({"http-1": script}) as (gw, client, _):
        session = gw.open_session("ep-drop", sampling_params={"max_new_tokens": 256})
        auth = {"authorization": f"Bearer {session.api_key}"}
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        for _ in range(2):
            r = await client.post("/v1/chat/completions", json=chat_body(first), headers=auth)
            assert r.status_code == 200, r.text
        stats = session.statistics()
        assert (stats.chains, stats.turns, stats.appended) == (2, 2, 0)
        assert stats.forks == 1

        def kinds(builder: SampleBuilder) -> list[str]:
            for t in session.turns():
                builder.add(t)
            samples = builder.finish(reward=1.0)
            return [k for s in samples for k in s.metadata["trajectory"]["turn_kinds"]]

        assert kinds(SampleBuilder(fork_threshold_tokens=0)) == ["start", "fork"]
        # The default builder may instead realign a short output onto the held tokens.
        assert kinds(SampleBuilder())[1] in ("fork", "realign")


class _Bodies:
    """Request bodies near each API's shape, a field in six swapped for junk (seeded)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def junk(self, depth: int = 0) -> Any:
        r = self.rng.random()
        if depth > 3 or r < 0.4:
            return self.rng.choice(
                [None, True, 0, -1, 3.5, "", "x", TASK, "\u0000", 10**20, "a\ud800", "\udfff"]
            )
        if r < 0.7:
            return [self.junk(depth + 1) for _ in range(self.rng.randint(0, 3))]
        keys = ["type", "text", "id", "name", "input", "content", "role", "arguments", "output"]
        return {self.rng.choice(keys): self.junk(depth + 1) for _ in range(self.rng.randint(0, 4))}

    def maybe(self, value: Any) -> Any:
        return self.junk() if self.rng.random() < 0.15 else value

    def anthropic(self) -> dict[str, Any]:
        m = self.maybe
        blocks = [
            {
                "type": m(self.rng.choice(["text", "tool_use", "tool_result", "thinking"])),
                "text": m("hi"),
                "id": m("toolu_1"),
                "name": m("read_file"),
                "input": m({"path": "/a"}),
                "tool_use_id": m("toolu_1"),
                "content": m("ok"),
            }
            for _ in range(self.rng.randint(0, 3))
        ]
        turns = [
            {"role": m("assistant"), "content": m(blocks)} for _ in range(self.rng.randint(0, 3))
        ]
        tool = {"name": m("read_file"), "input_schema": m(READ["function"]["parameters"])}
        return {
            "model": m("m"),
            "max_tokens": m(100),
            "system": m(SYSTEM),
            "messages": m([{"role": "user", "content": TASK}, *turns]),
            "tools": m([tool]),
            "stream": m(self.rng.random() < 0.3),
        }

    def chat(self) -> dict[str, Any]:
        m = self.maybe
        calls = [
            {
                "id": m("call_1"),
                "type": "function",
                "function": m({"name": m("read_file"), "arguments": m('{"path": "/a"}')}),
            }
        ]
        turns = [
            {
                "role": m(self.rng.choice(["assistant", "tool", "user"])),
                "content": m("t"),
                "tool_calls": m(calls),
                "tool_call_id": m("call_1"),
            }
            for _ in range(self.rng.randint(0, 3))
        ]
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASK},
            *turns,
        ]
        return {
            "model": m("m"),
            "messages": m(messages),
            "tools": m([m(READ)]),
            "stream": m(self.rng.random() < 0.3),
        }

    def responses(self) -> dict[str, Any]:
        m = self.maybe
        items = [
            {
                "type": m(
                    self.rng.choice(
                        ["message", "function_call", "function_call_output", "reasoning"]
                    )
                ),
                "role": m("assistant"),
                "content": m([{"type": "output_text", "text": "x"}]),
                "call_id": m("call_1"),
                "name": m("read_file"),
                "arguments": m('{"path": "/a"}'),
                "output": m("ok"),
                "summary": m([]),
            }
            for _ in range(self.rng.randint(0, 3))
        ]
        tool = {
            "type": "function",
            "name": "read_file",
            "parameters": m(READ["function"]["parameters"]),
        }
        return {
            "model": m("m"),
            "instructions": m(SYSTEM),
            "input": m([{"role": "user", "content": TASK}, *items]),
            "tools": m([tool]),
            "stream": m(self.rng.random() < 0.3),
        }


async def test_bodies_near_each_apis_shape_are_never_a_server_error() -> None:
    # What a CLI agent sends is the agent's business: a wrong shape is a 4xx, never a 500
    # (tool calls whose 'function' was not an object were, before this test).
    bodies = _Bodies(seed=7)
    routes = (
        ("/v1/messages", bodies.anthropic),
        ("/v1/messages/count_tokens", bodies.anthropic),
        ("/v1/chat/completions", bodies.chat),
        ("/v1/responses", bodies.responses),
    )
    statuses: dict[int, int] = {}
    async with gateway({"http-1": ["It is fine."] * 200}) as (gw, client, _server):
        for i in range(40):
            for path, make in routes:
                session = gw.open_session(f"fuzz-{i}-{len(path)}")
                headers = {
                    "authorization": f"Bearer {session.api_key}",
                    "x-api-key": session.api_key,
                }
                r = await client.post(path, content=json.dumps(make()).encode(), headers=headers)
                assert r.status_code < 500, (path, r.status_code, r.text)
                if r.status_code >= 400:
                    assert_error_shape(path, r)
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
    # Both paths taken: bodies that reach the policy, and refused ones.
    assert statuses.get(200, 0) > 20, statuses
    assert statuses.get(400, 0) > 20, statuses


async def test_chat_models_cached_are_bounded_by_the_bytes_of_their_tool_lists() -> None:
    # 64 tool lists of any size were kept: 70 distinct 1 MB lists held 176 MB.
    def tools(i: int) -> list[dict[str, Any]]:
        fn = {**READ["function"], "description": f"Tool list {i}. " + "Read a file. " * 16_000}
        return [{"type": "function", "function": fn}]

    bound = 1024 * 1024
    async with gateway(tool_cache_bytes=bound) as (gw, client, _):
        session = gw.open_session("ep-tools")
        headers = {"x-api-key": session.api_key}
        for i in range(12):  # ~210 KB each: ~2.5 MB in all
            t = tools(i)[0]["function"]
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": TASK}],
                "tools": [
                    {
                        "name": t["name"],
                        "description": t["description"],
                        "input_schema": t["parameters"],
                    }
                ],
            }
            r = await client.post("/v1/messages/count_tokens", json=body, headers=headers)
            assert r.status_code == 200, r.text
        stats = gw.statistics()
        assert stats.chat_models == 12
        assert 0 < stats.chat_models_cached_bytes <= bound
        # What is alive, not what the cache says: the chat models still referenced anywhere.
        gc.collect()
        alive = [
            o
            for o in gc.get_objects()
            if isinstance(o, ChatModel)
            and o.tools
            and str(o.tools[0]["function"].get("description", "")).startswith("Tool list")
        ]
        held = sum(len(json.dumps(m.tools)) for m in alive)
        assert 0 < held <= bound, (len(alive), held)
