"""Anthropic Messages (``POST /v1/messages``): request to :class:`Conversation`, reply to JSON or
SSE events, errors in Anthropic's shape (sans-IO).

Claude Code's quirks handled here: ``system`` as a list of text blocks (``cache_control``
ignored), ``role: "system"`` messages in mid-conversation, ``tool_result`` blocks inside user
messages (content a string or a list of blocks), ``thinking`` blocks replayed with their
signature (which carries our reference), and tool types other than custom tools dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ._common import (
    REF_PREFIX,
    ApiError,
    Conversation,
    Message,
    Reply,
    decode_json_object,
    function_tool,
    positive_int,
    ref_of_id,
    sse,
    text_of,
)

__all__ = ["error_body", "parse_request", "reply_events", "reply_json"]

_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "authentication": "authentication_error",
    "not_found": "not_found_error",
    "too_large": "request_too_large",
    "api_error": "api_error",
    "overloaded": "overloaded_error",
}


def error_body(kind: str, message: str) -> dict[str, Any]:
    """Anthropic's error object."""
    return {
        "type": "error",
        "error": {"type": _ERROR_TYPES.get(kind, "api_error"), "message": message},
    }


def context_error_message(prompt_tokens: int, limit: int) -> str:
    """Anthropic's wording, which Claude Code recognises as a context overflow."""
    return f"prompt is too long: {prompt_tokens} tokens > {limit} maximum"


def _blocks(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b if isinstance(b, dict) else {"type": "text", "text": str(b)} for b in content]
    raise ApiError(400, "invalid_request", "message content must be a string or a list of blocks")


def parse_request(body: bytes) -> Conversation:
    """Parse a Messages request body.

    Raises:
        ApiError: malformed JSON or a field of the wrong type (400).
    """
    data = decode_json_object(body)
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ApiError(400, "invalid_request", "messages: a non-empty list is required")
    messages: list[Message] = []
    system = data.get("system")
    if system:
        text = text_of(_blocks(system))
        if text:
            messages.append(Message(role="system", content=text))
    for i, raw in enumerate(raw_messages):
        if not isinstance(raw, dict):
            raise ApiError(400, "invalid_request", f"messages.{i}: must be an object")
        role = raw.get("role")
        blocks = _blocks(raw.get("content"))
        if role == "system":
            messages.append(Message(role="system", content=text_of(blocks)))
        elif role == "user":
            texts: list[dict[str, Any]] = []
            for block in blocks:
                if block.get("type") == "tool_result":
                    result = text_of(_blocks(block.get("content")))
                    if block.get("is_error") and not result:
                        result = "Error"
                    messages.append(
                        Message(
                            role="tool",
                            content=result,
                            tool_call_id=str(block.get("tool_use_id", "")),
                        )
                    )
                else:
                    texts.append(block)
            if texts:
                messages.append(Message(role="user", content=text_of(texts)))
        elif role == "assistant":
            messages.append(_assistant(blocks))
        else:
            raise ApiError(400, "invalid_request", f"messages.{i}.role: unknown role {role!r}")
    tools: list[dict[str, Any]] = []
    dropped = 0
    raw_tools = data.get("tools") or []
    if not isinstance(raw_tools, list):
        raise ApiError(400, "invalid_request", "tools: must be a list")
    for tool in raw_tools:
        if not isinstance(tool, dict):
            raise ApiError(400, "invalid_request", "tools: every tool must be an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            dropped += 1  # server tools (web search, bash_20250124, ...) are not ours to run
            continue
        tools.append(
            function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"))
        )
    return Conversation(
        api="anthropic",
        model=str(data.get("model", "")),
        messages=messages,
        tools=tools,
        stream=data.get("stream") is True,
        max_tokens=positive_int(data.get("max_tokens"), "max_tokens"),
        dropped_tools=dropped,
    )


def _assistant(blocks: list[dict[str, Any]]) -> Message:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[tuple[str, str, Any]] = []
    ref = ""
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
            sig = str(block.get("signature", ""))
            ref = ref or ref_of_id(sig)
        elif kind == "redacted_thinking":
            ref = ref or ref_of_id(str(block.get("data", "")))
        elif kind == "tool_use":
            cid = str(block.get("id", ""))
            ref = ref or ref_of_id(cid)
            calls.append((cid, str(block.get("name", "")), block.get("input") or {}))
    return Message(
        role="assistant",
        content="".join(texts),
        reasoning="".join(reasoning) if reasoning else None,
        tool_calls=calls,
        ref=ref,
    )


_STOP = {"tool_calls": "tool_use", "stop": "end_turn", "length": "max_tokens"}


def _content(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        blocks.append(
            {"type": "thinking", "thinking": reply.reasoning, "signature": REF_PREFIX + reply.ref}
        )
    if reply.text or not reply.tool_calls:
        blocks.append({"type": "text", "text": reply.text})
    for call in reply.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
        )
    return blocks


def _message(
    reply: Reply, content: list[dict[str, Any]], stop: str | None, out: int
) -> dict[str, Any]:
    return {
        "id": f"msg_{reply.ref}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {
            "input_tokens": reply.input_tokens,
            "output_tokens": out,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def reply_json(reply: Reply) -> dict[str, Any]:
    """The non-streaming response body."""
    return _message(reply, _content(reply), _STOP[reply.finish], reply.output_tokens)


def reply_events(reply: Reply) -> Iterator[bytes]:
    """The SSE events of a streamed reply, ``message_start`` to ``message_stop``."""
    yield sse("message_start", {"type": "message_start", "message": _message(reply, [], None, 0)})
    for index, block in enumerate(_content(reply)):
        kind = block["type"]
        if kind == "thinking":
            start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        elif kind == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(block["input"], ensure_ascii=False),
                }
            ]
        yield sse(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        )
        for delta in deltas:
            yield sse(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            )
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _STOP[reply.finish], "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        },
    )
    yield sse("message_stop", {"type": "message_stop"})


def count_tokens_body(input_tokens: int) -> dict[str, Any]:
    """The ``/v1/messages/count_tokens`` answer."""
    return {"input_tokens": input_tokens}
