"""What the three wire APIs have in common once parsed (sans-IO).

A request becomes a :class:`Conversation`: chat-template messages (OpenAI chat shape: ``role``,
``content`` as a string, ``reasoning_content``, ``tool_calls`` with dict arguments,
``tool_call_id``) and tools in OpenAI function form, whatever API it came in. A message that
echoes one of our own replies carries the reply's reference (``ref``) when the client kept one
of the ids we handed out (tool-call ids, thinking signatures, reasoning ``encrypted_content``),
so the session can recognise it without comparing text.

A reply is a :class:`Reply`: the parsed output with the ids we give its parts, which each API's
module turns into its own JSON or SSE events.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from typing import Any, Literal, Protocol

import msgspec

from .._json import loads

__all__ = [
    "ApiError",
    "Conversation",
    "Message",
    "Reply",
    "ReplyToolCall",
    "new_ref",
    "ref_of_id",
]

Api = Literal["anthropic", "responses", "chat"]

#: Prefix of the references we embed in signatures and ``encrypted_content``.
REF_PREFIX = "trio-swe:"


class ApiError(Exception):
    """A request the gateway answers with an HTTP error in the API's own error shape.

    Attributes:
        status: the HTTP status.
        kind: a generic kind, mapped to each API's error type: ``invalid_request``,
            ``authentication``, ``not_found``, ``too_large``, ``context_length``, ``api_error``,
            ``overloaded``.
        message: the human-readable message.
    """

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


class Message(msgspec.Struct, kw_only=True):
    """One chat-template message, plus what identifies it as ours.

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: its text.
        reasoning: an assistant's reasoning (``reasoning_content``), if the client sent it.
        tool_calls: an assistant's calls: ``(id, name, arguments)``; arguments a dict, or the
            raw string when it is not a JSON object.
        tool_call_id: a tool result's call id.
        ref: the reference of our reply this assistant message echoes, when known.
    """

    role: str
    content: str = ""
    reasoning: str | None = None
    tool_calls: list[tuple[str, str, Any]] = msgspec.field(default_factory=list)
    tool_call_id: str = ""
    ref: str = ""

    def template_dict(self) -> dict[str, Any]:
        """The message as a chat template takes it."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning is not None and self.role == "assistant":
            out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
                for cid, name, args in self.tool_calls
            ]
        if self.role == "tool" and self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class Conversation(msgspec.Struct, kw_only=True):
    """A parsed request.

    Attributes:
        api: which API it came in.
        model: the model name the client asked for (echoed back, otherwise unused).
        messages: the history, system prompt first when there is one.
        tools: function tools in OpenAI form (``{"type": "function", "function": {...}}``);
            tools of other types (web search, namespaces) are dropped.
        stream: whether the client wants SSE.
        max_tokens: the client's output cap, if any (it may only lower the trainer's).
        include_usage: Chat Completions' ``stream_options.include_usage``.
        dropped_tools: how many non-function tools were dropped.
    """

    api: Api
    model: str = ""
    messages: list[Message] = msgspec.field(default_factory=list)
    tools: list[dict[str, Any]] = msgspec.field(default_factory=list)
    stream: bool = False
    max_tokens: int | None = None
    include_usage: bool = False
    dropped_tools: int = 0


class ReplyToolCall(msgspec.Struct, frozen=True):
    """A tool call of a reply: our id for it, the tool's name, the arguments."""

    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """What the gateway answers one request with.

    Attributes:
        ref: this reply's reference (embedded in its ids).
        text: the visible text.
        reasoning: the reasoning text, if any.
        tool_calls: the calls, in order.
        finish: ``tool_calls``, ``stop`` or ``length``.
        input_tokens: prompt tokens.
        output_tokens: sampled tokens.
        model: the model name to report.
    """

    ref: str
    text: str = ""
    reasoning: str | None = None
    tool_calls: tuple[ReplyToolCall, ...] = ()
    finish: Literal["tool_calls", "stop", "length"] = "stop"
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""


def new_ref() -> str:
    """A fresh reply reference: 16 hex digits."""
    return secrets.token_hex(8)


def call_id(prefix: str, ref: str, index: int) -> str:
    """The id of tool call ``index`` of reply ``ref`` (``toolu_``/``call_`` prefixes)."""
    return f"{prefix}{ref}{index:02d}"


