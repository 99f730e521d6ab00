"""What the three wire APIs have in common once parsed (sans-IO).

A request becomes a :class:`Conversation`: chat-template messages (OpenAI chat shape: ``role``,
``content`` as a string, ``reasoning_content``, ``tool_calls`` with dict arguments,
``tool_call_id``) and tools in OpenAI function form, whatever API it came in. A message that
echoes one of our own replies carries the reply's reference (``ref``) when the client kept one
of the ids we handed out (tool-call ids, thinking signatures, reasoning ``encrypted_content``),
so the session can recognise it without comparing text.

A reply is a :class:`Reply`: the parsed output with the ids we give its parts, which each API's
module turns into its own JSON or SSE events.

A CLI agent resends its whole history with every request. A session's :class:`ParseMemo` keeps
what its previous request parsed to, so that each API's ``parse_request`` parses only the
messages that are new (or changed): the others give the very :class:`Message` objects they gave
before, which is also what lets the session match them against its transcripts by identity.
Messages are therefore never changed once parsed (the struct is frozen).
"""

from __future__ import annotations

import json
import operator
import re
import secrets
from collections.abc import Callable, Hashable, Iterator, Sequence
from itertools import compress, count
from typing import Any, Literal, Protocol

import msgspec

from .._json import loads

__all__ = [
    "ApiError",
    "Conversation",
    "Message",
    "ParseMemo",
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


class Message(msgspec.Struct, kw_only=True, frozen=True):
    """One chat-template message, plus what identifies it as ours.

    Frozen: a session's :class:`ParseMemo` hands the same message to every later request that
    resends it, and the session's transcripts hold it (its ``tool_calls`` list and the
    arguments in it are not to be changed either).

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


class _Slot:
    """The parse of one kind of request: its units, what they gave, fields computed whole."""

    __slots__ = ("ends", "fields", "messages", "raws")

    def __init__(self) -> None:
        #: The request's units as decoded: its messages (Responses: its input items). A unit
        #: reused from the request before is that request's object (its strings are the ones
        #: its messages hold), not the equal one decoded now.
        self.raws: list[Any] = []
        #: What the units parsed to, in order (a unit gives none, one or several messages).
        self.messages: list[Message] = []
        #: Per unit, ``len(messages)`` once it was parsed; -1 where it leaves an assistant turn
        #: open (Responses: the next item may still add to that message).
        self.ends: list[int] = []
        #: Values computed from one field of the request each: name -> (raw, value).
        self.fields: dict[str, tuple[Any, Any]] = {}


class ParseMemo:
    """A session's memo of its requests' parses (sans-IO; each API's ``parse_request`` takes
    it), so that a request resending a history parses only what is new: the work per request
    is in proportion to its new messages, the rest being C-level comparisons.

    Kept per *kind* of request, the ``slots`` most recent kinds (``(api, has tools)``: the side
    requests a CLI sends beside its main chain, without tools, keep their own and do not evict
    the chain's). Each kind's slot holds the previous request's raw messages as decoded and the
    :class:`Message` objects each gave, and the system prompt and tools it computed from the
    whole request. A raw message equal (``==``, a deep comparison of the decoded JSON in C) to
    the one at its index in the previous request gives that request's messages again, the same
    objects; any other is parsed (a rewritten message is never taken for the old one).

    ``==`` on decoded JSON does not tell ``1``, ``1.0`` and ``true`` apart, nor the key orders of
    an object: a client that resent a message changing only that (none does: each stores its
    history and serialises it the same way) would get its earlier parse. The session's matching
    treats those as the same message too (:func:`~trio_swe.gateway._session._args_match`).

    Memory: the raw messages' strings are mostly the very strings of the messages they gave
    (text of one part, tool results, arguments), held by the session's transcripts anyway; the
    memo adds the decoded dicts and lists around them (about as many bytes as the history's
    JSON). :meth:`clear` drops it (a finished session).

    Attributes:
        parsed: raw messages (Responses: input items) parsed, over the memo's life.
        reused: raw messages whose previous parse was reused.
    """

    def __init__(self, slots: int = 2) -> None:
        self.slots = slots
        self._slots: dict[Hashable, _Slot] = {}
        self.parsed = 0
        self.reused = 0

    def __len__(self) -> int:
        """How many kinds of request it holds a parse of."""
        return len(self._slots)

    def clear(self) -> None:
        """Drop every parse held (the counters stay)."""
        self._slots.clear()

    def _get(self, key: Hashable) -> _Slot | None:
        return self._slots.get(key)

    def _put(self, key: Hashable, slot: _Slot) -> None:
        self._slots.pop(key, None)
        self._slots[key] = slot
        while len(self._slots) > self.slots:
            del self._slots[next(iter(self._slots))]  # the kind least recently parsed


def _common_prefix(new: Sequence[Any], old: Sequence[Any]) -> int:
    """How many leading items of ``new`` equal ``old``'s, compared in C (no Python loop)."""
    return next(compress(count(), map(operator.ne, new, old)), min(len(new), len(old)))


class MemoUse:
    """One request's parse through a session's :class:`ParseMemo` (or none): look-ups in the
    slot of its kind, and the slot it leaves there once it parsed whole (:meth:`done`; a
    request that fails to parse changes nothing).

    Args:
        memo: the session's memo, or None (everything is parsed).
        key: the request's kind.
        remember: keep this request's parse for the next one (False: a request that does not
            continue the conversation, e.g. ``count_tokens``, only reads the memo).
    """

    def __init__(self, memo: ParseMemo | None, key: Hashable, *, remember: bool = True) -> None:
        self._memo = memo
        self._key = key
        self._remember = remember
        self._old = memo._get(key) if memo is not None else None
        self.new = _Slot()
        self.parsed = 0
        self.reused = 0

    def field(self, name: str, raw: Any, compute: Callable[[Any], Any]) -> Any:
        """``compute(raw)``, or the value computed last time from an equal ``raw``."""
        old = self._old.fields.get(name) if self._old is not None else None
        if old is not None and old[0] == raw:
            raw, value = old
        else:
            value = compute(raw)
        self.new.fields[name] = (raw, value)
        return value

    def prefix(self, raws: Sequence[Any]) -> int:
        """Start :attr:`new` with the longest run of leading units equal to the previous
        request's that ends where no assistant turn is open; return its length."""
        old = self._old
        if old is None:
            return 0
        k = _common_prefix(raws, old.raws)
        while k and old.ends[k - 1] < 0:
            k -= 1
        if k:
            self.new.raws = old.raws[:k]
            self.new.ends = old.ends[:k]
            self.new.messages = old.messages[: old.ends[k - 1]]
            self.reused += k
        return k

    def messages(
        self, raws: Sequence[Any], parse: Callable[[int, Any], Sequence[Message]]
    ) -> list[Message]:
        """The messages of ``raws``, units parsed on their own (``parse(index, raw)``): each
        equal to the previous request's unit at its index gives that unit's messages again.
        The list returned is the memo's: copy it."""
        k = self.prefix(raws)
        old, new = self._old, self.new
        out, kept, ends = new.messages, new.raws, new.ends
        n_old = len(old.raws) if old is not None else 0
        for i in range(k, len(raws)):
            raw = raws[i]
            if i < n_old and old is not None and raw == old.raws[i]:  # after an edited one
                raw = old.raws[i]
                out.extend(old.messages[old.ends[i - 1] if i else 0 : old.ends[i]])
                self.reused += 1
            else:
                out.extend(parse(i, raw))
                self.parsed += 1
            kept.append(raw)
            ends.append(len(out))
        return out

    def done(self) -> None:
        """The request parsed whole: count it, and keep its parse for the next of its kind."""
        memo = self._memo
        if memo is None:
            return
        memo.parsed += self.parsed
        memo.reused += self.reused
        if self._remember:
            memo._put(self._key, self.new)


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
