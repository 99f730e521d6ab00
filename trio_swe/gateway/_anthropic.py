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
    ParseMemo,
    Reader,
    Reply,
    function_tool,
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
    "parse_request",
    "reply_events",
    "reply_json",
    "stream_error",
]

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


#: Claude Code puts this line in a system block of its own, first: an attribution for
#: Anthropic's billing (its version with a fingerprint of the conversation, its entry point).
#: It says nothing to the model, so it is not rendered (nor trained on); the CLI's matching
#: is unaffected (every request drops it alike).
BILLING_HEADER = "x-anthropic-billing-header:"


def _billing_header(block: dict[str, Any]) -> bool:
    text = block.get("text")
    return block.get("type") == "text" and isinstance(text, str) and text.startswith(BILLING_HEADER)


def parse_request(
    body: bytes | bytearray, memo: ParseMemo | None = None, *, remember: bool = True
) -> Conversation:
    """Parse a Messages request body.

    Args:
        body: the request body.
        memo: the session's parse memo: the messages (and system prompt, tools) resent as they
            were in its previous request of this kind give its parse again.
        remember: keep this parse in ``memo`` for the next request (False: only read it).

    Raises:
        ApiError: malformed JSON or a field of the wrong type (400).
    """
    return parse_with(_parse, body, "anthropic", memo, remember)


def _parse(req: Reader) -> Conversation:
    raw_messages = req.units("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise ApiError(400, "invalid_request", "messages: a non-empty list is required")
    system = req.field("system", _system)
    messages = ([system] if system is not None else []) + req.messages(raw_messages, _parse_one)
    tools, dropped = req.field("tools", _tools)
    conv = Conversation(
        api="anthropic",
        model=str(req.get("model", "")),
        messages=messages,
        tools=list(tools),
        stream=req.get("stream") is True,
        max_tokens=positive_int(req.get("max_tokens"), "max_tokens"),
        dropped_tools=dropped,
    )
    req.done()
    return conv


def _system(system: Any) -> Message | None:
    if not system:
        return None
    text = text_of([b for b in _blocks(system) if not _billing_header(b)])
    return Message(role="system", content=text) if text else None


def _parse_one(i: int, raw: Any) -> list[Message]:
    """The chat-template messages of ``messages[i]``: a user message's tool results are tool
    messages of their own, before its text."""
    if not isinstance(raw, dict):
        raise ApiError(400, "invalid_request", f"messages.{i}: must be an object")
    role = raw.get("role")
    blocks = _blocks(raw.get("content"))
    if role == "system":
        return [Message(role="system", content=text_of(blocks))]
    if role == "user":
        out: list[Message] = []
        texts: list[dict[str, Any]] = []
        for block in blocks:
            if block.get("type") == "tool_result":
                result = text_of(_blocks(block.get("content")))
                if block.get("is_error") and not result:
                    result = "Error"
                out.append(
                    Message(
                        role="tool",
                        content=result,
                        tool_call_id=str(block.get("tool_use_id", "")),
                    )
                )
            else:
                texts.append(block)
        if texts:
            out.append(Message(role="user", content=text_of(texts)))
        return out
    if role == "assistant":
        return [_assistant(blocks)]
    raise ApiError(400, "invalid_request", f"messages.{i}.role: unknown role {role!r}")


def _tools(raw: Any) -> tuple[list[dict[str, Any]], int]:
    """Custom tools in OpenAI function form, and how many others were dropped."""
    tools: list[dict[str, Any]] = []
    dropped = 0
    raw_tools = raw or []
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
    return tools, dropped


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


def stream_error(kind: str, message: str) -> bytes:
    """The ``error`` event that ends a stream which failed after it started."""
    return sse("error", error_body(kind, message))


class ReplyStream:
    """The SSE events of one reply, sent as the output is generated: ``message_start``, a
    thinking block and a text block fed delta by delta, then (:meth:`tail`) the tool-use
    blocks, ``message_delta`` and ``message_stop``."""

    def __init__(self, ref: str, model: str, input_tokens: int) -> None:
        self._reply = Reply(ref=ref, model=model, input_tokens=input_tokens)
        self._index = -1
        self._open: str | None = None  # "thinking" or "text": the block being fed

    def head(self) -> bytes:
        message = _message(self._reply, [], None, 0)
        return sse("message_start", {"type": "message_start", "message": message})

    def _start(self, block: dict[str, Any]) -> bytes:
        self._index += 1
        self._open = block["type"]
        return sse(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": delta},
        )

    def _close(self) -> bytes:
        out = b""
        if self._open == "thinking":
            sig = REF_PREFIX + self._reply.ref
            out += self._delta({"type": "signature_delta", "signature": sig})
        if self._open is not None:
            out += sse("content_block_stop", {"type": "content_block_stop", "index": self._index})
        self._open = None
        return out

    def reasoning(self, text: str) -> bytes:
        out = b""
        if self._open != "thinking":
            out += self._start({"type": "thinking", "thinking": "", "signature": ""})
        return out + self._delta({"type": "thinking_delta", "thinking": text})

    def text(self, text: str) -> bytes:
        out = b""
        if self._open != "text":
            out += self._close() + self._start({"type": "text", "text": ""})
        if text:
            out += self._delta({"type": "text_delta", "text": text})
        return out

    def tail(self, reply: Reply) -> bytes:
        """The tool calls and the end, for the reply as delivered."""
        out = b""
        if self._open is None and self._index < 0 and not reply.tool_calls:
            out += self.text("")  # a reply has at least one block
        out += self._close()
        for call in reply.tool_calls:
            out += self._start({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
            out += self._delta(
                {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(call.arguments, ensure_ascii=False),
                }
            )
            out += self._close()
        out += sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _STOP[reply.finish], "stop_sequence": None},
                "usage": {"output_tokens": reply.output_tokens},
            },
        )
        return out + sse("message_stop", {"type": "message_stop"})


def reply_events(reply: Reply) -> Iterator[bytes]:
    """The SSE events of a streamed reply, ``message_start`` to ``message_stop``."""
    return stream_events(ReplyStream(reply.ref, reply.model, reply.input_tokens), reply)


def count_tokens_body(input_tokens: int) -> dict[str, Any]:
    """The ``/v1/messages/count_tokens`` answer."""
    return {"input_tokens": input_tokens}
