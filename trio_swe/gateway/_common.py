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

import hashlib
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


#: A message (or field) of a request of up to this many bytes of JSON is kept by the parse
#: memo as those bytes; a bigger one as a digest of them (not a second copy of a big tool
#: result), which a resent one is then hashed again to match.
MEMO_COPY_BYTES = 64 * 1024

#: The JSON of a value a request's ``tools`` may be without tools (the memo's kind of request).
_NO_TOOLS = frozenset((b"null", b"[]", b"{}", b'""', b"false", b"0"))


class _Digest:
    """What the memo keeps of a big span of JSON: equal to a span of the same bytes."""

    __slots__ = ("digest", "size")

    def __init__(self, raw: msgspec.Raw) -> None:
        self.size = len(raw)
        self.digest = _digest(raw)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, msgspec.Raw)
            and len(other) == self.size
            and _digest(other) == self.digest
        )

    __hash__ = None  # type: ignore[assignment]


def _digest(raw: msgspec.Raw) -> bytes:
    return hashlib.blake2b(memoryview(raw), digest_size=20).digest()


def _kept(raw: msgspec.Raw) -> msgspec.Raw | _Digest:
    """What the memo keeps of a span of the body: its bytes (a copy: the body is not held),
    or a digest of a big one."""
    return raw.copy() if len(raw) <= MEMO_COPY_BYTES else _Digest(raw)


class _Slot:
    """The parse of one kind of request: its units, what they gave, fields computed whole."""

    __slots__ = ("ends", "fields", "messages", "raws")

    def __init__(self) -> None:
        #: The request's units (its messages; Responses: its input items) as their JSON.
        self.raws: list[Any] = []
        #: What the units parsed to, in order (a unit gives none, one or several messages).
        self.messages: list[Message] = []
        #: Per unit, ``len(messages)`` once it was parsed; -1 where it leaves an assistant turn
        #: open (Responses: the next item may still add to that message).
        self.ends: list[int] = []
        #: Values computed from one field of the request each: name -> (its JSON, value).
        self.fields: dict[str, tuple[Any, Any]] = {}


class ParseMemo:
    """A session's memo of its requests' parses (sans-IO; each API's ``parse_request`` takes
    it), so that a request resending a history decodes and parses only what is new: the rest
    of its cost is C-level scanning and comparing of bytes.

    Kept per *kind* of request, the ``slots`` most recent kinds (``(api, has tools)``: the side
    requests a CLI sends beside its main chain, without tools, keep their own and do not evict
    the chain's). Each kind's slot holds, for the previous request, the JSON text of each of
    its messages (Responses: input items) and the :class:`Message` objects each gave, and the
    system prompt and tools it computed from the whole request. The body is scanned into spans
    without being decoded (``msgspec.Raw``); a message whose JSON is, byte for byte, the one at
    its index last time gives that request's messages again, the same objects; any other is
    decoded and parsed (a rewritten message is never taken for the old one). A body the scan
    refuses, or any request that does not parse, is parsed whole without the memo (whose
    errors are the API's), and changes nothing.

    The bytes compared are the JSON text, not values: a message resent with a number's type
    changed (``1``, ``1.0``, ``true``) or its keys reordered is parsed again, as it may render
    differently; one merely re-serialised (other spaces, other escapes) is parsed again too,
    to the same messages. Every byte of the body is checked as the plain parse checks it
    (each span decoded, or equal to one that was), but for one case: when the top-level object
    repeats a key, the value that the later one overrides is skipped, not decoded, so invalid
    UTF-8 there is not refused (both decoders ignore that value otherwise).

    Memory: the JSON of the messages of one request per kind (a copy: the body itself is not
    held), a message over :data:`MEMO_COPY_BYTES` as a digest; :meth:`clear` drops it (a
    finished session).

    Attributes:
        parsed: messages (Responses: input items) decoded and parsed, over the memo's life.
        reused: messages whose previous parse was reused.
    """

    def __init__(self, slots: int = 2) -> None:
        self.slots = slots
        self._slots: dict[Hashable, _Slot] = {}
        self.parsed = 0
        self.reused = 0

    def __len__(self) -> int:
        """How many kinds of request it holds a parse of."""
        return len(self._slots)

    @property
    def nbytes(self) -> int:
        """The bytes of JSON it holds (digests of big spans not counted)."""
        return sum(
            len(raw)
            for slot in self._slots.values()
            for raw in (*slot.raws, *(f[0] for f in slot.fields.values()))
            if isinstance(raw, msgspec.Raw)
        )

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


