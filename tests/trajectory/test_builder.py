"""Golden tests of SampleBuilder: CLEAN, REALIGN and FORK chains, ill-formed turns, turns
without log-probs, truncation inside the builder, statistics and argument checks.

Tokens are named words (``sys``, ``u1``, ``a1``...). A golden string shows the prompt, a ``|``
where the response region starts, and trained tokens in brackets.
"""

from __future__ import annotations

import array
import math

import pytest

from trio_swe import InvalidArgumentError, Sample, SampleBuilder, TurnRecord

from ._chains import golden

VOCAB: dict[str, int] = {}


def ids(text: str) -> list[int]:
    return [VOCAB.setdefault(w, 100 + len(VOCAB)) for w in text.split()]


def names() -> dict[int, str]:
    return {v: k for k, v in VOCAB.items()}


def turn(
    prompt: str,
    output: str,
    *,
    log_probs: bool = True,
    finish: str = "stop",
    ill_formed: bool = False,
    lp_base: float = 0.0,
) -> TurnRecord:
    out = ids(output)
    # Distinct, float32-exact log-probs so misalignment shows.
    lps = [lp_base - (i + 1) / 8 for i in range(len(out))] if log_probs else None
    return TurnRecord.from_lists(
        prompt_ids=ids(prompt),
        output_ids=out,
        output_log_probs=lps,
        finish_reason=finish,
        ill_formed=ill_formed,
    )


def run(*turns: TurnRecord, reward: float = 1.0, **kwargs: object) -> list[Sample]:
    b = SampleBuilder(**kwargs)  # type: ignore[arg-type]
    for t in turns:
        b.add(t)
    return b.finish(reward=reward)


def g(samples: list[Sample]) -> list[str]:
    return [golden(s, names()) for s in samples]


def kinds(s: Sample) -> list[str]:
    return list(s.metadata["trajectory"]["turn_kinds"])


# --- CLEAN ------------------------------------------------------------------------------------


def test_clean_chain_with_tools() -> None:
    b = SampleBuilder()
    b.add(turn("sys u1", "a1 a2"))
    b.add(turn("sys u1 a1 a2 t1 t2", "a3", lp_base=-1))
    b.add(turn("sys u1 a1 a2 t1 t2 a3 t3", "a4 a5", lp_base=-2))
    [s] = b.finish(reward=0.5, metadata={"instance": "x"})
    assert g([s]) == ["sys u1 | [a1] [a2] t1 t2 [a3] t3 [a4] [a5]"]
    assert s.rollout_log_probs_list() == [-0.125, -0.25, 0, 0, -1.125, 0, -2.125, -2.25]
    assert s.response_length == 8
    assert s.prompt_length == 2
    assert s.reward == 0.5
    assert s.status == "completed"
    assert s.metadata["instance"] == "x"
    assert s.metadata["trajectory"] == {
        "segment": 0,
        "segments": 1,
        "turn_kinds": ["start", "clean", "clean"],
        "ill_formed_turns": 0,
        "masked_turns": 0,
        "finish_reason": "stop",
    }
    st = b.statistics()
    assert (st.turns, st.clean, st.realign, st.fork, st.chains, st.samples) == (3, 2, 0, 0, 1, 1)
    assert (st.tokens, st.trained_tokens, st.fork_prefix_tokens) == (10, 5, 0)


def test_single_turn_and_empty_outputs() -> None:
    assert g(run(turn("sys u1", "a1"))) == ["sys u1 | [a1]"]
    # An empty output trains nothing: the sample is dropped (slime: 0 samples), or kept on request.
    assert run(turn("sys u1", "")) == []
    [s] = run(turn("sys u1", ""), keep_untrained=True)
    assert g([s]) == ["sys u1 |"]
    # An empty output in the middle leaves no gap.
    assert g(
        run(turn("sys u1", "a1"), turn("sys u1 a1 t1", ""), turn("sys u1 a1 t1 t2", "a2"))
    ) == ["sys u1 | [a1] t1 t2 [a2]"]


def test_prompt_equal_to_held_tokens_is_clean() -> None:
    [s] = run(turn("sys u1", "a1"), turn("sys u1 a1", "a2"))
    assert g([s]) == ["sys u1 | [a1] [a2]"]
    assert kinds(s) == ["start", "clean"]


