"""The session's records, sans-IO: one TurnRecorder per chain, each record made at commit.

Driven directly (place/build/draft/commit, as the server calls them) on Qwen3's tokenizer:
every record equals ``TurnRecord.from_lists`` of the prompt and output the history held, a
draft never committed changes nothing, and concurrent requests on one chain branch with a
recorder of their own.
"""

from __future__ import annotations

import json
from typing import Any

from trio_swe import TurnRecord
from trio_swe.demo._cli_scripts import tool_call_text
from trio_swe.gateway import Session
from trio_swe.gateway._chat import parse_request
from trio_swe.gateway._session import Pending
from trio_swe.models import ChatModel
from trio_swe.policy import PolicyOutput

from ._support import qwen3_tokenizer, sampled_ids

READ = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
}
FIRST = [{"role": "system", "content": "You are a test agent."}, {"role": "user", "content": "Go."}]


def session() -> Session:
    models: dict[str, ChatModel] = {}

    def model_for(tools: Any) -> ChatModel:
        key = json.dumps(tools, sort_keys=True)
        if key not in models:
            models[key] = ChatModel(qwen3_tokenizer(), tools=tools)
        return models[key]

    return Session("ep-session", model_for=model_for)


def prepare(s: Session, messages: list[dict[str, Any]]) -> Pending:
    body = json.dumps({"model": "m", "messages": messages, "tools": [READ]}).encode()
    return s.prepare(parse_request(body))


def output(text: str) -> PolicyOutput:
    ids = sampled_ids(text)
    return PolicyOutput(output_ids=ids, log_probs=[-0.25] * len(ids), finish_reason="stop")


def answer(s: Session, pending: Pending, text: str) -> tuple[dict[str, Any], TurnRecord]:
    """Draft and commit; the reply as the client replays it and the expected record."""
    prompt = list(pending.history.ids)
    out = output(text)
    draft = s.draft(pending, out)
    s.commit(draft)
    expected = TurnRecord.from_lists(
        prompt_ids=prompt, output_ids=out.output_ids, output_log_probs=out.log_probs
    )
    calls = [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in draft.reply.tool_calls
    ]
    reply: dict[str, Any] = {"role": "assistant", "content": draft.reply.text}
    if calls:
        reply["tool_calls"] = calls
    return reply, expected


def tool_result(reply: dict[str, Any], content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": content}


def test_a_chain_records_through_one_recorder_and_drafts_not_committed_change_nothing() -> None:
    s = session()
    call = tool_call_text("read_file", {"path": "/testbed/a.py"})
    r1, e1 = answer(s, prepare(s, FIRST), call)
    history = [*FIRST, r1, tool_result(r1, "x = 1\n" * 50)]
    # A draft whose reply never reached the client: not recorded, the recorder untouched.
    lost = prepare(s, history)
    s.draft(lost, output("lost"))
    s.abandon(lost)
    r2, e2 = answer(s, prepare(s, history), call)
    _, e3 = answer(s, prepare(s, [*history, r2, tool_result(r2, "y = 2\n")]), "Done.")
    assert s.turns() == [e1, e2, e3]
    stats = s.statistics()
    assert (stats.chains, stats.turns, stats.appended, stats.failed) == (1, 3, 2, 1)
    rec = s._chains[0].recorder.statistics()
    assert (rec.turns, rec.extended, rec.restarted) == (3, 2, 0)
    # Each token copied once: the last prompt and its output, not the sum of the prompts.
    assert rec.converted_tokens == len(e3.prompt_ids) + len(e3.output_ids)
    assert {id(t.prompt_ids.obj) for t in s.turns()} == {id(s.turns()[0].prompt_ids.obj)}


def test_concurrent_requests_on_one_chain_branch_with_their_own_recorder() -> None:
    s = session()
    call = tool_call_text("read_file", {"path": "/testbed/a.py"})
    r1, e1 = answer(s, prepare(s, FIRST), call)
    history = [*FIRST, r1, tool_result(r1, "x = 1\n")]
    a, b = prepare(s, history), prepare(s, [*history])  # both on the chain's tip
    _, ea = answer(s, a, "First.")
    _, eb = answer(s, b, "Second.")  # the chain moved on: b branches off it
    assert s.turns() == [e1, ea, eb]
    stats = s.statistics()
    assert (stats.chains, stats.forks, stats.turns) == (2, 1, 3)
    first, second = s._chains
    assert first.recorder is not second.recorder
    assert second.recorder.statistics().turns == 1


def test_an_overflowing_request_is_recorded_on_its_chain() -> None:
    s = Session(
        "ep-overflow",
        model_for=lambda tools: ChatModel(qwen3_tokenizer(), tools=tools),
        max_context_tokens=400,
    )
    call = tool_call_text("read_file", {"path": "/testbed/a.py"})
    r1, e1 = answer(s, prepare(s, FIRST), call)
    big = prepare(s, [*FIRST, r1, tool_result(r1, "line\n" * 400)])
    assert big.overflow
    s.record_overflow(big)
    expected = TurnRecord.from_lists(
        prompt_ids=list(big.history.ids), output_ids=[], finish_reason="length"
    )
    assert s.turns() == [e1, expected]
    assert s._chains[0].recorder.statistics().extended == 1


def test_a_prompt_over_the_cap_is_refused_before_it_is_tokenized_whole() -> None:
    s = Session(
        "ep-cap",
        model_for=lambda tools: ChatModel(qwen3_tokenizer(), tools=tools),
        max_context_tokens=2048,
    )
    # A first prompt far over the cap: an overflow with a lower bound, nothing to record.
    huge = [FIRST[0], {"role": "user", "content": "word " * 200_000}]
    pending = prepare(s, huge)
    assert pending.overflow
    assert pending.overflow_tokens > 2047
    assert pending.history is None
    s.record_overflow(pending)
    assert (s.turns(), s.statistics().overflows, s.statistics().rendered_tokens) == ([], 1, 0)
    # A continuation over it: recorded on its chain, its prompt the chain's tokens so far.
    call = tool_call_text("read_file", {"path": "/testbed/a.py"})
    r1, e1 = answer(s, prepare(s, FIRST), call)
    held = list(s._chains[0].history.ids)
    pending = prepare(s, [*FIRST, r1, tool_result(r1, "word " * 100_000)])
    assert pending.overflow
    assert pending.overflow_tokens > 2047
    s.record_overflow(pending)
    expected = TurnRecord.from_lists(prompt_ids=held, output_ids=[], finish_reason="length")
    assert s.turns() == [e1, expected]
    assert s.statistics().delta_tokens == 0  # nothing of the 500 KB delta was appended
