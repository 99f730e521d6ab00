"""Hypothesis properties of the builder, truncation and codecs over arbitrary chains of turns."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from trio_swe import (
    InvalidArgumentError,
    Sample,
    SampleBuilder,
    TurnRecord,
    decode_sample,
    decode_sample_json,
    encode_sample,
    encode_sample_json,
    truncate,
)

from ._chains import chains, ref_build, samples

policies = st.fixed_dictionaries(
    {
        "ill_formed_policy": st.sampled_from(["mask", "train"]),
        "missing_log_probs": st.sampled_from(["error", "mask"]),
        "fork_threshold_tokens": st.sampled_from([0, 1, 2, 3, 1024]),
        "append_only": st.booleans(),
    }
)
limits = st.none() | st.integers(min_value=1, max_value=40)


def build(turns: list[TurnRecord], **kwargs: object) -> list[Sample]:
    b = SampleBuilder(**kwargs)  # type: ignore[arg-type]
    for t in turns:
        b.add(t)
    return b.finish(reward=1.0, metadata={"episode": "e"})


def sampled_as(sample: Sample, i: int, turns: list[TurnRecord]) -> list[tuple[TurnRecord, float]]:
    """The turns (with their log-prob) that sampled ``sample.tokens[i]`` right after exactly
    ``sample.tokens[:i]``."""
    toks = sample.tokens_list()
    found = []
    for t in turns:
        prompt, out = t.prompt_ids_list(), t.output_ids_list()
        k = i - len(prompt)
        lps = t.output_log_probs_list()
        if 0 <= k < len(out) and lps is not None and toks[: i + 1] == (prompt + out)[: i + 1]:
            found.append((t, lps[k]))
    return found


@settings(max_examples=150, deadline=None)
@given(turns=chains(), policy=policies, limit=limits)
def test_builder_invariants(
    turns: list[TurnRecord], policy: dict[str, object], limit: int | None
) -> None:
    b = SampleBuilder(max_sample_tokens=limit, **policy)  # type: ignore[arg-type]
    try:
        for t in turns:
            b.add(t)
        out = b.finish(reward=1.0, metadata={"episode": "e"})
    except InvalidArgumentError as exc:
        expected = "not append-only" if "append-only" in str(exc) else "no log-probs"
        with pytest.raises(ValueError, match=expected):
            ref_build(turns, **policy)  # type: ignore[arg-type]
        return
    st = b.statistics()
    assert st.samples == len(out)
    assert st.tokens == sum(len(s.tokens) for s in out)
    assert st.trained_tokens == sum(s.num_trained_tokens() for s in out)
    assert st.turns == len(turns) == st.clean + st.realign + st.fork + 1
    for s in out:
        rl = s.response_length
        assert 0 <= rl <= len(s.tokens)
        assert len(s.loss_mask) == len(s.rollout_log_probs) == rl
        assert limit is None or len(s.tokens) <= limit
        assert s.num_trained_tokens() > 0  # untrained samples are dropped
        assert s.status in ("completed", "truncated")
        assert s.metadata["episode"] == "e"
        assert s.reward == 1.0
        mask, lps = s.loss_mask_list(), s.rollout_log_probs_list()
        for r, m in enumerate(mask):
            if m:
                i = s.prompt_length + r
                # Every trained token was sampled by a turn from exactly its preceding tokens,
                # carries that turn's own log-prob, and that turn is trainable.
                owners = [t for t, lp in sampled_as(s, i, turns) if lp == lps[r]]
                assert owners, (i, s)
                assert policy["ill_formed_policy"] == "train" or any(
                    not t.ill_formed for t in owners
                )


@settings(max_examples=150, deadline=None)
@given(turns=chains(), policy=policies)
def test_builder_matches_reference(turns: list[TurnRecord], policy: dict[str, object]) -> None:
    """Differential test against a plain-list reimplementation of the rules."""
    try:
        ref = ref_build(turns, **policy)  # type: ignore[arg-type]
    except ValueError:
        with pytest.raises(InvalidArgumentError):
            build(turns, **policy)
        return
    out = build(turns, keep_untrained=True, **policy)
    for kind in sorted({k for r in ref for k in r.kinds}):
        event(f"has {kind}")
    assert len(out) == len(ref)
    for s, r in zip(out, ref, strict=True):
        assert s.tokens_list() == r.tokens
        assert s.prompt_length == r.prompt_len
        assert s.loss_mask_list() == r.mask
        assert s.rollout_log_probs_list() == r.log_probs
        assert s.metadata["trajectory"]["turn_kinds"] == r.kinds
        assert s.status == ("truncated" if r.finish_reason == "length" else "completed")


@settings(max_examples=150, deadline=None)
@given(turns=chains(), policy=policies)
def test_nothing_lost_without_realign_or_limit(
    turns: list[TurnRecord], policy: dict[str, object]
) -> None:
    """With realignment off and no limit, every trainable output token is trained exactly once."""
    policy = {
        **policy,
        "fork_threshold_tokens": 0,
        "missing_log_probs": "mask",
        "append_only": False,
    }
    out = build(turns, **policy)
    trainable = sum(
        len(t.output_ids)
        for t in turns
        if t.output_log_probs is not None
        and not (t.ill_formed and policy["ill_formed_policy"] == "mask")
    )
    assert sum(s.num_trained_tokens() for s in out) == trainable


@settings(max_examples=150, deadline=None)
@given(turns=chains(), policy=policies, limit=st.integers(min_value=0, max_value=40))
def test_truncation_is_prefix_of_untruncated(
    turns: list[TurnRecord], policy: dict[str, object], limit: int
) -> None:
    policy = {**policy, "missing_log_probs": "mask", "append_only": False}
    full = build(turns, keep_untrained=True, **policy)
    if limit > 0:
        cut = build(turns, keep_untrained=True, max_sample_tokens=limit, **policy)
    else:
        cut = [truncate(s, 0) for s in full]
    assert len(cut) == len(full)
    for c, f in zip(cut, full, strict=True):
        assert_prefix(c, f, limit)


def assert_prefix(c: Sample, f: Sample, limit: int) -> None:
    n = len(c.tokens)
    assert n == min(limit, len(f.tokens))
    assert c.tokens_list() == f.tokens_list()[:n]
    assert c.response_length >= 0
    assert c.prompt_length == min(f.prompt_length, n)
    rl = c.response_length
    assert c.loss_mask_list() == f.loss_mask_list()[:rl]
    # Bitwise (NaN log-probs compare unequal as floats).
    assert c.rollout_log_probs.tobytes() == f.rollout_log_probs.tobytes()[: 4 * rl]
    if len(f.tokens) <= limit:
        assert c == f
    else:
        assert c.metadata["truncated_from"] == len(f.tokens)
        assert c.status == ("aborted" if rl == 0 or f.status == "aborted" else "truncated")


@settings(max_examples=150, deadline=None)
@given(sample=samples(finite=False), limit=st.integers(min_value=0, max_value=45))
def test_truncate_any_sample(sample: Sample, limit: int) -> None:
    cut = truncate(sample, limit)
    assert_prefix(cut, sample, limit)
    if len(sample.tokens) <= limit:
        assert cut is sample
    # Zero-copy: the cut buffers are views of the original ones.
    assert cut.tokens.obj is sample.tokens.obj
    # Truncating again to the same limit changes nothing.
    assert truncate(cut, limit) is cut


@settings(max_examples=150, deadline=None)
@given(sample=samples(finite=False))
def test_msgpack_roundtrip(sample: Sample) -> None:
    data = encode_sample(sample)
    back = decode_sample(data)
    assert back == sample
    assert back.tokens.obj is data
    assert back.rollout_log_probs.obj is data
    assert encode_sample(back) == data
    # The int32/float32 data sit at multiples of 4 from the message start (aligned views).
    start = np.frombuffer(data, np.uint8).ctypes.data
    arrays = back.numpy()
    for arr in (arrays.tokens, arrays.rollout_log_probs):
        assert (arr.ctypes.data - start) % 4 == 0
        assert arr.flags.aligned


@settings(max_examples=150, deadline=None)
@given(sample=samples())
def test_json_and_slime_roundtrip(sample: Sample) -> None:
    assert decode_sample_json(encode_sample_json(sample)) == sample
    back = Sample.from_slime_dict(sample.to_slime_dict())
    assert back == sample


@settings(max_examples=100, deadline=None)
@given(turns=chains(), limit=limits)
def test_built_samples_roundtrip(turns: list[TurnRecord], limit: int | None) -> None:
    for s in build(turns, max_sample_tokens=limit, missing_log_probs="mask"):
        assert decode_sample(encode_sample(s)) == s
        assert decode_sample_json(encode_sample_json(s)) == s


@settings(max_examples=150, deadline=None)
@given(
    turns=chains(),
    policy=policies,
    limit=st.integers(min_value=1, max_value=40),
    keep_untrained=st.booleans(),
)
def test_builder_limit_is_truncate_of_unlimited(
    turns: list[TurnRecord], policy: dict[str, object], limit: int, keep_untrained: bool
) -> None:
    """The builder applies the limit before writing the mask and log-probs (the cut tail is
    never copied): its samples and counters must equal ``truncate`` of the unlimited build."""
    policy = {**policy, "missing_log_probs": "mask", "append_only": False}
    full = build(turns, keep_untrained=True, **policy)
    b = SampleBuilder(max_sample_tokens=limit, keep_untrained=keep_untrained, **policy)  # type: ignore[arg-type]
    for t in turns:
        b.add(t)
    got = b.finish(reward=1.0, metadata={"episode": "e"})
    want = [truncate(s, limit) for s in full]
    kept = [s for s in want if keep_untrained or s.num_trained_tokens()]
    assert got == kept
    for g, w in zip(got, kept, strict=True):
        assert list(g.metadata) == list(w.metadata)  # same keys in the same order
    st_ = b.statistics()
    assert st_.truncated_samples == sum(len(s.tokens) > limit for s in full)
    assert st_.dropped_samples == len(want) - len(kept)
    assert st_.tokens == sum(len(s.tokens) for s in kept)
    assert st_.trained_tokens == sum(s.num_trained_tokens() for s in kept)
