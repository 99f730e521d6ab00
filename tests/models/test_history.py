"""Append-only token histories with Qwen3's real template: golden tests against
``apply_chat_template`` for the whole conversation, the traps, and a property test."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_swe import SampleBuilder, TurnRecord
from trio_swe.models import ChatModel, NotAppendOnlyError, ParsedOutput, ToolCall

SYSTEM = {"role": "system", "content": "You are a careful engineer. Work in /testbed."}
USER = {"role": "user", "content": "Instance: demo-1\n\nadd() subtracts <b>& fails</b>."}


def assistant(
    reasoning: str | None, *calls: tuple[str, dict[str, Any]], content: str = ""
) -> dict[str, Any]:
    return ParsedOutput(
        text="",
        reasoning=reasoning,
        content=content,
        tool_calls=tuple(ToolCall(n, a) for n, a in calls),
    ).message()


def golden(model: ChatModel, conversation: list[dict[str, Any]]) -> list[int]:
    ids = model.tokenizer.apply_chat_template(
        conversation, tools=model.tools, tokenize=True, add_generation_prompt=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def play(
    model: ChatModel, turns: list[tuple[dict[str, Any], list[dict[str, Any]]]]
) -> tuple[Any, list[TurnRecord], list[dict[str, Any]]]:
    """Run a conversation as the agent does: the model 'samples' the template's own text of
    each assistant message; the tool results are appended as deltas."""
    history = model.start([SYSTEM, USER])
    records: list[TurnRecord] = []
    conversation: list[dict[str, Any]] = [SYSTEM, USER]
    for message, results in turns:
        output = model.encode(model.assistant_text(message))
        records.append(
            TurnRecord.from_lists(
                prompt_ids=history.ids,
                output_ids=output,
                output_log_probs=[-(i % 7 + 1) / 10 for i in range(len(output))],
            )
        )
        history.append_output(output)
        history.append_messages(results)
        conversation += [message, *results]
    return history, records, conversation


def test_whole_tool_conversation_equals_apply_chat_template(qwen3: ChatModel) -> None:
    turns = [
        (
            assistant("Look at the code first.", ("bash", {"command": "cat calc.py"})),
            [{"role": "tool", "content": "def add(a, b):\n    return a - b\n"}],
        ),
        (
            assistant(
                "Two calls at once.",
                ("bash", {"command": "grep -n add *.py"}),
                ("bash", {"command": "ls"}),
            ),
            [
                {"role": "tool", "content": "calc.py:1:def add"},
                {"role": "tool", "content": "calc.py\ntest_calc.py"},
            ],
        ),
        (
            assistant(
                "Fix it; ünïcödé → ok.",
                ("edit_file", {"path": "calc.py", "old_text": "a - b", "new_text": "a + b"}),
                content="Editing now.",
            ),
            [{"role": "tool", "content": "edited calc.py"}],
        ),
        (
            assistant("Run the tests.", ("bash", {"command": "python3 -m pytest -q\n"})),
            [{"role": "tool", "content": "1 passed\n\n"}],
        ),
    ]
    history, _, conversation = play(qwen3, turns)
    assert list(history.ids) == golden(qwen3, conversation)
    # The separator after each <|im_end|> is the template's "\n" (id 198), never lost.
    ids = list(history.ids)
    ends = [i for i, t in enumerate(ids) if t == 151645]
    assert ends
    assert all(ids[i + 1] == 198 for i in ends)
    stats = history.statistics()
    assert (stats.turns, stats.deltas, stats.rewritten_turns) == (4, 4, 0)


def test_samples_train_exactly_the_sampled_ids(qwen3: ChatModel) -> None:
    turns = [
        (assistant("a", ("bash", {"command": "ls"})), [{"role": "tool", "content": "x"}]),
        (assistant("b", ("bash", {"command": "submit"})), [{"role": "tool", "content": "y"}]),
    ]
    _history, records, _ = play(qwen3, turns)
    builder = SampleBuilder(append_only=True)
    for r in records:
        builder.add(r)
    (sample,) = builder.finish(reward=1.0)
    tokens, mask, lps = (
        sample.tokens_list(),
        sample.loss_mask_list(),
        sample.rollout_log_probs_list(),
    )
    start = sample.prompt_length
    assert tokens[:start] == list(records[0].prompt_ids)
    # Every trained token is a sampled one at its own place, with its own log-prob; every
    # untrained token of the response region is the template's rendering of a tool result.
    pos = start
    for k, r in enumerate(records):
        out = list(r.output_ids)
        assert tokens[pos : pos + len(out)] == out
        assert mask[pos - start : pos - start + len(out)] == [1] * len(out)
        assert lps[pos - start : pos - start + len(out)] == pytest.approx(
            list(r.output_log_probs or [])
        )
        pos += len(out)
        nxt = len(records[k + 1].prompt_ids) if k + 1 < len(records) else pos
        assert mask[pos - start : nxt - start] == [0] * (nxt - pos)
        assert "<tool_response>" in qwen3.decode(tokens[pos:nxt]) or k + 1 == len(records)
        pos = nxt
    assert sample.num_trained_tokens() == sum(len(r.output_ids) for r in records)


def test_ill_formed_turn_kept_as_sampled_and_masked(qwen3: ChatModel) -> None:
    history = qwen3.start([SYSTEM, USER])
    bad = qwen3.encode(
        '<think>\nhmm\n</think>\n\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call><|im_end|>'
    )
    r1 = TurnRecord.from_lists(
        prompt_ids=history.ids, output_ids=bad, output_log_probs=[-0.5] * len(bad), ill_formed=True
    )
    parsed = history.append_output(bad)
    assert parsed.ill_formed
    assert "not valid JSON" in parsed.error
    history.append_messages([{"role": "tool", "content": f"error: {parsed.error}"}])
    assert list(history.ids[len(r1.prompt_ids) : len(r1.prompt_ids) + len(bad)]) == bad
    good = qwen3.encode(qwen3.assistant_text(assistant("retry", ("bash", {"command": "ls"}))))
    r2 = TurnRecord.from_lists(
        prompt_ids=history.ids, output_ids=good, output_log_probs=[-0.25] * len(good)
    )
    builder = SampleBuilder(append_only=True, ill_formed_policy="mask")
    builder.add(r1)
    builder.add(r2)
    (sample,) = builder.finish(reward=0.0)
    mask = sample.loss_mask_list()
    assert mask[: len(bad)] == [0] * len(bad)
    assert mask[-len(good) :] == [1] * len(good)
    assert sample.tokens_list()[-len(good) :] == good  # nothing shifted
    assert sample.rollout_log_probs_list()[-len(good) :] == [-0.25] * len(good)


def test_new_user_message_breaks_the_prefix_fork_not_fake(qwen3: ChatModel) -> None:
    history, _, conversation = play(
        qwen3,
        [
            (
                assistant("deep thoughts", ("bash", {"command": "ls"})),
                [{"role": "tool", "content": "a"}],
            )
        ],
    )
    history.append_output(
        qwen3.encode(qwen3.assistant_text(assistant("more", ("bash", {"command": "pwd"}))))
    )
    before = list(history.ids)
    follow_up = {"role": "user", "content": "Also fix mul()."}
    with pytest.raises(NotAppendOnlyError, match="fork"):
        history.append_messages([follow_up])
    assert list(history.ids) == before  # nothing appended
    forked = history.fork([follow_up])
    whole = golden(qwen3, [*conversation, history.messages[-1], follow_up])
    assert list(forked.ids) == whole
    # The template dropped the earlier reasoning: the fork is not an extension of the history.
    assert whole[: len(before)] != before
    assert "deep thoughts" not in qwen3.decode(whole)


def test_empty_reasoning_is_kept_as_sampled(qwen3: ChatModel) -> None:
    # Qwen3 renders "<think>\n\n</think>\n\n" on the last assistant turn only: the sampled
    # tokens stay, the delta is still the template's, the rewrite is counted.
    history = qwen3.start([SYSTEM, USER])
    out = qwen3.encode(qwen3.assistant_text(assistant("", ("bash", {"command": "ls"}))))
    assert qwen3.decode(out).startswith("<think>\n\n</think>\n\n")
    history.append_output(out)
    delta = history.append_messages([{"role": "tool", "content": "a"}])
    assert (
        qwen3.decode(delta)
        == "\n<|im_start|>user\n<tool_response>\na\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert history.statistics().rewritten_turns == 1


def test_truncated_output_gets_the_turn_end(qwen3: ChatModel) -> None:
    history = qwen3.start([SYSTEM, USER])
    out = qwen3.encode("<think>\ncut sh")  # finish_reason "length": no <|im_end|>
    parsed = history.append_output(out)
    assert parsed.ill_formed
    delta = history.append_messages([{"role": "tool", "content": "error"}])
    assert delta[:2] == [151645, 198]


def test_out_of_vocabulary_ids_refused(qwen3: ChatModel) -> None:
    from trio_swe import InvalidArgumentError

    history = qwen3.start([SYSTEM, USER])
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        history.append_output([1000, 151936])
    assert len(history.ids) == history.prompt_length


_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=40
)
_command = _text.filter(lambda s: s.strip() != "")
_turn = st.tuples(
    _text.map(lambda s: s.strip("\n") or "r"),  # Qwen3 keeps non-empty reasoning in history
    st.lists(_command, min_size=1, max_size=3),
    st.lists(_text, min_size=1, max_size=3),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(script=st.lists(_turn, min_size=1, max_size=5))
def test_property_prompt_k1_extends_prompt_k_and_output_k(
    qwen3: ChatModel, script: list[Any]
) -> None:
    history = qwen3.start([SYSTEM, USER])
    conversation: list[dict[str, Any]] = [SYSTEM, USER]
    for reasoning, commands, outputs in script:
        message = assistant(reasoning, *(("bash", {"command": c}) for c in commands))
        prompt_k = list(history.ids)
        output_k = qwen3.encode(qwen3.assistant_text(message))
        history.append_output(output_k)
        results = [{"role": "tool", "content": o} for o in outputs[: len(commands)]]
        history.append_messages(results)
        assert list(history.ids[: len(prompt_k) + len(output_k)]) == prompt_k + output_k
        conversation += [message, *results]
    assert list(history.ids) == golden(qwen3, conversation)


def test_copy_is_independent(qwen3: ChatModel) -> None:
    history = qwen3.start([SYSTEM, USER])
    message = assistant(None, ("bash", {"command": "ls"}))
    history.append_output(qwen3.encode(qwen3.assistant_text(message)))
    before = history.ids.tolist()
    trial = history.copy()
    trial.append_messages([{"role": "tool", "content": "a.py"}])
    assert history.ids.tolist() == before  # the original awaits its delta, untouched
    assert trial.ids.tolist()[: len(before)] == before
    assert len(trial.messages) == len(history.messages) + 1
    history.append_messages([{"role": "tool", "content": "a.py"}])  # still usable
    assert history.ids.tolist() == trial.ids.tolist()
