"""The records: :class:`TurnRecord` (one policy call) and :class:`Sample` (one training sample).

Both are frozen msgspec Structs whose token ids, loss mask and log-probs are read-only typed
memoryviews (see ``_buffers``). ``__post_init__`` runs on construction, on
``msgspec.structs.replace`` and on decoding, so every instance, however made, holds typed
buffers and satisfies the sample invariants.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

import msgspec
from msgspec.structs import force_setattr

from .._errors import InvalidArgumentError
from ._buffers import as_float32, as_int32, as_mask, describe

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

SampleStatus = Literal["completed", "truncated", "aborted"]
SAMPLE_STATUSES: frozenset[str] = frozenset({"completed", "truncated", "aborted"})


class TurnRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One call to the policy: the exact prompt token ids it saw and what it sampled.

    Attributes:
        prompt_ids: The prompt's token ids (int32 view).
        output_ids: The sampled token ids (int32 view).
        output_log_probs: The sampling log-prob of each output token (float32 view, same length
            as ``output_ids``), or None when the server did not return them.
        finish_reason: The inference server's raw finish reason (``"stop"``, ``"length"``,
            ``"abort"``, ...).
        ill_formed: The output could not be parsed (e.g. a malformed tool call). The builder
            masks or trains it according to its ``ill_formed_policy``; it never drops tokens.

    Buffers may be given as lists, ``array.array``, numpy arrays or raw little-endian bytes;
    they are stored as read-only typed views (copied only when the layout differs).
    """

    prompt_ids: memoryview
    output_ids: memoryview
    output_log_probs: memoryview | None = None
    finish_reason: str = "stop"
    ill_formed: bool = False

    def __post_init__(self) -> None:
        force_setattr(self, "prompt_ids", as_int32(self.prompt_ids, "prompt_ids"))
        out = as_int32(self.output_ids, "output_ids")
        force_setattr(self, "output_ids", out)
        if self.output_log_probs is not None:
            lp = as_float32(self.output_log_probs, "output_log_probs")
            if len(lp) != len(out):
                raise InvalidArgumentError(
                    f"output_log_probs has {len(lp)} entries for {len(out)} output_ids"
                )
            force_setattr(self, "output_log_probs", lp)
        if not isinstance(self.finish_reason, str):
            raise InvalidArgumentError(
                f"finish_reason must be a str, not {type(self.finish_reason).__name__}"
            )
        if not isinstance(self.ill_formed, bool):
            raise InvalidArgumentError(
                f"ill_formed must be a bool, not {type(self.ill_formed).__name__}"
            )

    @classmethod
    def from_lists(
        cls,
        *,
        prompt_ids: Iterable[int],
        output_ids: Iterable[int],
        output_log_probs: Iterable[float] | None = None,
        finish_reason: str = "stop",
        ill_formed: bool = False,
    ) -> TurnRecord:
        """Build a record from plain Python sequences (or any buffer).

        Raises:
            InvalidArgumentError: a token id does not fit int32, or the log-probs and output
                ids differ in length.
        """
        return cls(
            prompt_ids=prompt_ids,  # type: ignore[arg-type]  # coerced in __post_init__
            output_ids=output_ids,  # type: ignore[arg-type]
            output_log_probs=output_log_probs,  # type: ignore[arg-type]
            finish_reason=finish_reason,
            ill_formed=ill_formed,
        )

    def prompt_ids_list(self) -> list[int]:
        """The prompt token ids as a new list."""
        return self.prompt_ids.tolist()

    def output_ids_list(self) -> list[int]:
        """The output token ids as a new list."""
        return self.output_ids.tolist()

    def output_log_probs_list(self) -> list[float] | None:
        """The output log-probs as a new list, or None if missing."""
        lp = self.output_log_probs
        return None if lp is None else cast(list[float], lp.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TurnRecord):
            return NotImplemented
        return (
            self.finish_reason == other.finish_reason
            and self.ill_formed == other.ill_formed
            and _same(self.prompt_ids, other.prompt_ids)
            and _same(self.output_ids, other.output_ids)
            and (
                self.output_log_probs is None
                if other.output_log_probs is None
                else self.output_log_probs is not None
                and _same(self.output_log_probs, other.output_log_probs)
            )
        )

    def __repr__(self) -> str:
        lp = "None" if self.output_log_probs is None else describe(self.output_log_probs)
        return (
            f"TurnRecord(prompt_ids={describe(self.prompt_ids)}, "
            f"output_ids={describe(self.output_ids)}, output_log_probs={lp}, "
            f"finish_reason={self.finish_reason!r}, ill_formed={self.ill_formed})"
        )


