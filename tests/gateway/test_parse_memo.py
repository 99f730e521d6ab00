"""The session's parse memo: a request resending a history decodes and parses only what is new.

Sans-IO first: each API's ``parse_request`` with a :class:`ParseMemo` gives, request after
request, exactly the :class:`Conversation` it gives without (checked as JSON bytes, so ``1``,
``1.0`` and ``true`` or reordered keys are told apart) over seeded sequences that extend, edit,
truncate and re-serialise a history, with failing requests among them; the messages a resent
unit gave are the very objects of the request before. Then over HTTP: a CLI's history matched
by identity, an edited history forking as before, side requests beside the chain, count_tokens,
and the memo dropped when the session finishes.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from trio_swe.demo._cli_scripts import tool_call_text
from trio_swe.gateway import _anthropic, _chat, _responses, _session
from trio_swe.gateway._common import MEMO_COPY_BYTES, ApiError, Conversation, ParseMemo

from .test_http import READ, SYSTEM, TASK, _Bodies, gateway

Parse = Callable[..., Conversation]
PARSERS: dict[str, Parse] = {
    "anthropic": _anthropic.parse_request,
    "chat": _chat.parse_request,
    "responses": _responses.parse_request,
}
UNITS = {"anthropic": "messages", "chat": "messages", "responses": "input"}


def exact(conv: Conversation) -> bytes:
    """A conversation as JSON: equal bytes, equal conversations (types and key order too)."""
    return msgspec.json.encode(conv)


def outcome(parse: Parse, body: bytes, memo: ParseMemo | None = None) -> Any:
    try:
        return parse(body, memo) if memo is not None else parse(body)
    except ApiError as exc:
        return (exc.status, exc.kind, exc.message)


# -- seeded request sequences -----------------------------------------------------------------


class _History:
    """A client's history in one API's shape, changed at random (seeded)."""

    def __init__(self, api: str, seed: int) -> None:
        self.api = api
        self.rng = random.Random(seed)
        self.units: list[Any] = []
        self.n = 0
        self.head: Any = SYSTEM
        self.tools: Any = [READ] if api != "anthropic" else [_anthropic_tool()]
        self.ascii_only = False
        self.separators = (",", ":")

    def text(self) -> str:
        r = self.rng.random()
        self.n += 1
        if r < 0.05:
            return "big " * (MEMO_COPY_BYTES // 4 + 10) + str(self.n)  # kept as a digest
        if r < 0.2:
            return f"caf\u00e9 \U0001f600 \u2500\u2500 {self.n}"  # non-ASCII, an astral char
        return f"text {self.n} " + "x" * self.rng.randint(0, 40)

    def args(self) -> dict[str, Any]:
        return {"path": f"/testbed/{self.n}.py", "limit": self.rng.choice([1, 2.5, True, None])}

    def new_unit(self) -> Any:
        api, rng, n = self.api, self.rng, self.n
        cid = f"call_{n:016x}00"
        if api == "anthropic":
            kind = rng.choice(["user", "user-blocks", "assistant", "tool-results", "system"])
            if kind == "user":
                return {"role": "user", "content": self.text()}
            if kind == "user-blocks":
                blocks = [{"type": "text", "text": self.text()} for _ in range(rng.randint(1, 2))]
                if rng.random() < 0.3:
                    blocks[-1]["cache_control"] = {"type": "ephemeral"}
                return {"role": "user", "content": blocks}
            if kind == "assistant":
                content: list[Any] = []
                if rng.random() < 0.5:
                    content.append(
                        {"type": "thinking", "thinking": self.text(), "signature": "trio-swe:ab"}
                    )
                content.append({"type": "text", "text": self.text()})
                content.append(
                    {"type": "tool_use", "id": cid, "name": "read_file", "input": self.args()}
                )
                return {"role": "assistant", "content": content}
            if kind == "tool-results":
                result: Any = self.text()
                if rng.random() < 0.3:
                    result = [{"type": "text", "text": self.text()}]
                return {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": cid, "content": result},
                        {
                            "type": "text",
                            "text": f"<system-reminder>{self.text()}</system-reminder>",
                        },
                    ],
                }
            return {"role": "system", "content": self.text()}
        if api == "chat":
            kind = rng.choice(["user", "parts", "assistant", "tool", "developer"])
            if kind == "user":
                return {"role": "user", "content": self.text()}
            if kind == "parts":
                return {"role": "user", "content": [{"type": "text", "text": self.text()}]}
            if kind == "assistant":
                arguments: Any = json.dumps(self.args())
                if rng.random() < 0.3:
                    arguments = self.args()
                message: dict[str, Any] = {
                    "role": "assistant",
                    "content": rng.choice([None, "", self.text()]),
                    "tool_calls": [
                        {
                            "id": cid,
                            "type": "function",
                            "function": {"name": "read_file", "arguments": arguments},
                        }
                    ],
                }
                if rng.random() < 0.5:
                    message["reasoning_content"] = self.text()
                return message
            if kind == "tool":
                return {"role": "tool", "tool_call_id": cid, "content": self.text()}
            return {"role": "developer", "content": self.text()}
        kind = rng.choice(["user", "assistant", "reasoning", "call", "output", "other"])
        if kind == "user":
            return {"type": "message", "role": "user", "content": self.text()}
        if kind == "assistant":
            part = {"type": "output_text", "text": self.text()}
            return {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{n:016x}",
                "content": [part],
            }
        if kind == "reasoning":
            summary = [{"type": "summary_text", "text": self.text()}]
            return {
                "type": "reasoning",
                "summary": summary,
                "content": None,
                "encrypted_content": "x",
            }
        if kind == "call":
            arguments = json.dumps(self.args()) if rng.random() < 0.7 else self.args()
            return {
                "type": "function_call",
                "call_id": cid,
                "name": "read_file",
                "arguments": arguments,
            }
        if kind == "output":
            return {"type": "function_call_output", "call_id": cid, "output": self.text()}
        return {"type": "web_search_call", "id": f"ws_{n}"}

    def step(self) -> str:
        """Change the history as a client may; say how."""
        rng, units = self.rng, self.units
        r = rng.random()
        if not units or r < 0.45:
            units.extend(self.new_unit() for _ in range(rng.randint(1, 3)))
            return "extend"
        if r < 0.55:
            del units[rng.randint(1, len(units)) :]
            return "truncate"
        if r < 0.65:
            units[rng.randrange(len(units))] = self.new_unit()
            return "edit"
        if r < 0.68:
            return "resend"
        if r < 0.72:
            self.ascii_only = not self.ascii_only
            self.separators = self.rng.choice([(",", ":"), (", ", ": ")])
            return "reserialise"
        if r < 0.8:
            # The same values, other bytes: a number's type, an object's key order.
            i = rng.randrange(len(units))
            units[i] = _retyped(units[i], rng)
            return "retype"
        if r < 0.85:
            self.head = rng.choice([None, SYSTEM, SYSTEM + " (changed)", ""])
            return "system"
        if r < 0.9:
            self.tools = rng.choice([None, [], self.tools, [_anthropic_tool()], [READ]])
            return "tools"
        if r < 0.95:
            del units[rng.randrange(len(units))]
            return "drop"
        units.insert(rng.randrange(len(units) + 1), self.new_unit())
        return "insert"

    def body(self, *, broken: bool = False) -> bytes:
        units = list(self.units)
        if broken:  # a unit no API takes: the request is refused, the memo must not change
            units.insert(self.rng.randrange(len(units) + 1), self.rng.choice([3, {"role": "x"}]))
        body: dict[str, Any] = {"model": "m", UNITS[self.api]: units, "stream": False}
        if self.head is not None:
            key = {"anthropic": "system", "chat": "x-unused", "responses": "instructions"}
            body[key[self.api]] = self.head
        if self.tools is not None:
            body["tools"] = self.tools
        return json.dumps(body, ensure_ascii=self.ascii_only, separators=self.separators).encode()


def _anthropic_tool() -> dict[str, Any]:
    return {"name": "read_file", "input_schema": READ["function"]["parameters"]}


def _retyped(value: Any, rng: random.Random) -> Any:
    """``value`` with the same JSON value in other bytes: a number's type changed (``1``,
    ``1.0``, ``true`` are equal in Python), else an object's keys reordered."""
    value = copy.deepcopy(value)

    def retype(node: Any) -> bool:
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(item, (int, float)) and item in (0, 1):
                    node[key] = rng.choice([c for c in (1, 1.0, True) if repr(c) != repr(item)])
                    return True
                if retype(item):
                    return True
        elif isinstance(node, list):
            return any(retype(item) for item in node)
        return False

    def reorder(node: Any) -> bool:
        if isinstance(node, dict) and len(node) > 1:
            items = list(node.items())
            node.clear()
            node.update(reversed(items))
            return True
        children = (
            node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        )
        return any(reorder(item) for item in children)

    if not retype(value):
        reorder(value)
    return value


