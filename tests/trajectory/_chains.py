"""Test support: a plain-list reference of the builder's rules, hypothesis strategies for chains
of turns and for samples, and a golden renderer."""

from __future__ import annotations

import array
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from trio_swe import Sample, TurnRecord


def f32(x: float) -> float:
    """``x`` rounded to float32, as the records store it."""
    return array.array("f", [x])[0]


# --- reference implementation: the rules of the module docstring, on Python lists ------------


@dataclass
class RefSegment:
    tokens: list[int]
    prompt_len: int
    mask: list[int] = field(default_factory=list)  # response region
    log_probs: list[float] = field(default_factory=list)  # response region
    last_response_start: int = 0
    kinds: list[str] = field(default_factory=list)
    finish_reason: str = ""


def ref_build(
    turns: list[TurnRecord],
    *,
    ill_formed_policy: str = "mask",
    missing_log_probs: str = "error",
    fork_threshold_tokens: int = 1024,
    append_only: bool = False,
) -> list[RefSegment]:
    """Independent, obviously-slow reimplementation of SampleBuilder's placement rules.

    Raises ValueError where the real builder raises InvalidArgumentError.
    """
    segments: list[RefSegment] = []
    for i, turn in enumerate(turns):
        prompt, out = turn.prompt_ids_list(), turn.output_ids_list()
        lps = turn.output_log_probs_list()
        trained = not (turn.ill_formed and ill_formed_policy == "mask")
        if trained and lps is None and out:
            if missing_log_probs == "error":
                raise ValueError(f"turn {i} has no log-probs")
            trained = False
        seg = segments[-1] if segments else None
        if seg is None:
            kind = "start"
        else:
            lcp = 0
            while lcp < min(len(seg.tokens), len(prompt)) and seg.tokens[lcp] == prompt[lcp]:
                lcp += 1
            if lcp == len(seg.tokens):
                kind = "clean"
            elif lcp >= seg.last_response_start and len(out) < fork_threshold_tokens:
                kind = "realign"
            else:
                kind = "fork"
            if append_only and kind != "clean":
                raise ValueError(f"turn {i} is not append-only")
        if kind in ("start", "fork"):
            seg = RefSegment(tokens=list(prompt), prompt_len=len(prompt))
            segments.append(seg)
        else:
            assert seg is not None
            if kind == "realign":
                r = lcp - seg.prompt_len
                del seg.tokens[lcp:], seg.mask[r:], seg.log_probs[r:]
            new = prompt[len(seg.tokens) :]
            seg.tokens += new
            seg.mask += [0] * len(new)
            seg.log_probs += [0.0] * len(new)
        seg.last_response_start = len(seg.tokens)
        seg.tokens += out
        seg.mask += [1 if trained else 0] * len(out)
        seg.log_probs += [f32(x) for x in lps] if lps is not None else [0.0] * len(out)
        seg.kinds.append(kind)
        seg.finish_reason = turn.finish_reason
    return segments


# --- strategies -------------------------------------------------------------------------------

# A tiny alphabet makes accidental common prefixes, empty diffs and edge cases frequent.
token_ids = st.integers(min_value=0, max_value=5)
log_probs = st.floats(min_value=-30.0, max_value=0.0, width=32)


@st.composite
def chains(draw: st.DrawFn, max_turns: int = 7) -> list[TurnRecord]:
    """A chain of turns whose prompts mostly extend the previous prompt+output (clean), and
    sometimes rewrite a token in the last response (realign), earlier (fork), cut the history,
    or start over."""
    turns: list[TurnRecord] = []
    history: list[int] = draw(st.lists(token_ids, max_size=6))
    last_out_start = len(history)
    for _ in range(draw(st.integers(min_value=1, max_value=max_turns))):
        edit = draw(
            st.sampled_from(
                ["none", "none", "none", "response", "response", "anywhere", "cut", "new"]
            )
        )
        if edit == "response" and last_out_start < len(history):
            j = draw(st.integers(min_value=last_out_start, max_value=len(history) - 1))
            history[j] = draw(token_ids)
        elif edit == "anywhere" and history:
            j = draw(st.integers(min_value=0, max_value=len(history) - 1))
            history[j] = draw(token_ids)
        elif edit == "cut" and history:
            del history[draw(st.integers(min_value=0, max_value=len(history) - 1)) :]
        elif edit == "new":
            history = draw(st.lists(token_ids, max_size=6))
        prompt = history + draw(st.lists(token_ids, max_size=4))
        out = draw(st.lists(token_ids, max_size=5))
        lps = None
        if draw(st.integers(min_value=0, max_value=5)):  # mostly present
            lps = draw(st.lists(log_probs, min_size=len(out), max_size=len(out)))
        turns.append(
            TurnRecord.from_lists(
                prompt_ids=prompt,
                output_ids=out,
                output_log_probs=lps,
                finish_reason=draw(st.sampled_from(["stop", "stop", "length", "abort"])),
                ill_formed=draw(st.booleans()),
            )
        )
        last_out_start = len(prompt)
        history = prompt + out
    return turns


metadata_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def samples(draw: st.DrawFn, *, finite: bool = True) -> Sample:
    """Any valid sample (token ids over the whole int32 range)."""
    tokens = draw(st.lists(st.integers(0, 2**31 - 1), max_size=40))
    rl = draw(st.integers(min_value=0, max_value=len(tokens)))
    lp = st.floats(width=32, allow_nan=not finite, allow_infinity=not finite)
    return Sample.from_lists(
        tokens=tokens,
        loss_mask=draw(st.lists(st.integers(0, 1), min_size=rl, max_size=rl)),
        rollout_log_probs=draw(st.lists(lp, min_size=rl, max_size=rl)),
        response_length=rl,
        reward=draw(st.floats(allow_nan=False, allow_infinity=False)),
        status=draw(st.sampled_from(["completed", "truncated", "aborted"])),
        metadata=draw(st.dictionaries(st.text(max_size=6), metadata_values, max_size=3)),
    )


# --- golden rendering -------------------------------------------------------------------------


def golden(sample: Sample, names: dict[int, str]) -> str:
    """``prompt | response`` with each token by name and trained tokens in brackets."""
    toks = [names.get(t, str(t)) for t in sample.tokens_list()]
    p = sample.prompt_length
    mask = sample.loss_mask_list()
    resp = [f"[{t}]" if m else t for t, m in zip(toks[p:], mask, strict=True)]
    return " ".join([*toks[:p], "|", *resp])


def slime_like(sample: Sample) -> dict[str, Any]:
    """What slime's ``Sample.to_dict()`` would hold for our fields plus a few of its own."""
    d = sample.to_slime_dict()
    d.update(index=3, group_index=1, rollout_id=3, prompt="", label=None, session_id="s")
    return d
