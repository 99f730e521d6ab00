"""The shared episode -> trainer row conversion (trio_swe.integrations._convert), sans-IO."""

from __future__ import annotations

from trio_swe import EpisodeResult
from trio_swe.integrations._convert import failed_row, to_trainer_row
from trio_swe.integrations._trainer import sglang_params, vllm_params
from trio_swe.trajectory import Sample


def sample(
    prompt: list[int], response: list[int], mask: list[int], status: str = "completed"
) -> Sample:
    return Sample.from_lists(
        tokens=prompt + response,
        loss_mask=mask,
        rollout_log_probs=[-0.5 if m else 0.0 for m in mask],
        status=status,  # type: ignore[arg-type]
    )


def result(**kw: object) -> EpisodeResult:
    base: dict[str, object] = {"instance_id": "i", "episode_id": "e", "protocol": "scaleswe"}
    base.update(kw)
    return EpisodeResult(**base)  # type: ignore[arg-type]


def test_one_chain_is_the_row() -> None:
    r = result(
        status="completed", reward=1.0, n_turns=2, samples=[sample([1, 2], [3, 4, 5], [1, 0, 1])]
    )
    row = to_trainer_row(r, pad_id=0)
    assert (row.prompt_ids, row.response_ids, row.loss_mask) == ([1, 2], [3, 4, 5], [1, 0, 1])
    assert row.log_probs == [-0.5, 0.0, -0.5]
    assert (row.reward, row.stop_reason, row.trained_tokens, row.aborted) == (1.0, "stop", 2, False)
    assert row.episode_id == "e"


def test_several_chains_carry_the_last_and_count_the_others() -> None:
    first = sample([1], [2], [1])
    last = sample([1, 2, 3], [4, 5], [1, 1], status="truncated")
    row = to_trainer_row(result(status="completed", samples=[first, last]), pad_id=0)
    assert row.response_ids == [4, 5]
    assert row.dropped_samples == 1
    assert row.stop_reason == "length"  # the chain was cut


def test_lengths_cut_the_response_and_fail_a_long_prompt() -> None:
    r = result(status="completed", reward=1.0, samples=[sample([1, 2, 3], [4, 5, 6], [1, 1, 1])])
    cut = to_trainer_row(r, pad_id=0, max_response_tokens=2)
    assert (cut.response_ids, cut.loss_mask, cut.stop_reason) == ([4, 5], [1, 1], "length")
    long = to_trainer_row(r, pad_id=7, max_prompt_tokens=2)
    assert long.aborted
    assert long.permanent
    assert (long.response_ids, long.loss_mask, long.reward) == ([7], [0], 0.0)
    assert (long.abort_reason or "").startswith("prompt_too_long:")


def test_an_aborted_episode_is_flagged_never_a_plain_zero() -> None:
    r = result(status="aborted", abort_reason="policy_error", error="PolicyError: down", n_turns=1)
    row = to_trainer_row(r, pad_id=9)
    assert row.aborted
    assert not row.permanent
    assert (row.prompt_ids, row.response_ids, row.loss_mask, row.log_probs) == (
        [9],
        [9],
        [0],
        [0.0],
    )
    assert (row.stop_reason, row.abort_reason) == ("abort", "policy_error:PolicyError: down")
    assert row.metrics["aborted"] == 1.0
    missing = result(
        status="aborted", abort_reason="boot_failed", error="PermanentBootError: no image"
    )
    assert to_trainer_row(missing, pad_id=0).permanent
    assert failed_row("metadata:no field", pad_id=0).permanent


def test_an_episode_without_trained_turns_keeps_its_reward() -> None:
    row = to_trainer_row(result(status="truncated", reward=1.0), pad_id=0)
    assert not row.aborted
    assert (row.reward, row.loss_mask, row.stop_reason, row.trained_tokens) == (
        1.0,
        [0],
        "length",
        0,
    )


def test_sampling_parameters_cross_between_the_names() -> None:
    assert sglang_params({"max_tokens": 8, "temperature": 0.7, "logprobs": 0, "n": 1}) == {
        "max_new_tokens": 8,
        "temperature": 0.7,
    }
    assert vllm_params(
        {"max_new_tokens": 8, "no_stop_trim": True, "skip_special_tokens": False, "sglang_only": 1}
    ) == {"max_tokens": 8, "include_stop_str_in_output": True, "skip_special_tokens": False}