# --- REALIGN ----------------------------------------------------------------------------------


def test_realign_when_client_rerenders_last_response() -> None:
    # The client re-rendered a2 as x2 (say, whitespace). The divergence is inside the last
    # response and the new output is short: realign. Unlike slime, a1 (sampled from exactly the
    # context it still follows) stays trained; x2 and a3 become context.
    b = SampleBuilder()
    b.add(turn("sys u1", "a1 a2 a3"))
    b.add(turn("sys u1 a1 x2 a3 t1", "b1", lp_base=-1))
    [s] = b.finish(reward=1.0)
    assert g([s]) == ["sys u1 | [a1] x2 a3 t1 [b1]"]
    assert s.rollout_log_probs_list() == [-0.125, 0, 0, 0, -1.125]
    assert kinds(s) == ["start", "realign"]
    assert b.statistics().realign == 1


def test_realign_when_the_whole_last_response_is_rewritten() -> None:
    # Reasoning dropped by the template: the new prompt diverges at the response's first token.
    [s] = run(turn("sys u1", "th1 th2 a1"), turn("sys u1 a1 t1", "b1"))
    assert g([s]) == ["sys u1 | a1 t1 [b1]"]


def test_realign_when_new_prompt_is_a_prefix_inside_last_response() -> None:
    [s] = run(turn("sys u1", "a1 a2 a3"), turn("sys u1 a1", "b1"))
    assert g([s]) == ["sys u1 | [a1] [b1]"]


def test_realign_threshold_gates_on_new_output_length() -> None:
    # slime's boundary (its test 4.6): realign iff len(new output) < threshold.
    first = turn("sys u1", "a1 a2")
    short = turn("sys u1 a1 x2 t1", "b1 b2")
    assert [kinds(s) for s in run(first, short, fork_threshold_tokens=3)] == [["start", "realign"]]
    forked = run(first, short, fork_threshold_tokens=2)
    assert [kinds(s) for s in forked] == [["start"], ["fork"]]
    assert g(forked) == ["sys u1 | [a1] [a2]", "sys u1 a1 x2 t1 | [b1] [b2]"]
    # Threshold 0 turns realignment off.
    assert len(run(first, short, fork_threshold_tokens=0)) == 2


def test_realign_then_clean_continues_from_rewritten_tokens() -> None:
    [s] = run(
        turn("sys u1", "a1 a2"),
        turn("sys u1 a1 x2 t1", "b1"),
        turn("sys u1 a1 x2 t1 b1 t2", "c1"),
    )
    assert g([s]) == ["sys u1 | [a1] x2 t1 [b1] t2 [c1]"]
    assert kinds(s) == ["start", "realign", "clean"]


# --- FORK -------------------------------------------------------------------------------------


def test_fork_when_divergence_is_in_a_prompt_region() -> None:
    b = SampleBuilder()
    b.add(turn("sys u1", "a1"))
    b.add(turn("sys u1 a1 t1", "a2"))
    b.add(turn("sys u1 a1 t9 x", "b1", lp_base=-1))  # the tool result changed: fork
    out = b.finish(reward=2.0)
    assert g(out) == ["sys u1 | [a1] t1 [a2]", "sys u1 a1 t9 x | [b1]"]
    assert [kinds(s) for s in out] == [["start", "clean"], ["fork"]]
    assert [s.metadata["trajectory"]["segment"] for s in out] == [0, 1]
    assert all(s.metadata["trajectory"]["segments"] == 2 for s in out)
    assert all(s.reward == 2.0 for s in out)  # the full reward to every sample
    assert out[1].rollout_log_probs_list() == [-1.125]
    st = b.statistics()
    assert (st.fork, st.clean, st.samples, st.fork_prefix_tokens) == (1, 1, 2, 5)


def test_fork_when_divergence_is_in_an_earlier_response() -> None:
    # Divergence in a1 (not the most recent response, a2): fork (slime's case B2).
    out = run(turn("sys u1", "a1"), turn("sys u1 a1 t1", "a2"), turn("sys u1 x1 t1 a2 t2", "b1"))
    assert g(out) == ["sys u1 | [a1] t1 [a2]", "sys u1 x1 t1 a2 t2 | [b1]"]


