"""OpenAI Chat Completions (``POST /v1/chat/completions``): request to :class:`Conversation`,
reply to JSON or SSE chunks (with ``stream_options.include_usage``), errors in OpenAI's shape
(sans-IO).

Quirks handled: ``developer`` messages (as system), content as a list of parts (Qwen Code's tool
results), ``content: null`` or ``""`` on assistant messages with tool calls, arguments as JSON
strings re-serialised by the client (compact), ``reasoning_content`` replayed, non-function tools
dropped.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ._common import (
    ApiError,
    Conversation,
    Message,
    ParseMemo,
    Reader,
    Reply,
    function_tool,
    parse_arguments,
    parse_with,
    positive_int,
    ref_of_id,
    sse,
    stream_events,
    text_of,
)

__all__ = [
    "ReplyStream",
    "error_body",
    "models_body",
    "parse_request",
    "reply_chunks",
    "reply_json",
    "stream_error",
]

_ERROR_TYPES = {
    "invalid_request": ("invalid_request_error", None),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "not_found": ("invalid_request_error", "not_found"),
    "too_large": ("invalid_request_error", "request_too_large"),
    "api_error": ("server_error", None),
    "overloaded": ("server_error", "overloaded"),
}


def error_body(kind: str, message: str) -> dict[str, Any]:
    """OpenAI's error object (Chat Completions and Responses share it)."""
    etype, code = _ERROR_TYPES.get(kind, ("server_error", None))
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


def context_error_message(prompt_tokens: int, limit: int) -> str:
    """OpenAI's wording for a context overflow."""
    return (
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
    )


def parse_message(raw: Any, where: str) -> Message:
    """One chat message.

    Raises:
        ApiError: it is not an object or its role is unknown.
    """
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid_request", f"{where}: must be an object")
    role = raw.get("role")
    if role == "developer":
        role = "system"
    if role in ("system", "user"):
        return Message(role=role, content=text_of(raw.get("content")))
    if role == "tool":
        return Message(
            role="tool",
            content=text_of(raw.get("content")),
            tool_call_id=str(raw.get("tool_call_id", "")),
        )
    if role == "assistant":
        calls: list[tuple[str, str, Any]] = []
        ref = ""
        tool_calls = raw.get("tool_calls") or []
        if not isinstance(tool_calls, list):
            raise ApiError(400, "invalid_request", f"{where}.tool_calls: must be an array")
        for j, call in enumerate(tool_calls):
            if not isinstance(call, dict):
                raise ApiError(400, "invalid_request", f"{where}.tool_calls.{j}: must be an object")
            fn = call.get("function") or {}
            name = fn.get("name", "") if isinstance(fn, dict) else None
            if not isinstance(name, str):
                raise ApiError(
                    400,
                    "invalid_request",
                    f"{where}.tool_calls.{j}.function: must be an object with a string 'name'",
                )
            cid = str(call.get("id", ""))
            ref = ref or ref_of_id(cid)
            calls.append((cid, name, parse_arguments(fn.get("arguments"))))
        reasoning = raw.get("reasoning_content")
        return Message(
            role="assistant",
            content=text_of(raw.get("content")),
            reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
            tool_calls=calls,
            ref=ref,
        )
    raise ApiError(400, "invalid_request", f"{where}.role: unknown role {role!r}")


def parse_request(
    body: bytes | bytearray, memo: ParseMemo | None = None, *, remember: bool = True
) -> Conversation:
    """Parse a Chat Completions request body.

    Args:
        body: the request body.
        memo: the session's parse memo: the messages (and tools) resent as they were in its
            previous request of this kind give its parse again.
        remember: keep this parse in ``memo`` for the next request (False: only read it).

    Raises:
        ApiError: malformed JSON or a field of the wrong type (400).
    """
    return parse_with(_parse, body, "chat", memo, remember)


