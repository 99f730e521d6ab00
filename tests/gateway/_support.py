"""Helpers of the gateway tests: the Qwen3 tokenizer, a scripted policy speaking it, and the
checks that a CLI episode's samples are token-exact."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from trio_swe import Sample, TurnRecord
from trio_swe.demo import ScriptedCompletion, open_scripted_policy_server, scripted_logprob
from trio_swe.demo._policy_server import ScriptedPolicyServer
from trio_swe.models import load_tokenizer
from trio_swe.policy import RawTextTokenizer, SGLangPolicy

from ..qwen3 import qwen3_dir

END = "<|im_end|>"
#: The script key in a CLI's prompt (opencode quotes the prompt, so no anchors).
KEY_PATTERN = r"Instance: ([\w.\-]+)"


def qwen3_tokenizer() -> Any:
    return load_tokenizer(qwen3_dir())


@asynccontextmanager
async def scripted_policy(
    scripts: Mapping[str, Sequence[str | ScriptedCompletion]],
    *,
    incremental_streaming: bool = False,
) -> AsyncIterator[tuple[ScriptedPolicyServer, SGLangPolicy]]:
    """The scripted policy server on the Qwen3 tokenizer, and a client of it."""
    async with (
        open_scripted_policy_server(
            scripts,
            tokenizer=RawTextTokenizer(qwen3_tokenizer()),
            key_pattern=KEY_PATTERN,
            incremental_streaming=incremental_streaming,
        ) as server,
        SGLangPolicy(server.url) as policy,
    ):
        yield server, policy


def sampled_ids(text: str) -> list[int]:
    """The ids the scripted server samples for a completion text (stop token appended)."""
    return list(qwen3_tokenizer().encode(text + END, add_special_tokens=False))


def assert_token_exact(
    sample: Sample,
    turns: Sequence[TurnRecord],
    outputs: Sequence[str],
    conversation: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> None:
    """The sample is the chain of ``turns``, and:

    * each turn's output is exactly the ids the scripted policy sampled for ``outputs[k]``;
    * the response region is output 0 + delta 0 + output 1 + ... with each delta the template's
      rendering of the client's new messages: the last prompt equals Qwen3's own
      ``apply_chat_template`` of the whole conversation;
    * loss 1 exactly on sampled ids, each with the server's log-prob for it; 0.0 elsewhere.
    """
    tok = qwen3_tokenizer()
    assert len(turns) == len(outputs)
    for turn, text in zip(turns, outputs, strict=True):
        assert turn.output_ids_list() == sampled_ids(text)
    tokens = sample.tokens_list()
    prompt0 = turns[0].prompt_ids_list()
    assert tokens[: len(prompt0)] == prompt0
    region = tokens[len(prompt0) :]
    assert len(region) == sample.response_length
    expected_mask: list[int] = []
    expected_lp: list[float] = []
    pos = len(prompt0)
    for k, turn in enumerate(turns):
        out = turn.output_ids_list()
        assert tokens[pos : pos + len(out)] == out
        expected_mask += [1] * len(out)
        expected_lp += [scripted_logprob(t, i) for i, t in enumerate(out)]
        pos += len(out)
        if k + 1 < len(turns):
            nxt = turns[k + 1].prompt_ids_list()
            assert nxt[:pos] == tokens[:pos]  # append-only: the next prompt extends this one
            delta = nxt[pos:]
            assert tokens[pos : pos + len(delta)] == delta
            expected_mask += [0] * len(delta)
            expected_lp += [0.0] * len(delta)
            pos += len(delta)
    assert pos == len(tokens)
    assert sample.loss_mask_list() == expected_mask
    lps = sample.rollout_log_probs_list()
    assert all(abs(a - b) < 1e-6 for a, b in zip(lps, expected_lp, strict=True))
    # The deltas are the template's own rendering: the last prompt is what Qwen3's
    # apply_chat_template gives for the whole conversation before the last reply.
    golden = tok.apply_chat_template(
        conversation[:-1], tools=tools, tokenize=True, add_generation_prompt=True
    )
    golden = list(golden["input_ids"] if hasattr(golden, "keys") else golden)
    assert turns[-1].prompt_ids_list() == golden


class WatchedTokenizer:
    """Qwen3's tokenizer, counting what it encodes, and holding any encode of a text that
    holds ``marker`` until ``release`` is set (``held`` is set then): a test sees a request
    *while* it tokenizes, by ordering, not by timing. Everything else is the tokenizer's."""

    def __init__(self, marker: str = "\x00never\x00") -> None:
        self._inner = qwen3_tokenizer()
        self.marker = marker
        self.encoded_chars = 0
        self.encodes = 0
        self.held = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __len__(self) -> int:
        return len(self._inner)

    def encode(self, text: str, **kwargs: Any) -> Any:
        with self._lock:
            self.encoded_chars += len(text)
            self.encodes += 1
        if self.marker in text:
            self.held.set()
            if not self.release.wait(300):  # a hang guard: the test releases it
                raise RuntimeError("WatchedTokenizer: never released")
        return self._inner.encode(text, **kwargs)
