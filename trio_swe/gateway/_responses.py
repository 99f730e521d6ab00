"""OpenAI Responses (``POST /v1/responses``): request to :class:`Conversation`, reply to JSON or
SSE events, errors in OpenAI's shape (sans-IO).

Codex sends its system prompt as ``developer`` messages in ``input`` (no ``instructions``),
``store: false`` (so the whole input again every turn), reasoning items replayed with
``content: null`` and only ``encrypted_content`` (which carries our reference), tool results
as ``function_call_output`` items, and tools of type ``namespace``/``web_search`` (dropped).
Consecutive reasoning, message and function-call items of the assistant form one assistant
message, as the chat template renders one turn.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ._chat import parse_tools
from ._common import (
    REF_PREFIX,
    ApiError,
    Conversation,
    Message,
    Reply,
    decode_json_object,
    parse_arguments,
    positive_int,
    ref_of_id,
    sse,
    text_of,
)

__all__ = ["parse_request", "reply_events", "reply_json"]


def context_error_message(prompt_tokens: int, limit: int) -> str:
    """The wording Codex recognises as a context overflow."""
    return (
        f"Your input exceeds the context window of this model: {prompt_tokens} tokens, the "
        f"maximum context length is {limit} tokens."
    )


def parse_request(body: bytes) -> Conversation:
    """Parse a Responses request body.

    Raises:
        ApiError: malformed JSON or a field of the wrong type (400).
    """
    data = decode_json_object(body)
    raw_input = data.get("input")
    messages: list[Message] = []
    instructions = data.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append(Message(role="system", content=instructions))
    if isinstance(raw_input, str):
        raw_input = [{"type": "message", "role": "user", "content": raw_input}]
    if not isinstance(raw_input, list) or not raw_input:
        raise ApiError(400, "invalid_request", "input: a non-empty string or list is required")
    current: Message | None = None  # the assistant turn being assembled

    def assistant() -> Message:
        nonlocal current
        if current is None:
            current = Message(role="assistant")
            messages.append(current)
        return current

    for i, item in enumerate(raw_input):
        if not isinstance(item, dict):
            raise ApiError(400, "invalid_request", f"input.{i}: must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            text = text_of(item.get("content"))
            if role == "assistant":
                msg = assistant()
                msg.content += text
                msg.ref = msg.ref or ref_of_id(str(item.get("id", "")))
                continue
            current = None
            if role in ("system", "developer"):
                messages.append(Message(role="system", content=text))
            elif role == "user":
                messages.append(Message(role="user", content=text))
            else:
                raise ApiError(400, "invalid_request", f"input.{i}.role: unknown role {role!r}")
        elif kind == "reasoning":
            msg = assistant()
            msg.ref = msg.ref or ref_of_id(str(item.get("encrypted_content") or ""))
            summary = text_of(item.get("summary"))
            content = text_of(item.get("content"))
            text = content or summary
            if text:
                msg.reasoning = (msg.reasoning or "") + text
        elif kind == "function_call":
            msg = assistant()
            cid = str(item.get("call_id", ""))
            msg.ref = msg.ref or ref_of_id(cid)
            msg.tool_calls.append(
                (cid, str(item.get("name", "")), parse_arguments(item.get("arguments")))
            )
        elif kind == "function_call_output":
            current = None
            messages.append(
                Message(
                    role="tool",
                    content=text_of(item.get("output")),
                    tool_call_id=str(item.get("call_id", "")),
                )
            )
        else:
            # custom_tool_call, web_search_call, ...: nothing the template can render as is.
            current = None
    tools, dropped = parse_tools(data.get("tools"))
    return Conversation(
        api="responses",
        model=str(data.get("model", "")),
        messages=messages,
        tools=tools,
        stream=data.get("stream") is True,
        max_tokens=positive_int(data.get("max_output_tokens"), "max_output_tokens"),
        dropped_tools=dropped,
    )


def _items(reply: Reply) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{reply.ref}",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
                "encrypted_content": REF_PREFIX + reply.ref,
            }
        )
    if reply.text or not reply.tool_calls:
        items.append(
            {
                "type": "message",
                "id": f"msg_{reply.ref}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    for call in reply.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call.id[len('call_') :]}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments_json,
                "status": "completed",
            }
        )
    return items


def _response(reply: Reply, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": f"resp_{reply.ref}",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": reply.model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
    }
    if status == "completed":
        body["usage"] = {
            "input_tokens": reply.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.input_tokens + reply.output_tokens,
        }
        if reply.finish == "length":
            body["status"] = "incomplete"
            body["incomplete_details"] = {"reason": "max_output_tokens"}
    return body


def reply_json(reply: Reply) -> dict[str, Any]:
    """The non-streaming response body."""
    return _response(reply, "completed", _items(reply))


def reply_events(reply: Reply) -> Iterator[bytes]:
    """The SSE events of a streamed reply, ``response.created`` to ``response.completed``."""
    seq = 0

    def event(name: str, data: dict[str, Any]) -> bytes:
        nonlocal seq
        out = sse(name, {"type": name, "sequence_number": seq, **data})
        seq += 1
        return out

    yield event("response.created", {"response": _response(reply, "in_progress", [])})
    yield event("response.in_progress", {"response": _response(reply, "in_progress", [])})
    items = _items(reply)
    for index, item in enumerate(items):
        if item["type"] == "message":
            added = {**item, "status": "in_progress", "content": []}
            yield event("response.output_item.added", {"output_index": index, "item": added})
            part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.content_part.added", {**where, "part": part})
            text = item["content"][0]["text"]
            if text:
                yield event("response.output_text.delta", {**where, "delta": text})
            yield event("response.output_text.done", {**where, "text": text})
            yield event("response.content_part.done", {**where, "part": item["content"][0]})
        elif item["type"] == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
            yield event("response.output_item.added", {"output_index": index, "item": added})
            where = {"item_id": item["id"], "output_index": index}
            yield event(
                "response.function_call_arguments.delta", {**where, "delta": item["arguments"]}
            )
            yield event(
                "response.function_call_arguments.done", {**where, "arguments": item["arguments"]}
            )
        else:
            yield event("response.output_item.added", {"output_index": index, "item": item})
        yield event("response.output_item.done", {"output_index": index, "item": item})
    final = _response(reply, "completed", items)
    name = "response.completed" if final["status"] == "completed" else "response.incomplete"
    yield event(name, {"response": final})
