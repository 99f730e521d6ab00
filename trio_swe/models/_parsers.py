"""Tool-call parsers: the model's output text to reasoning, content and tool calls (sans-IO).

Pluggable by name (:func:`register_tool_parser`, ``SWE_TOOL_PARSER``) or inferred from a chat
template (:func:`infer_tool_parser`). Two ship:

* ``hermes`` (Qwen2.5, Qwen3): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
* ``qwen3_coder`` (Qwen3-Coder): ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n
  </parameter>\\n</function>\\n</tool_call>``, values converted by the tool's JSON schema.

An output that does not parse is not an exception: :class:`ParsedOutput` carries
``ill_formed=True`` and a one-line ``error`` the agent shows the model.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from .._errors import ConfigError, InvalidArgumentError
from .._json import loads

__all__ = [
    "HermesToolParser",
    "ParsedOutput",
    "Qwen3CoderToolParser",
    "ToolCall",
    "ToolParser",
    "available_tool_parsers",
    "get_tool_parser",
    "infer_tool_parser",
    "register_tool_parser",
    "split_reasoning",
    "validate_tool_calls",
]


class ToolCall(msgspec.Struct, frozen=True):
    """One parsed tool call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


class ParsedOutput(msgspec.Struct, frozen=True, kw_only=True):
    """What a model's output says.

    Attributes:
        text: the decoded output, stop token excluded.
        reasoning: the text inside ``<think>...</think>``, or None when there is none.
        content: the text outside reasoning and tool calls (stripped).
        tool_calls: the calls, in order.
        ill_formed: the output tried to call a tool (or had to) and could not be parsed.
        error: why it is ill-formed (empty otherwise), written for the model to read.
    """

    text: str
    reasoning: str | None = None
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    ill_formed: bool = False
    error: str = ""

    def message(self) -> dict[str, Any]:
        """The assistant message (OpenAI chat shape) a chat template renders for this output.

        Arguments stay dicts: templates serialise them themselves (``tojson``), as the model
        was trained to see them.
        """
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
                for c in self.tool_calls
            ]
        return msg


@runtime_checkable
class ToolParser(Protocol):
    """Finds tool calls in the text of one output (reasoning already split off)."""

    name: str

    def parse(self, text: str) -> tuple[str, list[ToolCall], str]:
        """``(content, calls, error)``; a non-empty ``error`` means the calls are ill-formed."""
        ...


def split_reasoning(
    text: str, open_tag: str = "<think>", close_tag: str = "</think>"
) -> tuple[str | None, str]:
    """``(reasoning, rest)`` of an output: the text before ``close_tag`` (an ``open_tag`` at its
    start removed; templates that end the prompt with ``<think>`` leave only the close) and the
    text after it. No ``close_tag``: ``(None, text)``."""
    if close_tag not in text:
        return None, text
    head, _, rest = text.partition(close_tag)
    head = head.lstrip()
    if head.startswith(open_tag):
        head = head[len(open_tag) :]
    return head.strip("\n"), rest.lstrip("\n")


_CALL_OPEN, _CALL_CLOSE = "<tool_call>", "</tool_call>"


def blocks(text: str, open_: str, close: str) -> tuple[list[str], str]:
    """The bodies of the ``open_ ... close`` blocks in ``text`` and the text outside them.

    The blocks are those the regex ``open_(.*?)close`` (DOTALL) finds: leftmost first, not
    overlapping, each ended by the first ``close`` after it. Linear time: the regex searches
    to the end of the text from every ``open_`` that no ``close`` follows, which is quadratic
    in a degenerate output (thousands of unclosed tags took the parser tens of seconds, on the
    event loop). Once one ``open_`` has no ``close`` after it, no later one has.
    """
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    while (i := text.find(open_, pos)) >= 0:
        j = text.find(close, i + len(open_))
        if j < 0:
            break
        outside.append(text[pos:i])
        bodies.append(text[i + len(open_) : j])
        pos = j + len(close)
    outside.append(text[pos:])
    return bodies, "".join(outside)


class HermesToolParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one or more (Qwen3)."""

    name = "hermes"

    def parse(self, text: str) -> tuple[str, list[ToolCall], str]:
        """See :meth:`ToolParser.parse`."""
        if text.count(_CALL_OPEN) != text.count(_CALL_CLOSE):
            return text.strip(), [], "a <tool_call> is not closed by </tool_call>"
        bodies, outside = blocks(text, _CALL_OPEN, _CALL_CLOSE)
        content = outside.strip()
        calls: list[ToolCall] = []
        for i, body in enumerate(bodies, 1):
            try:
                obj = loads(body)
            except ValueError as exc:
                return content, [], f"tool call {i} is not valid JSON: {exc}"
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return content, [], f"tool call {i} has no string 'name'"
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):  # some models emit the arguments as a JSON string
                try:
                    args = loads(args)
                except ValueError:
                    pass
            if not isinstance(args, dict):
                return content, [], f"tool call {i}: 'arguments' is not an object"
            calls.append(ToolCall(obj["name"], args))
        return content, calls, ""


_CODER_FUNC = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.DOTALL)
_PARAM_OPEN, _PARAM_CLOSE = "<parameter=", "</parameter>"
_NAME_END = re.compile(r"[>\n]")


def parameters(inner: str) -> tuple[list[tuple[str, str]], str]:
    """``(name, raw value)`` of each ``<parameter=NAME>VALUE</parameter>`` in ``inner`` and the
    text outside them: what the regex ``<parameter=([^>\\n]+)>(.*?)</parameter>`` (DOTALL)
    finds, in linear time (see :func:`blocks`). A name runs to the first ``>`` and may not
    hold a line feed: every ``<parameter=`` before such a line feed fails alike, so the
    search goes on after it."""
    found: list[tuple[str, str]] = []
    outside: list[str] = []
    pos = search = 0
    while (i := inner.find(_PARAM_OPEN, search)) >= 0:
        start = i + len(_PARAM_OPEN)
        end = _NAME_END.search(inner, start)
        if end is None:  # no ">" from here on: no later name ends either
            break
        if end.group() == "\n":
            search = end.start()
            continue
        if end.start() == start:  # an empty name
            search = i + 1
            continue
        j = inner.find(_PARAM_CLOSE, end.end())
        if j < 0:
            break
        outside.append(inner[pos:i])
        found.append((inner[start : end.start()], inner[end.end() : j]))
        pos = search = j + len(_PARAM_CLOSE)
    outside.append(inner[pos:])
    return found, "".join(outside)


class Qwen3CoderToolParser:
    """Qwen3-Coder's XML calls; values are text, converted by the tools' schemas when given.

    Args:
        tools: the declared tools (OpenAI function format); a parameter whose schema type is
            ``integer``, ``number``, ``boolean``, ``object`` or ``array`` is converted, others stay
            strings.
    """

    name = "qwen3_coder"

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self._types: dict[str, dict[str, str]] = {}
        for tool in tools:
            fn = tool.get("function", tool)
            props = (fn.get("parameters") or {}).get("properties") or {}
            self._types[fn.get("name", "")] = {
                k: str(v.get("type", "string")) for k, v in props.items() if isinstance(v, dict)
            }

    def parse(self, text: str) -> tuple[str, list[ToolCall], str]:
        """See :meth:`ToolParser.parse`."""
        bodies, outside = blocks(text, _CALL_OPEN, _CALL_CLOSE)
        content = outside.strip()
        if text.count(_CALL_OPEN) != text.count(_CALL_CLOSE):
            return content, [], "a <tool_call> is not closed by </tool_call>"
        if "<function=" in content:
            return content, [], "a <function=...> block is outside <tool_call></tool_call>"
        calls: list[ToolCall] = []
        for i, body in enumerate(bodies, 1):
            m = _CODER_FUNC.match(body)
            if m is None:
                return content, [], f"tool call {i} is not one <function=NAME>...</function>"
            name, inner = m.group(1).strip(), m.group(2)
            types = self._types.get(name, {})
            args: dict[str, Any] = {}
            found, leftover = parameters(inner)
            for pname, raw in found:
                pname = pname.strip()
                value = raw[1:] if raw.startswith("\n") else raw
                value = value[:-1] if value.endswith("\n") else value
                try:
                    args[pname] = _convert(value, types.get(pname, "string"))
                except ValueError as exc:
                    return content, [], f"tool call {i}: parameter {pname!r}: {exc}"
            if leftover.strip():
                return content, [], f"tool call {i} has text outside <parameter=...> blocks"
            calls.append(ToolCall(name, args))
        return content, calls, ""


def _convert(value: str, kind: str) -> Any:
    if kind == "integer":
        return int(value.strip())
    if kind == "number":
        return float(value.strip())
    if kind == "boolean":
        low = value.strip().lower()
        if low not in ("true", "false"):
            raise ValueError(f"{value!r} is not true or false")
        return low == "true"
    if kind in ("object", "array"):
        return loads(value)
    return value


#: How deeply a call's arguments may nest (objects and arrays). Real tools take a few levels; a
#: degenerate output (``[[[[...`` for hundreds of tokens) parses as JSON up to the interpreter's
#: recursion limit and would then break the chat template's rendering of the next prompt.
MAX_ARGUMENT_DEPTH = 64


def too_deep(calls: Sequence[ToolCall], limit: int = MAX_ARGUMENT_DEPTH) -> str:
    """Why ``calls`` cannot be rendered back (arguments nested deeper than ``limit``), or ``""``.
    Iterative: a recursive walk would fail on the very input it guards against."""
    for i, call in enumerate(calls, 1):
        stack: list[tuple[Any, int]] = [(call.arguments, 1)]
        while stack:
            value, depth = stack.pop()
            if depth > limit:
                return f"tool call {i}: arguments nested deeper than {limit} levels"
            if isinstance(value, dict):
                stack.extend((v, depth + 1) for v in value.values())
            elif isinstance(value, list):
                stack.extend((v, depth + 1) for v in value)
    return ""


def validate_tool_calls(calls: Sequence[ToolCall], tools: Sequence[Mapping[str, Any]]) -> str:
    """Why ``calls`` do not fit the declared ``tools`` (unknown name, a required parameter
    missing, a string parameter that is not a string), or ``""``."""
    declared: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        declared[str(fn.get("name", ""))] = fn.get("parameters") or {}
    for call in calls:
        schema = declared.get(call.name)
        if schema is None:
            return f"unknown tool {call.name!r}; the tools are {', '.join(sorted(declared))}"
        for req in schema.get("required", ()):
            if req not in call.arguments:
                return f"tool {call.name!r} needs the argument {req!r}"
        props = schema.get("properties") or {}
        for key, value in call.arguments.items():
            kind = (props.get(key) or {}).get("type")
            if kind == "string" and not isinstance(value, str):
                return f"tool {call.name!r}: argument {key!r} must be a string"
    return ""


ToolParserFactory = Callable[[Sequence[Mapping[str, Any]]], ToolParser]

_REGISTRY: dict[str, ToolParserFactory] = {
    "hermes": lambda tools: HermesToolParser(),
    "qwen3_coder": lambda tools: Qwen3CoderToolParser(tools),
}


def register_tool_parser(name: str, factory: ToolParserFactory, *, replace: bool = False) -> None:
    """Make ``factory(tools) -> ToolParser`` selectable as ``SWE_TOOL_PARSER=<name>``."""
    if not name or not name.strip():
        raise InvalidArgumentError("tool parser name must be non-empty")
    if name in _REGISTRY and not replace:
        raise InvalidArgumentError(f"tool parser {name!r} is already registered (replace=True)")
    _REGISTRY[name] = factory


def available_tool_parsers() -> tuple[str, ...]:
    """Registered parser names, sorted."""
    return tuple(sorted(_REGISTRY))


def get_tool_parser(name: str, tools: Sequence[Mapping[str, Any]] = ()) -> ToolParser:
    """The parser registered as ``name``.

    Raises:
        ConfigError: no parser has that name (the message lists those that do).
    """
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ConfigError(
            f"SWE_TOOL_PARSER={name!r} is not a tool parser; choose one of "
            f"{', '.join(available_tool_parsers())} or 'auto'"
        ) from None
    return factory(tools)


def infer_tool_parser(chat_template: str) -> str:
    """The parser name a chat template's own tool-call format asks for.

    Raises:
        ConfigError: the template shows neither known format (name one with SWE_TOOL_PARSER).
    """
    if "<function=" in chat_template and "<parameter=" in chat_template:
        return "qwen3_coder"
    if "<tool_call>" in chat_template:
        return "hermes"
    raise ConfigError(
        "cannot infer the tool-call format from the chat template (no <tool_call> in it); "
        f"set SWE_TOOL_PARSER to one of {', '.join(available_tool_parsers())}"
    )
