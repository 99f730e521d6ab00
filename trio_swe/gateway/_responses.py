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

import msgspec

from ._chat import parse_tools
from ._common import (
    REF_PREFIX,
    ApiError,
    Conversation,
    Message,
    ParseMemo,
    Reader,
    Reply,
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
    "parse_request",
    "reply_events",
    "reply_json",
    "stream_error",
]


def context_error_message(prompt_tokens: int, limit: int) -> str:
    """The wording Codex recognises as a context overflow."""
    return (
        f"Your input exceeds the context window of this model: {prompt_tokens} tokens, the "
        f"maximum context length is {limit} tokens."
    )


def parse_request(
    body: bytes | bytearray, memo: ParseMemo | None = None, *, remember: bool = True
) -> Conversation:
    """Parse a Responses request body.

    Args:
        body: the request body.
        memo: the session's parse memo: the leading input items (and instructions, tools)
            resent as they were in its previous request of this kind give its parse again.
        remember: keep this parse in ``memo`` for the next request (False: only read it).

    Raises:
        ApiError: malformed JSON or a field of the wrong type (400).
    """
    return parse_with(_parse, body, "responses", memo, remember)


def _parse(req: Reader) -> Conversation:
    raw_input = req.units("input")
    instructions = req.field("instructions", _instructions)
    if isinstance(raw_input, str):
        raw_input = [{"type": "message", "role": "user", "content": raw_input}]
    if not isinstance(raw_input, list) or not raw_input:
        raise ApiError(400, "invalid_request", "input: a non-empty string or list is required")
    messages = ([instructions] if instructions is not None else []) + _input(req, raw_input)
    tools, dropped = req.field("tools", parse_tools)
    conv = Conversation(
        api="responses",
        model=str(req.get("model", "")),
        messages=messages,
        tools=list(tools),
        stream=req.get("stream") is True,
        max_tokens=positive_int(req.get("max_output_tokens"), "max_output_tokens"),
        dropped_tools=dropped,
    )
    req.done()
    return conv


def _instructions(text: Any) -> Message | None:
    if isinstance(text, str) and text:
        return Message(role="system", content=text)
    return None


class _Turn:
    """An assistant turn being assembled from consecutive items."""

    __slots__ = ("calls", "content", "reasoning", "ref")

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[tuple[str, str, Any]] = []
        self.ref = ""

    def message(self) -> Message:
        return Message(
            role="assistant",
            content="".join(self.content),
            reasoning="".join(self.reasoning) if self.reasoning else None,
            tool_calls=self.calls,
            ref=self.ref,
        )


def _input(req: Reader, items: list[Any]) -> list[Message]:
    """The messages of the input items (consecutive reasoning, assistant message and
    function-call items form one assistant message): the leading items the previous request
    of this kind had give its messages again, up to the last where no assistant turn was
    open; the rest are parsed. The list returned is the memo's: copy it."""
    start = req.prefix(items)
    out = req.new.messages
    turn: _Turn | None = None  # the assistant turn being assembled
    for i in range(start, len(items)):
        item = req.value(items[i])
        if not isinstance(item, dict):
            raise ApiError(400, "invalid_request", f"input.{i}: must be an object")
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "assistant":
            turn = turn or _Turn()
            turn.content.append(text_of(item.get("content")))
            turn.ref = turn.ref or ref_of_id(str(item.get("id", "")))
        elif kind == "reasoning":
            turn = turn or _Turn()
            turn.ref = turn.ref or ref_of_id(str(item.get("encrypted_content") or ""))
            summary = text_of(item.get("summary"))
            content = text_of(item.get("content"))
            text = content or summary
            if text:
                turn.reasoning.append(text)
        elif kind == "function_call":
            turn = turn or _Turn()
            cid = str(item.get("call_id", ""))
            turn.ref = turn.ref or ref_of_id(cid)
            turn.calls.append(
                (cid, str(item.get("name", "")), parse_arguments(item.get("arguments")))
            )
        else:
            if turn is not None:
                out.append(turn.message())
                turn = None
            if kind == "message":
                role = item.get("role")
                text = text_of(item.get("content"))
                if role in ("system", "developer"):
                    out.append(Message(role="system", content=text))
                elif role == "user":
                    out.append(Message(role="user", content=text))
                else:
                    raise ApiError(400, "invalid_request", f"input.{i}.role: unknown role {role!r}")
            elif kind == "function_call_output":
                out.append(
                    Message(
                        role="tool",
                        content=text_of(item.get("output")),
                        tool_call_id=str(item.get("call_id", "")),
                    )
                )
            # custom_tool_call, web_search_call, ...: nothing the template can render as is.
        req.record(items[i], -1 if turn is not None else len(out))
    if turn is not None:
        out.append(turn.message())
    req.parsed += len(items) - start
    return out


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