def test_fork_when_system_prompt_changes() -> None:
    out = run(turn("sys u1", "a1"), turn("sys2 u1", "b1"))
    assert g(out) == ["sys u1 | [a1]", "sys2 u1 | [b1]"]


def test_fork_of_untrained_segment_drops_it() -> None:
    b = SampleBuilder()
    b.add(turn("sys u1", "a1", ill_formed=True))
    b.add(turn("sys2 u1", "b1"))
    out = b.finish(reward=1.0)
    assert g(out) == ["sys2 u1 | [b1]"]
    assert out[0].metadata["trajectory"]["segment"] == 1
    assert b.statistics().dropped_samples == 1


# --- ill-formed turns -------------------------------------------------------------------------


def test_ill_formed_turn_is_masked_in_place() -> None:
    b = SampleBuilder()
    b.add(turn("sys u1", "a1"))
    b.add(turn("sys u1 a1 t1", "bad1 bad2", ill_formed=True, lp_base=-1))
    b.add(turn("sys u1 a1 t1 bad1 bad2 err", "a3", lp_base=-2))
    [s] = b.finish(reward=0.0)
    # The ill-formed output keeps its positions (nothing after it shifts), with loss 0; its
    # log-probs are kept for inspection (a trainer ignores loss-0 entries).
    assert g([s]) == ["sys u1 | [a1] t1 bad1 bad2 err [a3]"]
    assert s.rollout_log_probs_list() == [-0.125, 0, -1.125, -1.25, 0, -2.125]
    assert s.metadata["trajectory"]["ill_formed_turns"] == 1
    assert s.metadata["trajectory"]["masked_turns"] == 1
    st = b.statistics()
    assert (st.ill_formed_turns, st.masked_turns) == (1, 1)


def test_ill_formed_turn_trained_on_request() -> None:
    [s] = run(
        turn("sys u1", "a1"),
        turn("sys u1 a1 t1", "bad1", ill_formed=True),
        ill_formed_policy="train",
    )
    assert g([s]) == ["sys u1 | [a1] t1 [bad1]"]
    assert s.metadata["trajectory"]["masked_turns"] == 0


def test_ill_formed_turn_without_log_probs_needs_none() -> None:
    # Masked anyway, so missing log-probs are not an error.
    [s] = run(turn("sys u1", "a1"), turn("sys u1 a1 t1", "bad1", ill_formed=True, log_probs=False))
    assert g([s]) == ["sys u1 | [a1] t1 bad1"]
    assert s.rollout_log_probs_list()[-1] == 0.0


# --- turns without log-probs ------------------------------------------------------------------


def test_missing_log_probs_is_an_error_and_leaves_builder_unchanged() -> None:
    b = SampleBuilder()
    b.add(turn("sys u1", "a1"))
    with pytest.raises(InvalidArgumentError, match=r"turn 1 has 1 output tokens to train"):
        b.add(turn("sys u1 a1 t1", "a2", log_probs=False))
    b.add(turn("sys u1 a1 t1", "a2"))  # the caller can go on with a good turn
    assert g(b.finish(reward=1.0)) == ["sys u1 | [a1] t1 [a2]"]
    assert b.statistics().turns == 2


def test_missing_log_probs_masked_on_request_never_zero_padded_and_trained() -> None:
    b = SampleBuilder(missing_log_probs="mask")
    b.add(turn("sys u1", "a1"))
    b.add(turn("sys u1 a1 t1", "a2 a3", log_probs=False))
    b.add(turn("sys u1 a1 t1 a2 a3 t2", "a4"))
    [s] = b.finish(reward=1.0)
    assert g([s]) == ["sys u1 | [a1] t1 a2 a3 t2 [a4]"]
    assert s.metadata["trajectory"]["masked_turns"] == 1
    assert b.statistics().masked_turns == 1


def test_missing_log_probs_on_empty_output_is_fine() -> None:
    [s] = run(
        turn("sys u1", "a1"),
        turn("sys u1 a1 t1", "", log_probs=False),
        turn("sys u1 a1 t1 t2", "a2"),
    )
    assert g([s]) == ["sys u1 | [a1] t1 t2 [a2]"]