@pytest.mark.parametrize("api", sorted(PARSERS))
@pytest.mark.parametrize("seed", range(6))
def test_parsing_with_the_memo_gives_exactly_what_parsing_without_does(api: str, seed: int) -> None:
    parse = PARSERS[api]
    history = _History(api, seed)
    memo = ParseMemo()
    previous: Conversation | None = None
    last_body = b""
    kinds: set[str] = set()
    resent = 0
    for _ in range(100):
        kinds.add(history.step())
        if history.rng.random() < 0.1:
            bad = history.body(broken=True)
            before = (memo.parsed, memo.reused, len(memo), memo.nbytes)
            assert outcome(parse, bad, memo) == outcome(parse, bad)
            assert isinstance(outcome(parse, bad), tuple)
            # A refused request: nothing counted, nothing kept (the memo's own parse failed).
            assert (memo.parsed, memo.reused, len(memo), memo.nbytes) == before
        body = history.body()
        plain = outcome(parse, body)
        got = outcome(parse, body, memo)
        if isinstance(plain, tuple):
            assert got == plain
            continue
        assert exact(got) == exact(plain)
        assert got == plain
        if previous is not None and body == last_body:
            # Resent unchanged: every message is the previous parse's own object (Responses:
            # but an assistant turn the input ends with, which the next item could extend).
            n = len(got.messages) - (api == "responses")
            assert all(a is b for a, b in zip(got.messages[:n], previous.messages, strict=False))
            resent += 1
        previous, last_body = got, body
    assert memo.reused > 0
    assert memo.parsed > 0
    assert {"extend", "edit", "truncate", "retype", "reserialise"} <= kinds
    assert resent > 0