def ref_of_id(value: str | None) -> str:
    """The reply reference inside one of our ids or signatures, or ``""``."""
    if not value:
        return ""
    if value.startswith(REF_PREFIX):
        return value[len(REF_PREFIX) :][:16]
    for prefix in ("toolu_", "call_", "fc_", "msg_", "rs_"):
        if value.startswith(prefix):
            rest = value[len(prefix) :]
            if len(rest) == 18 and all(c in "0123456789abcdef" for c in rest):
                return rest[:16]
            if len(rest) == 16 and all(c in "0123456789abcdef" for c in rest):
                return rest
    return ""


def text_of(content: Any) -> str:
    """The text of a message content: a string, or the text parts of a list of parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict):
                kind = part.get("type")
                if kind in ("text", "input_text", "output_text") or (
                    kind is None and "text" in part
                ):
                    parts.append(str(part.get("text", "")))
                elif kind in ("image", "image_url", "input_image"):
                    parts.append("[image]")
                elif kind == "refusal":
                    parts.append(str(part.get("refusal", "")))
        return "".join(parts)
    if isinstance(content, dict):
        return text_of([content])
    return str(content)


def parse_arguments(raw: Any) -> Any:
    """Tool-call arguments as a dict when they are a JSON object, else as they came."""
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            value = loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
        return value if isinstance(value, dict) else raw
    return raw if raw is not None else {}


def function_tool(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    """A tool in OpenAI function form, checked enough for a chat template to render it.

    Raises:
        ApiError: the name is not a non-empty string or the parameters are not an object.
    """
    if not isinstance(name, str) or not name:
        raise ApiError(400, "invalid_request", "every tool needs a non-empty string 'name'")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise ApiError(
            400, "invalid_request", f"tool {name!r}: its parameter schema must be a JSON object"
        )
    # OpenAI's order (name, description, parameters): templates render the dict with tojson,
    # which keeps key order, as an OpenAI-compatible server would pass it on.
    fn: dict[str, Any] = {"name": name}
    if isinstance(description, str) and description:
        fn["description"] = description
    fn["parameters"] = parameters
    return {"type": "function", "function": fn}


def decode_json_object(body: bytes | bytearray) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        ApiError: 400 when it is not valid JSON or not an object.
    """
    try:
        value = loads(body)
    except ValueError as exc:  # UnicodeDecodeError is one
        raise ApiError(400, "invalid_request", f"the request body is not valid JSON: {exc}")
    if not isinstance(value, dict):
        raise ApiError(400, "invalid_request", "the request body must be a JSON object")
    # JSON may spell a lone UTF-16 surrogate (``"\\ud800"``): Python keeps it in the str, and
    # the tokenizer (which takes UTF-8) raises TypeError on it deep in rendering. A valid pair
    # decodes to one astral character, so any surrogate left in a decoded string is lone.
    if _SURROGATE_ESCAPE.search(body):
        where = _lone_surrogate(value, "")
        if where is not None:
            raise ApiError(
                400,
                "invalid_request",
                f"{where or 'the body'}: a string holds a lone UTF-16 surrogate (not Unicode text)",
            )
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any, where: str) -> str | None:
    """The path of the first string (or key) in ``value`` holding a lone surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if _lone_surrogate(key, path) is not None:
                return path.encode("utf-8", "backslashreplace").decode()
            found = _lone_surrogate(item, path)
            if found is not None:
                return found.encode("utf-8", "backslashreplace").decode()
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _lone_surrogate(item, f"{where}.{i}" if where else str(i))
            if found is not None:
                return found
    return None


def positive_int(value: Any, field: str) -> int | None:
    """An optional positive integer field.

    Raises:
        ApiError: 400 when present and not a positive integer.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ApiError(400, "invalid_request", f"{field} must be a positive integer")
    return value


def sse(event: str | None, data: Any) -> bytes:
    """One server-sent event."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class ReplyStreamLike(Protocol):
    """What each API's ``ReplyStream`` gives: the events of one reply, part by part."""

    def head(self) -> bytes: ...

    def reasoning(self, text: str) -> bytes: ...

    def text(self, text: str) -> bytes: ...

    def tail(self, reply: Reply) -> bytes: ...


def stream_events(stream: ReplyStreamLike, reply: Reply) -> Iterator[bytes]:
    """The events of a streamed reply in ``stream``'s API: head, reasoning (if any), text (a
    reply without tool calls has a text part, even empty), then the tool calls and the end."""
    yield stream.head()
    if reply.reasoning is not None:
        yield stream.reasoning(reply.reasoning)
    if reply.text or not reply.tool_calls:
        yield stream.text(reply.text)
    yield stream.tail(reply)