# --- status and truncation in the builder ------------------------------------------------------


def test_last_turn_length_finish_marks_sample_truncated() -> None:
    [s] = run(turn("sys u1", "a1"), turn("sys u1 a1 t1", "a2", finish="length"))
    assert s.status == "truncated"
    assert s.metadata["trajectory"]["finish_reason"] == "length"
    [s] = run(turn("sys u1", "a1", finish="length"), turn("sys u1 a1 t1", "a2"))
    assert s.status == "completed"


def test_max_sample_tokens_cuts_mid_response() -> None:
    b = SampleBuilder(max_sample_tokens=5)
    b.add(turn("sys u1", "a1"))
    b.add(turn("sys u1 a1 t1", "a2 a3"))
    [s] = b.finish(reward=1.0)
    assert g([s]) == ["sys u1 | [a1] t1 [a2]"]
    assert s.status == "truncated"
    assert s.metadata["truncated_from"] == 6
    assert s.rollout_log_probs_list() == [-0.125, 0, -0.125]
    assert b.statistics().truncated_samples == 1


def test_max_sample_tokens_drops_sample_whose_prompt_fills_it() -> None:
    turns = [turn("sys u1", "a1"), turn("sys2 u1 u2 u3 u4", "b1")]
    assert g(run(*turns, max_sample_tokens=4)) == ["sys u1 | [a1]"]
    # Kept on request, as a well-defined aborted sample (never a negative response_length).
    out = run(*turns, max_sample_tokens=4, keep_untrained=True)
    assert g(out) == ["sys u1 | [a1]", "sys2 u1 u2 u3 |"]
    assert out[1].status == "aborted"
    assert out[1].response_length == 0
    assert out[1].metadata["abort_reason"] == "prompt_exceeds_max_tokens"


def test_max_sample_tokens_exact_fit_is_untouched() -> None:
    [s] = run(turn("sys u1", "a1 a2"), max_sample_tokens=4)
    assert s.status == "completed"
    assert "truncated_from" not in s.metadata


def test_append_only_refuses_drift() -> None:
    b = SampleBuilder(append_only=True)
    b.add(turn("sys u1", "a1 a2"))
    b.add(turn("sys u1 a1 a2 t1", "a3"))
    with pytest.raises(InvalidArgumentError, match=r"turn 2 is not append-only: .* token 3 of 6"):
        b.add(turn("sys u1 a1 x2 t1", "b1"))  # would realign
    with pytest.raises(InvalidArgumentError, match="turn 2 is not append-only"):
        b.add(turn("sys9", "b1"))  # would fork
    b.add(turn("sys u1 a1 a2 t1 a3 t2", "a4"))
    assert g(b.finish(reward=1.0)) == ["sys u1 | [a1] [a2] t1 [a3] t2 [a4]"]
    st = b.statistics()
    assert (st.turns, st.clean, st.realign, st.fork) == (3, 2, 0, 0)


# --- reuse, statistics, arguments -------------------------------------------------------------


def test_builder_is_reusable_and_statistics_accumulate() -> None:
    b = SampleBuilder()
    assert b.finish(reward=1.0) == []
    b.add(turn("sys u1", "a1"))
    first = b.finish(reward=1.0, metadata={"k": 1})
    b.add(turn("sys u2", "b1"))
    second = b.finish(reward=0.0)
    assert g(first) == ["sys u1 | [a1]"]
    assert g(second) == ["sys u2 | [b1]"]  # no fork: a fresh chain starts
    assert "k" not in second[0].metadata
    st = b.statistics()
    assert (st.chains, st.turns, st.fork, st.samples) == (2, 2, 0, 2)


def test_classify_previews_without_changing_state() -> None:
    b = SampleBuilder()
    t = turn("sys u1", "a1")
    assert b.classify(t) == "start"
    b.add(t)
    assert b.classify(turn("sys u1 a1 t1", "a2")) == "clean"
    assert b.classify(turn("sys u1 x", "a2")) == "realign"
    assert b.classify(turn("sys x", "a2")) == "fork"
    assert b.statistics().turns == 1
    assert g(b.finish(reward=1.0)) == ["sys u1 | [a1]"]