def test_bodies_near_each_apis_shape_parse_alike_with_and_without_the_memo() -> None:
    # The gateway's fuzz bodies (junk fields, surrogates, wrong types) through one memo per
    # API: the same conversation or the same error, whatever the memo holds by then.
    bodies = _Bodies(seed=11)
    makers = {"anthropic": bodies.anthropic, "chat": bodies.chat, "responses": bodies.responses}
    for api, make in makers.items():
        memo = ParseMemo()
        refused = 0
        for _ in range(150):
            body = json.dumps(make()).encode()
            plain = outcome(PARSERS[api], body)
            got = outcome(PARSERS[api], body, memo)
            refused += isinstance(plain, tuple)
            assert (exact(got) if isinstance(got, Conversation) else got) == (
                exact(plain) if isinstance(plain, Conversation) else plain
            )
        assert 10 < refused < 140
        assert memo.reused > 0


# -- what is reused, what is not ---------------------------------------------------------------


def _bodies(api: str) -> tuple[list[Any], list[Any], Callable[[list[Any]], bytes]]:
    """A two-turn history of ``api`` (first request's units, the second's) and its body."""
    if api == "anthropic":
        first = [{"role": "user", "content": [{"type": "text", "text": TASK}]}]
        call = {"type": "tool_use", "id": "toolu_x", "name": "read_file", "input": {"path": "/a"}}
        second = [
            *first,
            {"role": "assistant", "content": [{"type": "text", "text": "Look."}, call]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_x", "content": "x = 1"},
                    {"type": "text", "text": "<system-reminder>go on</system-reminder>"},
                ],
            },
        ]
        tools = [_anthropic_tool()]

        def body(units: list[Any]) -> bytes:
            message = {"model": "m", "system": SYSTEM, "messages": units, "tools": tools}
            return json.dumps(message).encode()

    elif api == "chat":
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
        fn = {"name": "read_file", "arguments": '{"path": "/a"}'}
        second = [
            *first,
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_x", "function": fn}]},
            {"role": "tool", "tool_call_id": "call_x", "content": "x = 1"},
        ]

        def body(units: list[Any]) -> bytes:
            return json.dumps({"model": "m", "messages": units, "tools": [READ]}).encode()

    else:
        first = [
            {"type": "message", "role": "developer", "content": SYSTEM},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]},
        ]
        second = [
            *first,
            {"type": "reasoning", "summary": [], "content": None, "encrypted_content": "e"},
            {"type": "function_call", "call_id": "call_x", "name": "read_file", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_x", "output": "x = 1"},
        ]
        tool = {**READ["function"], "type": "function"}

        def body(units: list[Any]) -> bytes:
            return json.dumps({"model": "m", "input": units, "tools": [tool]}).encode()

    return first, second, body


@pytest.mark.parametrize("api", sorted(PARSERS))
def test_a_resent_history_gives_the_previous_requests_message_objects(api: str) -> None:
    parse = PARSERS[api]
    first, second, body = _bodies(api)
    memo = ParseMemo()
    one = parse(body(first), memo)
    assert (memo.parsed, memo.reused) == (len(first), 0)
    two = parse(body(second), memo)
    assert (memo.parsed, memo.reused) == (len(second), len(first))
    assert all(a is b for a, b in zip(one.messages, two.messages, strict=False))
    assert len(two.messages) > len(one.messages)
    three = parse(body(second), memo)
    assert all(a is b for a, b in zip(two.messages, three.messages, strict=True))
    assert three.tools == two.tools
    assert three.tools is not two.tools  # a list of its own
    assert exact(three) == exact(parse(body(second)))
    # Without a memo, nothing is shared.
    assert not any(
        a is b for a, b in zip(parse(body(second)).messages, three.messages, strict=True)
    )


@pytest.mark.parametrize("api", sorted(PARSERS))
def test_an_edited_message_is_parsed_again_never_taken_for_the_old_one(api: str) -> None:
    parse = PARSERS[api]
    _, units, body = _bodies(api)
    memo = ParseMemo()
    before = parse(body(units), memo)
    edited = copy.deepcopy(units)
    i = next(i for i, unit in enumerate(units) if "Check a.py" in json.dumps(unit))
    edited[i] = json.loads(json.dumps(edited[i]).replace("Check a.py", "Check b.py"))
    parsed, reused = memo.parsed, memo.reused
    after = parse(body(edited), memo)
    assert exact(after) == exact(parse(body(edited)))
    assert "Check b.py" in after.messages[1].content
    assert after.messages[0] is before.messages[0]
    assert after.messages[1] is not before.messages[1]
    if api == "responses":  # items merge into turns: parsed again from the edited one on
        assert (memo.parsed - parsed, memo.reused - reused) == (len(units) - i, i)
    else:  # the messages after it are themselves as before: still reused
        assert (memo.parsed - parsed, memo.reused - reused) == (1, len(units) - 1)
        assert after.messages[-1] is before.messages[-1]


def test_the_same_values_in_other_bytes_are_parsed_again() -> None:
    # JSON values equal in Python (1 == 1.0 == True, dicts in any key order) that a template
    # renders differently: the memo compares the JSON text, so it never mistakes them.
    memo = ParseMemo()
    call = {"id": "call_x", "function": {"name": "read_file", "arguments": {"a": 1, "b": 2}}}
    units: list[Any] = [
        {"role": "user", "content": TASK},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    body = json.dumps({"model": "m", "messages": units, "tools": [READ]}).encode()
    first = _chat.parse_request(body, memo)
    for arguments in ({"a": 1.0, "b": 2}, {"a": True, "b": 2}, {"b": 2, "a": 1}):
        call["function"]["arguments"] = arguments
        body = json.dumps({"model": "m", "messages": units, "tools": [READ]}).encode()
        got = _chat.parse_request(body, memo)
        assert got.messages[0] is first.messages[0]
        assert got.messages[1].tool_calls[0][2] == arguments
        assert list(got.messages[1].tool_calls[0][2]) == list(arguments)
        assert exact(got) == exact(_chat.parse_request(body))


def test_the_memo_keeps_the_messages_json_not_the_body() -> None:
    memo = ParseMemo()
    small = [{"role": "user", "content": f"message {i} " + "x" * 100} for i in range(20)]
    big = {"role": "user", "content": "y" * (2 * MEMO_COPY_BYTES)}
    body = bytearray(json.dumps({"model": "m", "messages": [*small, big]}).encode())
    refs = sys.getrefcount(body)
    conv = _chat.parse_request(body, memo)
    assert sys.getrefcount(body) == refs  # no view of the body is kept
    # The small messages' JSON, a digest for the big one.
    expected = sum(len(json.dumps(m)) for m in small)
    assert expected <= memo.nbytes < expected + 1000
    assert len(conv.messages[-1].content) == 2 * MEMO_COPY_BYTES
    # Resent: the big one is recognised by its digest.
    again = _chat.parse_request(bytes(body), memo)
    assert again.messages[-1] is conv.messages[-1]
    assert (memo.parsed, memo.reused) == (21, 21)
    memo.clear()
    assert (len(memo), memo.nbytes, memo.parsed) == (0, 0, 21)


def test_requests_of_other_kinds_keep_their_own_parse() -> None:
    # A CLI's side requests (a title, a summary: no tools) beside its main chain.
    memo = ParseMemo()
    main = [{"role": "user", "content": TASK}]
    side = [{"role": "user", "content": "Give this conversation a title."}]
    for turn in range(4):
        main.append({"role": "assistant", "content": f"step {turn}"})
        main.append({"role": "user", "content": f"result {turn}"})
        side.append({"role": "user", "content": f"and {turn}"})
        reused = memo.reused
        _chat.parse_request(json.dumps({"messages": main, "tools": [READ]}).encode(), memo)
        assert memo.reused - reused == (len(main) - 2 if turn else 0)
        reused = memo.reused
        _chat.parse_request(json.dumps({"messages": side}).encode(), memo)
        assert memo.reused - reused == (len(side) - 1 if turn else 0)
    assert len(memo) == 2
    # A third kind evicts the least recent.
    _anthropic.parse_request(json.dumps({"messages": side}).encode(), memo)
    assert len(memo) == 2
    reused = memo.reused
    _chat.parse_request(json.dumps({"messages": main, "tools": [READ]}).encode(), memo)
    assert memo.reused == reused  # the chain's was the least recent: gone


# -- over HTTP: a CLI against the gateway -----------------------------------------------------


async def test_a_resent_history_is_parsed_once_and_matched_by_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[int] = []
    same_message = _session._same_message

    def counting(ours: Any, theirs: Any) -> bool:
        compared.append(1)
        return same_message(ours, theirs)

    monkeypatch.setattr(_session, "_same_message", counting)
    call = tool_call_text("read_file", {"path": "/testbed/a.py"})
    async with gateway({"http-1": [call] * 6}) as (gw, client, _):
        session = gw.open_session("ep-memo")
        headers = {"x-api-key": session.api_key}
        tools = [_anthropic_tool()]
        messages: list[Any] = [{"role": "user", "content": TASK}]
        for turn in range(6):
            body = {"model": "m", "max_tokens": 256, "system": SYSTEM, "messages": messages}
            compared.clear()
            r = await client.post("/v1/messages", json={**body, "tools": tools}, headers=headers)
            assert r.status_code == 200, r.text
            stats = session.statistics()
            # Each request parses its two new messages; the rest is the previous parse.
            assert stats.parsed_messages == 1 + 2 * turn
            assert stats.reused_messages == turn * turn
            # The resent messages are the transcript's own objects: only our last reply, as
            # the client replays it, is compared.
            assert len(compared) == (1 if turn else 0)
            content = r.json()["content"]
            use = next(b for b in content if b["type"] == "tool_use")
            messages.append({"role": "assistant", "content": content})
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}],
                }
            )
        stats = session.statistics()
        assert (stats.chains, stats.turns, stats.appended, stats.forks) == (1, 6, 5, 0)
        # count_tokens reads the memo, and leaves it as it was.
        r = await client.post(
            "/v1/messages/count_tokens",
            json={"model": "m", "system": SYSTEM, "messages": messages[:-2], "tools": tools},
            headers=headers,
        )
        assert r.status_code == 200, r.text
        after = session.statistics()
        assert after.reused_messages - stats.reused_messages == len(messages) - 2
        memo = session.session.parse_memo
        assert len(memo) == 1
        assert memo.nbytes > 0
        session.finish()
        assert (len(memo), memo.nbytes) == (0, 0)  # dropped with the session
        assert session.statistics().reused_messages == after.reused_messages


