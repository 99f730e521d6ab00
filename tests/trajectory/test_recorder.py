"""TurnRecorder: records over one append-only history equal TurnRecord.from_lists, always.

Properties over random chains of turns in every input form (lists sharing the previous
prompt's int objects, fresh lists, tuples, arrays, numpy, views), with re-rendered prompts
(realign and fork), cut and fresh histories, and samples built from them (truncated at random
limits) compared with samples built from plain ``from_lists`` records and with the plain-list
reference builder of ``_chains``.
"""

from __future__ import annotations

import array
import enum
import random
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_swe import (
    InvalidArgumentError,
    Sample,
    SampleBuilder,
    TurnRecord,
    TurnRecorder,
    decode_sample,
    encode_sample,
)
from trio_swe.trajectory import _buffers, _recorder

from ._chains import f32, ref_build

# Small values (cached int objects), one- to four-byte values, int32 extremes (a negative id
# takes the struct path; its uint32 alias 2**32 - x is out of range).
IDS = [0, 1, 2, 300, 301, 70_000, 2**31 - 1, -1, -(2**31)]
token_ids = st.sampled_from(IDS)
FORMS = ["extend", "extend", "fresh", "fresh", "tuple", "array", "numpy64", "bytes_view"]


def fresh(ids: list[int]) -> list[int]:
    """Equal values in new int objects (as a JSON decoder returns them)."""
    return [int(str(x)) for x in ids]


def in_form(ids: list[int], objects: list[int], form: str) -> Any:
    """``ids`` as an agent might hand them over; ``objects`` is the same list of values built
    by extending the previous turn's lists (form "extend" shares its int objects)."""
    if form == "extend":
        return objects
    if form == "fresh":
        return fresh(ids)
    if form == "tuple":
        return tuple(fresh(ids))
    if form == "array":
        return array.array("i", ids)
    if form == "numpy64":
        return np.array(ids, dtype=np.int64)
    return memoryview(array.array("i", ids).tobytes()).cast("i")


@st.composite
def raw_chains(draw: st.DrawFn, max_turns: int = 8) -> list[dict[str, Any]]:
    """Keyword arguments of ``record`` for a chain: prompts mostly extend the last prompt and
    output, sometimes rewrite a token of the last response or earlier, cut or start over."""
    turns: list[dict[str, Any]] = []
    history: list[int] = draw(st.lists(token_ids, max_size=8))
    last_out_start = len(history)
    for _ in range(draw(st.integers(min_value=1, max_value=max_turns))):
        edit = draw(st.sampled_from(["none"] * 5 + ["response", "anywhere", "cut", "new"]))
        if edit == "response" and last_out_start < len(history):
            j = draw(st.integers(min_value=last_out_start, max_value=len(history) - 1))
            history = [*history[:j], draw(token_ids), *history[j + 1 :]]
        elif edit == "anywhere" and history:
            j = draw(st.integers(min_value=0, max_value=len(history) - 1))
            history = [*history[:j], draw(token_ids), *history[j + 1 :]]
        elif edit == "cut" and history:
            history = history[: draw(st.integers(min_value=0, max_value=len(history) - 1))]
        elif edit == "new":
            history = draw(st.lists(token_ids, max_size=8))
        prompt = history + draw(st.lists(token_ids, max_size=6))  # shares history's objects
        out = draw(st.lists(token_ids, max_size=6))
        lps: Any = None
        if draw(st.integers(min_value=0, max_value=5)):
            lps = draw(
                st.lists(
                    st.floats(min_value=-30.0, max_value=0.0, width=32),
                    min_size=len(out),
                    max_size=len(out),
                )
            )
            lps = _lp_form(lps, draw)
        turns.append(
            {
                "prompt_ids": in_form(prompt, prompt, draw(st.sampled_from(FORMS))),
                "output_ids": draw(st.sampled_from([out, tuple(out), array.array("i", out)])),
                "output_log_probs": lps,
                "finish_reason": draw(st.sampled_from(["stop", "stop", "length"])),
                "ill_formed": draw(st.booleans()),
            }
        )
        last_out_start = len(prompt)
        history = prompt + out  # the next prompt shares these objects
    return turns


def _lp_form(lps: list[float], draw: st.DrawFn) -> Any:
    form = draw(st.sampled_from(["list", "array", "numpy"]))
    if form == "array":
        return array.array("f", lps)
    if form == "numpy":
        return np.array(lps, dtype=np.float64)
    return lps


def plain(kwargs: dict[str, Any]) -> TurnRecord:
    return TurnRecord.from_lists(**kwargs)


def build(turns: list[TurnRecord], limit: int | None, policy: dict[str, Any]) -> list[Sample]:
    b = SampleBuilder(max_sample_tokens=limit, **policy)
    for t in turns:
        b.add(t)
    return b.finish(reward=1.0, metadata={"k": 1})