class SampleArrays(NamedTuple):
    """Zero-copy numpy views of a sample's buffers (read-only)."""

    tokens: npt.NDArray[np.int32]
    loss_mask: npt.NDArray[np.uint8]
    rollout_log_probs: npt.NDArray[np.float32]


class Sample(msgspec.Struct, frozen=True, kw_only=True):
    """One training sample: a token sequence whose last ``response_length`` tokens are trained.

    Attributes:
        tokens: Every token id, prompt then response region (int32 view).
        loss_mask: One entry per response-region token: 1 trained, 0 context (uint8 view).
        rollout_log_probs: The rollout log-prob of each response-region token (float32 view);
            0.0 where the token is context that no policy call sampled.
        response_length: Length of the response region, ``0 <= response_length <= len(tokens)``.
        reward: The episode's reward.
        status: ``"completed"``, ``"truncated"`` (cut to a token limit, or the last generation
            hit its length limit) or ``"aborted"`` (nothing trainable is left; drop it).
        metadata: Free-form, msgspec-encodable.

    Invariants (checked on construction and on decoding): ``len(loss_mask) ==
    len(rollout_log_probs) == response_length``; the mask holds only 0 and 1.

    Equality compares contents. Views share memory with whatever they were made from (the
    builder's buffers, the bytes passed to :func:`decode_sample`); they are read-only.
    """

    tokens: memoryview
    loss_mask: memoryview
    rollout_log_probs: memoryview
    response_length: int
    reward: float = 0.0
    status: SampleStatus = "completed"
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        tokens = as_int32(self.tokens, "tokens")
        mask = as_mask(self.loss_mask, "loss_mask")
        lp = as_float32(self.rollout_log_probs, "rollout_log_probs")
        force_setattr(self, "tokens", tokens)
        force_setattr(self, "loss_mask", mask)
        force_setattr(self, "rollout_log_probs", lp)
        rl = self.response_length
        if not isinstance(rl, int) or isinstance(rl, bool):
            raise InvalidArgumentError(f"response_length must be an int, not {type(rl).__name__}")
        if not 0 <= rl <= len(tokens):
            raise InvalidArgumentError(
                f"response_length {rl} is outside 0..{len(tokens)} (the number of tokens)"
            )
        if len(mask) != rl:
            raise InvalidArgumentError(
                f"loss_mask has {len(mask)} entries but response_length is {rl}"
            )
        if len(lp) != rl:
            raise InvalidArgumentError(
                f"rollout_log_probs has {len(lp)} entries but response_length is {rl}"
            )
        if type(self.reward) is not float or not math.isfinite(self.reward):
            force_setattr(self, "reward", finite_reward(self.reward))
        if self.status not in SAMPLE_STATUSES:
            raise InvalidArgumentError(
                f"status must be one of {sorted(SAMPLE_STATUSES)}, not {self.status!r}"
            )
        if not isinstance(self.metadata, dict):
            raise InvalidArgumentError(
                f"metadata must be a dict, not {type(self.metadata).__name__}"
            )

    @classmethod
    def from_lists(
        cls,
        *,
        tokens: Iterable[int],
        loss_mask: Iterable[int],
        rollout_log_probs: Iterable[float],
        response_length: int | None = None,
        reward: float = 0.0,
        status: SampleStatus = "completed",
        metadata: dict[str, Any] | None = None,
    ) -> Sample:
        """Build a sample from plain sequences (or any buffer); ``response_length`` defaults to
        the length of ``loss_mask``.

        Raises:
            InvalidArgumentError: the lengths disagree, a mask value is not 0/1, a token id does
                not fit int32, or status is unknown.
        """
        mask = as_mask(loss_mask, "loss_mask")
        return cls(
            tokens=tokens,  # type: ignore[arg-type]  # coerced in __post_init__
            loss_mask=mask,
            rollout_log_probs=rollout_log_probs,  # type: ignore[arg-type]
            response_length=len(mask) if response_length is None else response_length,
            reward=reward,
            status=status,
            metadata={} if metadata is None else metadata,
        )

    @property
    def prompt_length(self) -> int:
        """Number of tokens before the response region."""
        return len(self.tokens) - self.response_length

    def num_trained_tokens(self) -> int:
        """Number of response-region tokens with loss 1 (slime's ``effective_response_length``)."""
        return self.loss_mask.tobytes().count(1)

    def tokens_list(self) -> list[int]:
        """The token ids as a new list."""
        return self.tokens.tolist()

    def loss_mask_list(self) -> list[int]:
        """The loss mask as a new list."""
        return self.loss_mask.tolist()

    def rollout_log_probs_list(self) -> list[float]:
        """The rollout log-probs as a new list (float32 values widened to float)."""
        return cast(list[float], self.rollout_log_probs.tolist())

    def numpy(self) -> SampleArrays:
        """Zero-copy, read-only numpy arrays over the buffers (numpy is imported here, lazily).

        For torch: ``torch.from_numpy(arrays.tokens.copy())``, or ``torch.frombuffer(
        sample.tokens, dtype=torch.int32)`` to share memory (torch warns that it is read-only).
        """
        import numpy as np

        return SampleArrays(
            np.frombuffer(self.tokens, dtype=np.int32),
            np.frombuffer(self.loss_mask, dtype=np.uint8),
            np.frombuffer(self.rollout_log_probs, dtype=np.float32),
        )

    def to_slime_dict(self) -> dict[str, Any]:
        """The fields of slime's ``Sample`` (as in its ``to_dict``) that this record holds, as lists.

        ``remove_sample`` is True for aborted samples, which slime then masks out entirely.
        Merge in the fields slime needs that are not ours (``index``, ``group_index``,
        ``rollout_id``, ``prompt``, ``label``...) before building a slime ``Sample``.
        """
        return {
            "tokens": self.tokens.tolist(),
            "response_length": self.response_length,
            "loss_mask": self.loss_mask.tolist(),
            "rollout_log_probs": self.rollout_log_probs_list(),
            "reward": self.reward,
            "status": self.status,
            "metadata": dict(self.metadata),
            "remove_sample": self.status == "aborted",
        }

    @classmethod
    def from_slime_dict(cls, d: Mapping[str, Any]) -> Sample:
        """A sample from slime ``Sample`` fields (``Sample.to_dict()`` or ``vars(sample)``).

        A missing ``loss_mask`` means all ones (slime's convention); ``remove_sample`` makes the
        sample aborted; ``status`` may be a string or slime's ``Status`` enum. Other slime fields
        are ignored. Log-probs are stored as float32, so values round to float32 precision.

        Raises:
            InvalidArgumentError: a required field is missing, ``rollout_log_probs`` is None
                while some token is trained, the status is not completed/truncated/aborted, or
                the fields break the sample invariants.
        """
        for key in ("tokens", "response_length"):
            if key not in d:
                raise InvalidArgumentError(f"slime sample has no {key!r}")
        rl = d["response_length"]
        mask = d.get("loss_mask")
        mask_view = as_mask([1] * rl if mask is None else mask, "loss_mask")
        lp = d.get("rollout_log_probs")
        if lp is None:
            if mask_view.tobytes().count(1):
                raise InvalidArgumentError(
                    "slime sample has trained tokens but rollout_log_probs is None"
                )
            lp = [0.0] * rl
        raw_status = d.get("status", "completed")
        status = str(getattr(raw_status, "value", raw_status))
        if d.get("remove_sample"):
            status = "aborted"
        reward = d.get("reward")
        metadata = d.get("metadata")
        return cls(
            tokens=d["tokens"],
            loss_mask=mask_view,
            rollout_log_probs=lp,  # type: ignore[arg-type]  # coerced in __post_init__
            response_length=rl,
            reward=0.0 if reward is None else reward,
            status=status,  # type: ignore[arg-type]  # checked in __post_init__
            metadata=dict(metadata) if metadata else {},
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return (
            self.response_length == other.response_length
            and self.reward == other.reward
            and self.status == other.status
            and self.metadata == other.metadata
            and _same(self.tokens, other.tokens)
            and _same(self.loss_mask, other.loss_mask)
            and _same(self.rollout_log_probs, other.rollout_log_probs)
        )

    def __repr__(self) -> str:
        return (
            f"Sample(tokens={describe(self.tokens)}, loss_mask={describe(self.loss_mask)}, "
            f"rollout_log_probs={describe(self.rollout_log_probs)}, "
            f"response_length={self.response_length}, reward={self.reward!r}, "
            f"status={self.status!r}, metadata={self.metadata!r})"
        )


def _same(a: memoryview, b: memoryview) -> bool:
    """Bitwise equality of two buffers. (memoryview ``==`` unpacks item by item, ~50x slower,
    and NaN log-probs would never compare equal.)"""
    return a.nbytes == b.nbytes and a.tobytes() == b.tobytes()


_TEMPLATE = Sample(
    tokens=b"",  # type: ignore[arg-type]
    loss_mask=b"",  # type: ignore[arg-type]
    rollout_log_probs=b"",  # type: ignore[arg-type]
    response_length=0,
)


# The template's own __copy__ (what copy.copy dispatches to, minus the dispatch).
_copy_template: Callable[[], Sample] = _TEMPLATE.__copy__  # type: ignore[attr-defined]


def trusted_sample(
    *,
    tokens: memoryview,
    loss_mask: memoryview,
    rollout_log_probs: memoryview,
    response_length: int,
    reward: float,
    status: SampleStatus,
    metadata: dict[str, Any],
) -> Sample:
    """A Sample from fields that are valid by construction, skipping ``__post_init__``.

    Only for this package's own builder and truncation, whose buffers are typed read-only views
    meeting every invariant (the property tests check that through a validating decode).
    ``__post_init__``'s mask check is a pass over the mask; this is O(1) in the length.
    """
    sample = _copy_template()  # copying a Struct does not rerun __post_init__
    force_setattr(sample, "tokens", tokens)
    force_setattr(sample, "loss_mask", loss_mask)
    force_setattr(sample, "rollout_log_probs", rollout_log_probs)
    force_setattr(sample, "response_length", response_length)
    force_setattr(sample, "reward", reward)
    force_setattr(sample, "status", status)
    force_setattr(sample, "metadata", metadata)
    return sample


def finite_reward(reward: object) -> float:
    """``reward`` as a finite float.

    Raises:
        InvalidArgumentError: it is not a real number, or is NaN/infinite.
    """
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise InvalidArgumentError(f"reward must be a float, not {type(reward).__name__}")
    value = float(reward)
    if not math.isfinite(value):
        raise InvalidArgumentError(f"reward must be finite, not {value}")
    return value


_TURN_TEMPLATE = TurnRecord(prompt_ids=b"", output_ids=b"")  # type: ignore[arg-type]
_copy_turn_template: Callable[[], TurnRecord] = _TURN_TEMPLATE.__copy__  # type: ignore[attr-defined]


def trusted_turn(
    *,
    prompt_ids: memoryview,
    output_ids: memoryview,
    output_log_probs: memoryview | None,
    finish_reason: str,
    ill_formed: bool,
) -> TurnRecord:
    """A TurnRecord from fields that are valid by construction, skipping ``__post_init__``.

    Only for :class:`~trio_swe.trajectory.TurnRecorder`: read-only int32 views, a float32
    view of as many items as ``output_ids`` (or None), a str and a bool, all checked there.
    """
    turn = _copy_turn_template()
    force_setattr(turn, "prompt_ids", prompt_ids)
    force_setattr(turn, "output_ids", output_ids)
    force_setattr(turn, "output_log_probs", output_log_probs)
    force_setattr(turn, "finish_reason", finish_reason)
    force_setattr(turn, "ill_formed", ill_formed)
    return turn