async def test_an_edited_history_is_parsed_again_and_forks_as_before() -> None:
    script = [tool_call_text("read_file", {"path": f"/testbed/{n}.py"}) for n in "abc"]
    async with gateway({"http-1": script}) as (gw, client, _):
        session = gw.open_session("ep-memo-edit", sampling_params={"max_new_tokens": 256})
        auth = {"authorization": f"Bearer {session.api_key}"}
        first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]

        async def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
            body = {"model": "m", "messages": messages, "tools": [READ]}
            r = await client.post("/v1/chat/completions", json=body, headers=auth)
            assert r.status_code == 200, r.text
            message: dict[str, Any] = r.json()["choices"][0]["message"]
            return message

        a1 = await ask(first)
        r1 = {"role": "tool", "tool_call_id": a1["tool_calls"][0]["id"], "content": "x = 1"}
        a2 = await ask([*first, a1, r1])
        r2 = {"role": "tool", "tool_call_id": a2["tool_calls"][0]["id"], "content": "y = 2"}
        before = session.statistics()
        # The client rewrites the first tool result: parsed again, the session branches off
        # our first reply, and the new chain renders the rewritten result.
        edited = {**r1, "content": "x = 100"}
        await ask([*first, a1, edited, a2, r2])
        stats = session.statistics()
        assert stats.parsed_messages - before.parsed_messages == 3  # edited, a2, r2
        assert stats.reused_messages - before.reused_messages == 3  # system, user, a1
        assert (stats.chains, stats.forks, stats.turns, stats.appended) == (2, 1, 3, 1)
        chain = session.conversations()[1]
        assert {"role": "tool", "content": "x = 100", "tool_call_id": r1["tool_call_id"]} in chain
        assert not any(m.get("content") == "x = 1" for m in chain)