class Reader:
    """What an API's parser reads of a request body: its top-level fields, its *units* (the
    messages, or Responses' input items) and values computed from a field.

    This one decodes the body whole (:func:`decode_json_object`) and parses everything;
    :class:`MemoUse` reads it through a session's :class:`ParseMemo`.
    """

    def __init__(self, body: bytes | bytearray) -> None:
        self._data = decode_json_object(body)
        #: What this parse leaves for the next request of its kind (see :class:`_Slot`).
        self.new = _Slot()
        self.parsed = 0
        self.reused = 0

    def get(self, name: str, default: Any = None) -> Any:
        """A top-level field, decoded (``default`` when absent)."""
        return self._data.get(name, default)

    def field(self, name: str, compute: Callable[[Any], Any]) -> Any:
        """``compute(field)``, or the value computed last time from the same JSON."""
        return compute(self._data.get(name))

    def units(self, name: str) -> Any:
        """The field holding the units: a list of them (as :meth:`value` takes them), or
        whatever else the field is (the parser refuses it)."""
        return self._data.get(name)

    def value(self, unit: Any) -> Any:
        """A unit, decoded."""
        return unit

    def record(self, unit: Any, end: int) -> None:
        """Note a unit parsed, and :attr:`new`'s message count after it (-1: turn open)."""

    def prefix(self, units: Sequence[Any]) -> int:
        """Start :attr:`new` with the longest run of leading units the previous request of
        this kind had, ending where no assistant turn is open; return its length."""
        return 0

    def messages(
        self, units: Sequence[Any], parse: Callable[[int, Any], Sequence[Message]]
    ) -> list[Message]:
        """The messages of ``units`` parsed on their own (``parse(index, unit decoded)``).
        The list returned is :attr:`new`'s: copy it."""
        out = self.new.messages
        for i, unit in enumerate(units):
            out.extend(parse(i, unit))
        self.parsed += len(units)
        return out

    def done(self) -> None:
        """The request parsed whole."""


class MemoUse(Reader):
    """A request read through a session's :class:`ParseMemo`: the body scanned into the JSON
    text of its fields and units (``msgspec.Raw``, nothing decoded), compared with what the
    memo kept of the previous request of its kind.

    Raises:
        msgspec.DecodeError: the body is not a JSON object msgspec scans (the caller parses
            it with a plain :class:`Reader` then, which says what is wrong).
    """

    def __init__(
        self, memo: ParseMemo, body: bytes | bytearray, api: str, *, remember: bool = True
    ) -> None:
        self._top = msgspec.json.decode(body, type=dict[str, msgspec.Raw])
        tools = self._top.get("tools")
        with_tools = tools is not None and not (len(tools) <= 5 and bytes(tools) in _NO_TOOLS)
        self._memo = memo
        self._key = (api, with_tools)
        self._remember = remember
        self._old = memo._get(self._key)
        self._read: set[str] = set()
        self.new = _Slot()
        self.parsed = 0
        self.reused = 0

    def get(self, name: str, default: Any = None) -> Any:
        self._read.add(name)
        raw = self._top.get(name)
        return default if raw is None else msgspec.json.decode(raw)

    def field(self, name: str, compute: Callable[[Any], Any]) -> Any:
        self._read.add(name)
        raw = self._top.get(name)
        old = self._old.fields.get(name) if self._old is not None else None
        if old is not None and old[0] == raw:  # None, or the same bytes
            kept, value = old
        else:
            value = compute(None if raw is None else msgspec.json.decode(raw))
            kept = None if raw is None else _kept(raw)
        self.new.fields[name] = (kept, value)
        return value

    def units(self, name: str) -> Any:
        self._read.add(name)
        raw = self._top.get(name)
        return None if raw is None else msgspec.json.decode(raw, type=list[msgspec.Raw])

    def value(self, unit: Any) -> Any:
        return msgspec.json.decode(unit)

    def record(self, unit: Any, end: int) -> None:
        self.new.raws.append(_kept(unit))
        self.new.ends.append(end)

    def prefix(self, units: Sequence[Any]) -> int:
        old = self._old
        if old is None:
            return 0
        k = _common_prefix(units, old.raws)
        while k and old.ends[k - 1] < 0:
            k -= 1
        if k:
            self.new.raws = old.raws[:k]
            self.new.ends = old.ends[:k]
            self.new.messages = old.messages[: old.ends[k - 1]]
            self.reused += k
        return k

    def messages(
        self, units: Sequence[Any], parse: Callable[[int, Any], Sequence[Message]]
    ) -> list[Message]:
        """Each unit whose JSON is the previous request's at its index gives that unit's
        messages again; the others are decoded and parsed."""
        k = self.prefix(units)
        old, new = self._old, self.new
        out = new.messages
        n_old = len(old.raws) if old is not None else 0
        for i in range(k, len(units)):
            unit = units[i]
            if old is not None and i < n_old and unit == old.raws[i]:  # after an edited one
                out.extend(old.messages[old.ends[i - 1] if i else 0 : old.ends[i]])
                new.raws.append(old.raws[i])
                self.reused += 1
            else:
                out.extend(parse(i, msgspec.json.decode(unit)))
                new.raws.append(_kept(unit))
                self.parsed += 1
            new.ends.append(len(out))
        return out

    def done(self) -> None:
        # The fields no parser read are decoded too, as the plain parse decodes the whole
        # body: what it refuses (invalid UTF-8 in any string) is refused here.
        for name, raw in self._top.items():
            if name not in self._read:
                msgspec.json.decode(raw)
        memo = self._memo
        memo.parsed += self.parsed
        memo.reused += self.reused
        if self._remember:
            memo._put(self._key, self.new)


def parse_with(
    parse: Callable[[Reader], Conversation],
    body: bytes | bytearray,
    api: str,
    memo: ParseMemo | None,
    remember: bool,
) -> Conversation:
    """``parse`` of ``body`` through ``memo`` when there is one; a body that does not parse
    so (whatever the reason) is parsed plainly, whose answer (an :class:`ApiError` in the
    API's terms) is the one."""
    if memo is not None:
        try:
            return parse(MemoUse(memo, body, api, remember=remember))
        except Exception:  # the plain parse decides: its errors are the API's
            pass
    return parse(Reader(body))


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