def _parse(req: Reader) -> Conversation:
    raw_messages = req.units("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ApiError(400, "invalid_request", "messages: a non-empty list is required")
    messages = list(req.messages(raw_messages, _parse_one))
    tools, dropped = req.field("tools", parse_tools)
    options = req.get("stream_options") or {}
    cap = positive_int(req.get("max_completion_tokens"), "max_completion_tokens")
    if cap is None:
        cap = positive_int(req.get("max_tokens"), "max_tokens")
    conv = Conversation(
        api="chat",
        model=str(req.get("model", "")),
        messages=messages,
        tools=list(tools),
        stream=req.get("stream") is True,
        max_tokens=cap,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        dropped_tools=dropped,
    )
    req.done()
    return conv


def _parse_one(i: int, raw: Any) -> tuple[Message]:
    return (parse_message(raw, f"messages.{i}"),)


def parse_tools(raw: Any) -> tuple[list[dict[str, Any]], int]:
    """Function tools in either the nested (chat) or flat (Responses) form; others dropped."""
    if raw is None:
        return [], 0
    if not isinstance(raw, list):
        raise ApiError(400, "invalid_request", "tools: must be a list")
    tools: list[dict[str, Any]] = []
    dropped = 0
    for tool in raw:
        if not isinstance(tool, dict):
            raise ApiError(400, "invalid_request", "tools: every tool must be an object")
        if tool.get("type", "function") != "function":
            dropped += 1  # namespace, web_search, ...: nothing a chat template renders
            continue
        nested = tool.get("function")
        fn: dict[str, Any] = nested if isinstance(nested, dict) else tool
        checked = function_tool(fn.get("name"), fn.get("description"), fn.get("parameters"))
        if isinstance(nested, dict):
            # As the client declared it (key order and extra keys such as "strict"): what an
            # OpenAI-compatible server hands the template.
            checked = {"type": "function", "function": dict(nested)}
        tools.append(checked)
    return tools, dropped


_FINISH = {"tool_calls": "tool_calls", "stop": "stop", "length": "length"}


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.input_tokens,
        "completion_tokens": reply.output_tokens,
        "total_tokens": reply.input_tokens + reply.output_tokens,
    }


def _calls(reply: Reply, *, indexed: bool) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(reply.tool_calls):
        item: dict[str, Any] = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments_json},
        }
        if indexed:
            item["index"] = i
        out.append(item)
    return out


def reply_json(reply: Reply) -> dict[str, Any]:
    """The non-streaming response body."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text if (reply.text or not reply.tool_calls) else None,
    }
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
    if reply.tool_calls:
        message["tool_calls"] = _calls(reply, indexed=False)
    return {
        "id": f"chatcmpl-{reply.ref}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _FINISH[reply.finish]}],
        "usage": _usage(reply),
    }


def stream_error(kind: str, message: str) -> bytes:
    """The chunk that ends a stream which failed after it started (OpenAI's error object)."""
    return sse(None, error_body(kind, message))


class ReplyStream:
    """The SSE chunks of one reply, sent as the output is generated: the role, reasoning and
    content deltas, then (:meth:`tail`) the tool calls, the finish reason, the usage when
    asked for and ``data: [DONE]``."""

    def __init__(self, ref: str, model: str, input_tokens: int, *, include_usage: bool) -> None:
        self._include_usage = include_usage
        self._base = {
            "id": f"chatcmpl-{ref}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse(None, {**self._base, "choices": [choice]})

    def head(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def reasoning(self, text: str) -> bytes:
        return self._chunk({"reasoning_content": text}) if text else b""

    def text(self, text: str) -> bytes:
        return self._chunk({"content": text}) if text else b""

    def tail(self, reply: Reply) -> bytes:
        """The tool calls and the end, for the reply as delivered."""
        out = b""
        if reply.tool_calls:
            out += self._chunk({"tool_calls": _calls(reply, indexed=True)})
        out += self._chunk({}, _FINISH[reply.finish])
        if self._include_usage:
            out += sse(None, {**self._base, "choices": [], "usage": _usage(reply)})
        return out + b"data: [DONE]\n\n"


def reply_chunks(reply: Reply, *, include_usage: bool) -> Iterator[bytes]:
    """The SSE chunks of a streamed reply, ending with ``data: [DONE]``."""
    stream = ReplyStream(reply.ref, reply.model, reply.input_tokens, include_usage=include_usage)
    # Empty reasoning or text gives no chunk (b""), so the stream is as OpenAI's.
    return stream_events(stream, reply)


def models_body(names: list[str]) -> dict[str, Any]:
    """``GET /v1/models``."""
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": 0, "owned_by": "trio-swe"} for n in names],
    }