async def test_side_requests_beside_the_chain_keep_both_parses() -> None:
    call = tool_call_text("read_file", {"path": "/testbed/a.py"})
    async with gateway({"http-1": [call] * 4}) as (gw, client, _):
        session = gw.open_session("ep-memo-side")
        auth = {"authorization": f"Bearer {session.api_key}"}
        messages: list[Any] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": TASK},
        ]
        title: list[Any] = [{"role": "user", "content": "Title this conversation."}]
        for turn in range(4):
            reused = session.statistics().reused_messages
            body = {"model": "m", "messages": messages, "tools": [READ]}
            r = await client.post("/v1/chat/completions", json=body, headers=auth)
            assert r.status_code == 200, r.text
            assert session.statistics().reused_messages - reused == (
                len(messages) - 2 if turn else 0
            )
            reply = r.json()["choices"][0]["message"]
            reused = session.statistics().reused_messages
            r = await client.post("/v1/chat/completions", json={"messages": title}, headers=auth)
            assert r.status_code == 200, r.text
            assert session.statistics().reused_messages - reused == (len(title) - 1 if turn else 0)
            title.append({"role": "user", "content": f"Again ({turn})."})
            call_id = reply["tool_calls"][0]["id"]
            messages += [reply, {"role": "tool", "tool_call_id": call_id, "content": "ok"}]
        stats = session.statistics()
        assert (stats.chains, stats.turns, stats.appended, stats.side_turns) == (5, 4, 3, 4)