policies = st.fixed_dictionaries(
    {
        "ill_formed_policy": st.sampled_from(["mask", "train"]),
        "missing_log_probs": st.just("mask"),
        "fork_threshold_tokens": st.sampled_from([0, 2, 1024]),
    }
)


@settings(max_examples=120, deadline=None)
@given(chain=raw_chains(), limit=st.none() | st.integers(1, 40), policy=policies)
def test_records_equal_from_lists_and_build_the_same_samples(
    chain: list[dict[str, Any]], limit: int | None, policy: dict[str, Any]
) -> None:
    recorder = TurnRecorder()
    ours = [recorder.record(**kw) for kw in chain]
    refs = [plain(kw) for kw in chain]
    assert ours == refs
    for turn in ours:  # the views are typed, read-only, contiguous
        assert turn.prompt_ids.format == turn.output_ids.format == "i"
        assert turn.prompt_ids.readonly
        assert turn.output_ids.readonly
    st_ = recorder.statistics()
    assert st_.turns == len(chain) == st_.extended + st_.restarted + 1
    # Samples: the same from both kinds of records, and as the plain-list reference says.
    samples = build(ours, limit, policy)
    assert samples == build(refs, limit, policy)
    for s in samples:
        assert decode_sample(encode_sample(s)) == s  # the decoder re-checks every invariant
    # The plain-list reference, cut to the limit by slime's rule (keep the first ``limit``
    # tokens; a sample whose prompt alone fills it, or left untrained, is dropped).
    expected = []
    for seg in ref_build(refs, **policy):
        tokens, mask, lps = seg.tokens, seg.mask, seg.log_probs
        if limit is not None and len(tokens) > limit:
            keep = max(limit - seg.prompt_len, 0)
            tokens, mask, lps = tokens[:limit], mask[:keep], lps[:keep]
        if any(mask):
            expected.append((tokens, mask, lps))
    assert [(s.tokens_list(), s.loss_mask_list(), s.rollout_log_probs_list()) for s in samples] == (
        expected
    )
    # Records never change afterwards: not when the caller writes to its lists and arrays.
    for kw in chain:
        for key in ("prompt_ids", "output_ids"):
            value = kw[key]
            if isinstance(value, (list, array.array, np.ndarray)) and len(value):
                value[0] = 7
    assert ours == refs


def test_history_grows_into_new_buffers_and_old_records_keep_theirs() -> None:
    rng = random.Random(5)
    recorder = TurnRecorder()
    history = [rng.randrange(150_000) for _ in range(3000)]
    records, expected = [], []
    for _ in range(12):  # 3000 + 12 * 2500 tokens: the 16 kB first buffer grows several times
        out = [rng.randrange(150_000) for _ in range(500)]
        lps = [-rng.random() for _ in out]
        records.append(recorder.record(prompt_ids=history, output_ids=out, output_log_probs=lps))
        expected.append((list(history), list(out), [f32(x) for x in lps]))
        history = history + out + [rng.randrange(150_000) for _ in range(2000)]
    buffers = {id(r.prompt_ids.obj) for r in records}
    assert 1 < len(buffers) < len(records)  # shared, and grown a few times
    for r, (p, o, lp) in zip(records, expected, strict=True):
        assert r.prompt_ids_list() == p
        assert r.output_ids_list() == o
        assert r.output_log_probs_list() == lp
    st_ = recorder.statistics()
    assert st_.extended == 11
    assert st_.restarted == 0
    # Each token was converted once: the history, not the sum of the prompts.
    assert st_.converted_tokens == len(history) - 2000


