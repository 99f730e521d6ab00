"""Truncation of a sample to a token limit by slicing its views (O(1), no copy)."""

from __future__ import annotations

from typing import Any

from .._errors import InvalidArgumentError
from ._records import Sample, SampleStatus, trusted_sample


def truncate(sample: Sample, max_tokens: int) -> Sample:
    """Keep the first ``max_tokens`` tokens of ``sample`` (slime's semantics), without copying.

    The result's buffers are slices of the input's. If the sample already fits, it is returned
    unchanged. Otherwise:

    * if some of the response region survives, the result has ``status="truncated"`` (unless
      the input was already aborted), ``response_length`` shrunk to what is left, and the
      response-region buffers cut to match;
    * if nothing of the response region survives (the prompt alone fills the limit), the result
      is ``status="aborted"`` with ``response_length == 0`` and empty mask and log-probs, and
      ``metadata["abort_reason"] == "prompt_exceeds_max_tokens"``; never a negative length.

    Either way ``metadata["truncated_from"]`` records the original number of tokens, and the
    result's tokens are a prefix of the input's.

    Args:
        sample: The sample to cut.
        max_tokens: The largest number of tokens to keep (>= 0).

    Raises:
        InvalidArgumentError: ``max_tokens`` is not a non-negative int.
    """
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
        raise InvalidArgumentError(f"max_tokens must be an int >= 0, not {max_tokens!r}")
    n = len(sample.tokens)
    if n <= max_tokens:
        return sample
    metadata = dict(sample.metadata)
    keep, status = cut_point(n, sample.prompt_length, sample.status, metadata, max_tokens)
    # Slices of a valid sample's buffers are valid: skip the O(length) mask re-check.
    return trusted_sample(
        tokens=sample.tokens[:max_tokens],
        loss_mask=sample.loss_mask[:keep],
        rollout_log_probs=sample.rollout_log_probs[:keep],
        response_length=keep,
        reward=sample.reward,
        status=status,
        metadata=metadata,
    )


def cut_point(
    n_tokens: int,
    prompt_length: int,
    status: SampleStatus,
    metadata: dict[str, Any],
    max_tokens: int,
) -> tuple[int, SampleStatus]:
    """The rules of :func:`truncate` for a sample of ``n_tokens > max_tokens``: the response
    length and status to keep; records the cut in ``metadata`` (a dict the caller owns)."""
    metadata.setdefault("truncated_from", n_tokens)
    keep = max_tokens - prompt_length
    if keep <= 0:
        metadata["abort_reason"] = "prompt_exceeds_max_tokens"
        return 0, "aborted"
    return keep, "aborted" if status == "aborted" else "truncated"