def stream_error(kind: str, message: str) -> bytes:
    """The ``error`` event that ends a stream which failed after it started."""
    return sse("error", {"type": "error", "code": kind, "message": message, "param": None})


class ReplyStream:
    """The SSE events of one reply, sent as the output is generated: ``response.created``, a
    reasoning item (summary text deltas) and a message item (output text deltas) fed delta by
    delta, then (:meth:`tail`) the function calls and ``response.completed``."""

    def __init__(self, ref: str, model: str, input_tokens: int) -> None:
        self._reply = Reply(ref=ref, model=model, input_tokens=input_tokens)
        self._seq = 0
        self._index = -1
        self._open: str | None = None  # "reasoning" or "message"
        self._reasoning = ""
        self._text = ""

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        out = sse(name, {"type": name, "sequence_number": self._seq, **data})
        self._seq += 1
        return out

    def head(self) -> bytes:
        created = _response(self._reply, "in_progress", [])
        return self._event("response.created", {"response": created}) + self._event(
            "response.in_progress", {"response": created}
        )

    def _reasoning_item(self) -> dict[str, Any]:
        return _items(msgspec.structs.replace(self._reply, reasoning=self._reasoning))[0]

    def _message_item(self) -> dict[str, Any]:
        return next(
            i
            for i in _items(msgspec.structs.replace(self._reply, text=self._text))
            if i["type"] == "message"
        )

    def _where(self, item_id: str, **more: Any) -> dict[str, Any]:
        return {"item_id": item_id, "output_index": self._index, **more}

    def _close(self) -> bytes:
        out = b""
        if self._open == "reasoning":
            item = self._reasoning_item()
            part = {"type": "summary_text", "text": self._reasoning}
            where = self._where(item["id"], summary_index=0)
            out += self._event(
                "response.reasoning_summary_text.done", {**where, "text": self._reasoning}
            )
            out += self._event("response.reasoning_summary_part.done", {**where, "part": part})
            out += self._event(
                "response.output_item.done", {"output_index": self._index, "item": item}
            )
        elif self._open == "message":
            item = self._message_item()
            where = self._where(item["id"], content_index=0)
            out += self._event("response.output_text.done", {**where, "text": self._text})
            part = item["content"][0]
            out += self._event("response.content_part.done", {**where, "part": part})
            out += self._event(
                "response.output_item.done", {"output_index": self._index, "item": item}
            )
        self._open = None
        return out

    def reasoning(self, text: str) -> bytes:
        out = b""
        item_id = f"rs_{self._reply.ref}"
        if self._open != "reasoning":
            self._index += 1
            self._open = "reasoning"
            added = {"type": "reasoning", "id": item_id, "summary": []}
            out += self._event(
                "response.output_item.added", {"output_index": self._index, "item": added}
            )
            part = {"type": "summary_text", "text": ""}
            out += self._event(
                "response.reasoning_summary_part.added",
                {**self._where(item_id, summary_index=0), "part": part},
            )
        self._reasoning += text
        if text:
            out += self._event(
                "response.reasoning_summary_text.delta",
                {**self._where(item_id, summary_index=0), "delta": text},
            )
        return out

    def text(self, text: str) -> bytes:
        out = b""
        item_id = f"msg_{self._reply.ref}"
        if self._open != "message":
            out += self._close()
            self._index += 1
            self._open = "message"
            added = {
                "type": "message",
                "id": item_id,
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            out += self._event(
                "response.output_item.added", {"output_index": self._index, "item": added}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event(
                "response.content_part.added",
                {**self._where(item_id, content_index=0), "part": part},
            )
        self._text += text
        if text:
            out += self._event(
                "response.output_text.delta",
                {**self._where(item_id, content_index=0), "delta": text},
            )
        return out

    def tail(self, reply: Reply) -> bytes:
        """The function calls and the end, for the reply as delivered."""
        out = b""
        if self._open is None and self._index < 0 and not reply.tool_calls:
            out += self.text("")  # a reply has at least one item
        out += self._close()
        items = _items(reply)
        for item in items:
            if item["type"] != "function_call":
                continue
            self._index += 1
            added = {**item, "status": "in_progress", "arguments": ""}
            out += self._event(
                "response.output_item.added", {"output_index": self._index, "item": added}
            )
            where = self._where(item["id"])
            out += self._event(
                "response.function_call_arguments.delta", {**where, "delta": item["arguments"]}
            )
            out += self._event(
                "response.function_call_arguments.done", {**where, "arguments": item["arguments"]}
            )
            out += self._event(
                "response.output_item.done", {"output_index": self._index, "item": item}
            )
        final = _response(reply, "completed", items)
        name = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return out + self._event(name, {"response": final})


def reply_events(reply: Reply) -> Iterator[bytes]:
    """The SSE events of a streamed reply, ``response.created`` to ``response.completed``."""
    return stream_events(ReplyStream(reply.ref, reply.model, reply.input_tokens), reply)