def test_every_check_path_is_taken_and_exact() -> None:
    """Shared objects (the list-order check), fresh objects (the uint32 conversion and
    memcmp), buffers (memcmp); each followed by a prompt that does not extend the history."""
    base = [300, 301, 70_000, 5]
    for form in ("extend", "fresh", "array"):
        recorder = TurnRecorder()
        first = recorder.record(prompt_ids=base, output_ids=[1, 300])
        history = [*base, 1, 300]
        nxt = [*history, 70000]
        second = recorder.record(prompt_ids=in_form(nxt, nxt, form), output_ids=[2])
        assert second == plain({"prompt_ids": nxt, "output_ids": [2]})
        assert recorder.statistics().extended == 1
        # Differs only in the last held token: not an extension (the history restarts).
        bad = [*nxt, 2]
        bad[len(history) - 1] = 301
        third = recorder.record(prompt_ids=in_form(bad, bad, form), output_ids=[])
        assert third == plain({"prompt_ids": bad, "output_ids": []})
        assert recorder.statistics().restarted == 1
        assert first.prompt_ids_list() == base  # untouched by the restart


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_ids": [1, 2, 2**31]}, "out of range"),
        ({"prompt_ids": [1, 2, 1.5]}, "wrong type"),
        ({"prompt_ids": [1, 3, "x"]}, "wrong type"),
        ({"output_ids": [2**40]}, "out of range"),
        ({"output_log_probs": [0.0, 0.0]}, "2 entries for 1 output_ids"),
        ({"finish_reason": 3}, "finish_reason"),
        ({"ill_formed": 1}, "ill_formed"),
    ],
)
def test_bad_input_raises_and_leaves_the_recorder_unchanged(
    kwargs: dict[str, Any], match: str
) -> None:
    recorder = TurnRecorder()
    history = [300, 301, 302]
    recorder.record(prompt_ids=history, output_ids=[400])
    before = recorder.statistics()
    good: dict[str, Any] = {
        "prompt_ids": [*history, 400, 500],
        "output_ids": [9],
        "output_log_probs": [-1.0],
    }
    bad = {**good, **kwargs}
    bads = [bad]
    if "prompt_ids" in kwargs:  # the bad item past the held part, and inside it
        bad["prompt_ids"] = [*history, 400, *kwargs["prompt_ids"]]
        bads.append({**good, "prompt_ids": [kwargs["prompt_ids"][-1], *history[1:], 400]})
    for b in bads:
        with pytest.raises(InvalidArgumentError, match=match):
            recorder.record(**b)
    assert recorder.statistics() == before
    assert recorder.record(**good) == plain(good)
    assert recorder.statistics().extended == 1


@settings(max_examples=150, deadline=None)
@given(
    held=st.lists(token_ids, max_size=12),
    prompt=st.lists(token_ids, max_size=14),
    share=st.integers(min_value=0, max_value=14),
)
def test_starts_with_is_slicing(held: list[int], prompt: list[int], share: int) -> None:
    # Share the first ``share`` objects (where the values agree), so both the pointer and the
    # value comparisons are exercised.
    prompt = [held[i] if i < min(share, len(held)) else x for i, x in enumerate(prompt)]
    held = fresh(held) if share == 0 else held
    assert _recorder._starts_with(prompt, held) == (prompt[: len(held)] == held)
    assert all(isinstance(x, int) for x in held)  # the end marker was taken off again


def test_negative_ids_held_and_their_uint32_aliases() -> None:
    """A held id < 0 has the bytes of a uint32 >= 2**31: a fresh prompt holding that alias is
    out of range, not an extension; one holding the negative id extends (struct path); one
    of ids >= 0 cannot extend and restarts the history, after which extensions are checked
    by the uint32 path again."""
    recorder = TurnRecorder()
    recorder.record(prompt_ids=[5, -3, 7], output_ids=[-1])
    alias = [5, 2**32 - 3, 7, 2**32 - 1, 9]
    with pytest.raises(InvalidArgumentError, match="out of range"):
        TurnRecord.from_lists(prompt_ids=alias, output_ids=[])
    with pytest.raises(InvalidArgumentError, match="out of range"):
        recorder.record(prompt_ids=fresh(alias), output_ids=[])
    good = [5, -3, 7, -1, 9]
    assert recorder.record(prompt_ids=fresh(good), output_ids=[4]) == plain(
        {"prompt_ids": good, "output_ids": [4]}
    )
    assert recorder.statistics().extended == 1
    other = [5, 3, 7, 1, 9, 4]
    assert recorder.record(prompt_ids=fresh(other), output_ids=[8]) == plain(
        {"prompt_ids": other, "output_ids": [8]}
    )
    assert recorder.statistics().restarted == 1
    longer = [*other, 8, 2**31 - 1]
    assert recorder.record(prompt_ids=fresh(longer), output_ids=[]) == plain(
        {"prompt_ids": longer, "output_ids": []}
    )
    assert recorder.statistics().extended == 2
    with pytest.raises(InvalidArgumentError, match="out of range"):  # 2**31 in the new part
        recorder.record(prompt_ids=[*fresh(longer), 2**31], output_ids=[])
    assert recorder.statistics().turns == 4


class Color(enum.IntEnum):
    RED = 7


ITEMS = st.one_of(
    st.integers(min_value=-(2**33), max_value=2**33),
    st.sampled_from([0, 2**31 - 1, 2**31, 2**32 - 1, 2**32, -1, -(2**31), -(2**31) - 1]),
    st.sampled_from([True, False, Color.RED, 1.0, "1", None]),
)


@settings(max_examples=300, deadline=None)
@given(items=st.lists(ITEMS, max_size=12), as_tuple=st.booleans())
def test_pack_is_struct(items: list[Any], as_tuple: bool) -> None:
    """The uint32 path of ``pack`` gives struct's bytes exactly when struct packs, else None."""
    seq: Any = tuple(items) if as_tuple else items
    try:
        expected: bytes | None = struct.pack(f"={len(items)}i", *items)
    except (struct.error, OverflowError, TypeError):
        expected = None
    assert _buffers.pack(seq, "i") == expected