def test_samples_do_not_share_metadata() -> None:
    meta = {"instance": "x"}
    b = SampleBuilder()
    b.add(turn("sys u1", "a1"))
    b.add(turn("sys2", "b1"))
    out = b.finish(reward=1.0, metadata=meta)
    out[0].metadata["instance"] = "changed"
    assert out[1].metadata["instance"] == "x"
    assert meta == {"instance": "x"}


def test_slime_downstream_contract() -> None:
    """What slime's ``_convert_samples_to_train_data`` asserts holds for every sample."""
    out = run(turn("sys u1", "a1 a2"), turn("sys u1 a1 x2 t1", "b1"), turn("sys9", "c1"))
    for s in out:
        d = s.to_slime_dict()
        assert len(d["loss_mask"]) == d["response_length"] == len(d["rollout_log_probs"])
        assert d["response_length"] <= len(d["tokens"])
        assert d["status"] in ("completed", "truncated", "aborted")
        assert Sample.from_slime_dict(d) == s


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_sample_tokens": 0}, "max_sample_tokens"),
        ({"max_sample_tokens": True}, "max_sample_tokens"),
        ({"max_sample_tokens": 1.5}, "max_sample_tokens"),
        ({"ill_formed_policy": "drop"}, "ill_formed_policy"),
        ({"missing_log_probs": "zero"}, "missing_log_probs"),
        ({"fork_threshold_tokens": -1}, "fork_threshold_tokens"),
    ],
)
def test_bad_builder_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        SampleBuilder(**kwargs)  # type: ignore[arg-type]


def test_bad_add_and_finish_arguments() -> None:
    b = SampleBuilder()
    with pytest.raises(InvalidArgumentError, match="TurnRecord"):
        b.add({"prompt_ids": [1]})  # type: ignore[arg-type]
    b.add(turn("sys u1", "a1"))
    for bad in (math.nan, math.inf, "1", None, True):
        with pytest.raises(InvalidArgumentError, match="reward"):
            b.finish(reward=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="metadata"):
        b.finish(reward=1.0, metadata=[("a", 1)])  # type: ignore[arg-type]


def test_add_snapshots_shared_buffers() -> None:
    """A read-only view of a mutable array is shared by the record, not copied; the builder
    keeps what the turn held when it was added (it defers copying log-probs to finish() only
    for views over immutable bytes)."""
    prompt = array.array("i", ids("sys u1"))
    out = array.array("i", ids("a1 a2"))
    lps = array.array("f", [-0.5, -0.25])
    t = TurnRecord(
        prompt_ids=memoryview(prompt).toreadonly(),
        output_ids=memoryview(out).toreadonly(),
        output_log_probs=memoryview(lps).toreadonly(),
    )
    assert t.output_log_probs is not None
    assert t.output_log_probs.obj is lps  # shared, not copied
    b = SampleBuilder()
    b.add(t)
    prompt[0], out[0], lps[0] = 7, 7, -9.0  # the caller writes to its arrays afterwards
    [s] = b.finish(reward=1.0)
    assert s.tokens_list() == ids("sys u1 a1 a2")
    assert s.rollout_log_probs_list() == [-0.5, -0.25]


def test_long_runs_grow_the_fill_buffers() -> None:
    """Mask and log-prob parts are slices of shared 0/1 buffers, grown for a long sample."""
    n = 300_000
    lp = array.array("f", [-0.5]) * n
    t1 = TurnRecord.from_lists(prompt_ids=bytes(12), output_ids=bytes(4 * n), output_log_probs=lp)
    t2 = TurnRecord.from_lists(
        prompt_ids=bytes(4 * (3 + 3 * n)), output_ids=bytes(4 * n), ill_formed=True
    )
    b = SampleBuilder(missing_log_probs="mask")
    b.add(t1)
    b.add(t2)
    [s] = b.finish(reward=1.0)
    assert s.response_length == 4 * n
    mask = s.loss_mask.tobytes()
    assert mask == b"\x01" * n + bytes(3 * n)
    assert s.rollout_log_probs.tobytes() == lp.tobytes() + bytes(4 * 3 * n)
