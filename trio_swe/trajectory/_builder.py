"""The sample builder: a chain of :class:`TurnRecord` s becomes one or more :class:`Sample` s.

Each turn is compared with the tokens held so far (a memcmp over the raw int32 bytes):

* **clean**: the held tokens are a prefix of the new prompt. The prompt's new suffix is
  appended as context (loss 0) and the output as trained tokens (loss 1).
* **realign**: the new prompt diverges from the held tokens inside the most recent response
  (a client re-rendered it: whitespace, dropped reasoning) and the new output is shorter than
  ``fork_threshold_tokens``. The held tokens are cut at the divergence and the new prompt's
  rest is appended as context. Unlike slime, the part of the last response before the
  divergence stays trained: it was sampled from exactly the context it still follows.
* **fork**: anything else. The current sample is closed and a new one starts whose prompt is
  the whole new prompt.

Every trained token is an output token of some turn, preceded in its sample by exactly the
tokens that turn was prompted with and sampled so far, and carries that turn's log-prob.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .._errors import InvalidArgumentError
from ._buffers import common_prefix_bytes, float_view
from ._records import Sample, SampleStatus, TurnRecord, finite_reward, trusted_sample
from ._truncate import cut_point

TurnKind = Literal["start", "clean", "realign", "fork"]
IllFormedPolicy = Literal["mask", "train"]
MissingLogProbsPolicy = Literal["error", "mask"]


class BuilderStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a :class:`SampleBuilder`, cumulative over every chain it has built.

    Attributes:
        turns: Turns added.
        chains: Chains finished (calls to ``finish`` after at least one turn).
        clean: Turns appended to the held tokens as they were.
        realign: Turns that rewrote the tail of the last response as context.
        fork: Turns that started a new sample (the first turn of a chain is not a fork).
        ill_formed_turns: Turns marked ill-formed (trained or masked per the policy).
        masked_turns: Turns whose output was masked (ill-formed, or missing log-probs).
        samples: Samples returned.
        truncated_samples: Samples cut to ``max_sample_tokens``.
        dropped_samples: Segments returned as no sample because no trained token was left.
        tokens: Tokens in the returned samples.
        trained_tokens: Loss-1 tokens in the returned samples.
        fork_prefix_tokens: Prompt tokens that forked samples re-emit (context duplicated by
            forking; large values point at a client that re-renders its history).
    """

    turns: int = 0
    chains: int = 0
    clean: int = 0
    realign: int = 0
    fork: int = 0
    ill_formed_turns: int = 0
    masked_turns: int = 0
    samples: int = 0
    truncated_samples: int = 0
    dropped_samples: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    fork_prefix_tokens: int = 0


# Read-only runs of 0 and 1 bytes, sliced for the context and trained parts of the mask and
# log-prob buffers (grown on demand to the largest sample seen; calloc'd zeros cost no RSS
# until read).
_fill: tuple[memoryview, memoryview] = (memoryview(bytes(1 << 14)), memoryview(b"\x01" * 4096))


def _fills(n: int) -> tuple[memoryview, memoryview]:
    """The zero and one views, at least ``4 * n`` and ``n`` bytes long (a float32 and a uint8
    buffer of ``n`` items)."""
    global _fill
    zeros, ones = _fill
    if 4 * n > len(zeros) or n > len(ones):
        size = max(n, 2 * len(ones))
        _fill = zeros, ones = memoryview(bytes(4 * size)), memoryview(b"\x01" * size)
    return zeros, ones


# One output run of a segment: (start in the response region, token count, trained,
# log-probs as a float32 view or None). Runs are disjoint and in order; the tokens between
# them are context (loss 0, log-prob 0.0).
_Run = tuple[int, int, bool, "memoryview | None"]


class _Segment:
    """The tokens of one sample (little-endian int32 in a bytearray, held for the prefix
    checks) and its output runs, from which ``buffers`` writes the mask and log-probs once.

    Keeping runs instead of growing the mask and log-prob buffers turn by turn saves four
    appends (and their reallocations) per turn: the hot path of the builder.
    """

    __slots__ = (
        "finish_reason",
        "fork_prefix",
        "ill_formed",
        "kinds",
        "last_response_start",
        "masked",
        "prompt_len",
        "runs",
        "tokens",
    )

    def __init__(self, prompt: memoryview, *, forked: bool) -> None:
        self.tokens = bytearray(prompt)
        self.prompt_len = len(prompt)  # in tokens; the response region starts here
        self.runs: list[_Run] = []
        self.last_response_start = self.prompt_len
        self.fork_prefix = self.prompt_len if forked else 0
        self.kinds: list[TurnKind] = []
        self.ill_formed = 0
        self.masked = 0
        self.finish_reason = ""

    def place(self, prompt: memoryview, out_len: int, threshold: int) -> tuple[TurnKind, int]:
        """The kind of a turn with this prompt and output length, and the common prefix length
        of the held tokens and the prompt (in tokens)."""
        held = self.tokens
        n = len(held) >> 2
        # One memcmp: the common case. (startswith reads the int32 view's raw bytes.)
        if len(prompt) >= n and held.startswith(prompt[:n]):
            return "clean", n
        lcp = common_prefix_bytes(held, prompt.cast("B")) >> 2
        if lcp >= self.last_response_start and out_len < threshold:
            return "realign", lcp
        return "fork", lcp

    def cut(self, n_tokens: int) -> None:
        """Drop every held token from index ``n_tokens`` on (inside the response region)."""
        r = n_tokens - self.prompt_len
        runs = self.runs
        while runs and runs[-1][0] >= r:
            runs.pop()
        if runs:
            start, n, trained, lp = runs[-1]
            keep = r - start
            if keep < n:
                runs[-1] = (start, keep, trained, None if lp is None else lp[:keep])
        del self.tokens[n_tokens * 4 :]

    def buffers(self, size: int) -> tuple[bytes, bytes, int]:
        """The first ``size`` entries of the response region's mask (uint8) and log-probs
        (float32 bytes), and the number of trained tokens among them.

        The runs and the context between them are joined: each byte is copied once, and none
        past ``size`` (what a truncation drops is never written).
        """
        zeros, ones = _fills(size)  # long enough for any part of either buffer
        mask: list[memoryview] = []
        log_probs: list[memoryview] = []
        add_mask, add_lp = mask.append, log_probs.append
        pos = trained = 0
        for start, n, is_trained, lp in self.runs:
            end = start + n
            if end > size:  # the run is cut by a truncation (or lies past it)
                if start >= size:
                    break
                n, end = size - start, size
                lp = None if lp is None else lp[:n]
            if start > pos:  # context
                add_mask(zeros[: start - pos])
                add_lp(zeros[: 4 * (start - pos)])
            if is_trained:
                add_mask(ones[:n])
                trained += n
            else:
                add_mask(zeros[:n])
            add_lp(zeros[: 4 * n] if lp is None else lp)
            pos = end
        if size > pos:
            add_mask(zeros[: size - pos])
            add_lp(zeros[: 4 * (size - pos)])
        return b"".join(mask), b"".join(log_probs), trained


class SampleBuilder:
    """Turns one chain of policy calls (an agent session) into training samples.

    Add the turns in order with :meth:`add`, then call :meth:`finish` for the samples. The
    builder is then empty and may build the next chain; :meth:`statistics` accumulates.

    Args:
        max_sample_tokens: Truncate each sample to this many tokens (the session's
            ``max_context_tokens``); None for no limit.
        ill_formed_policy: ``"mask"`` keeps an ill-formed turn's output as context (loss 0);
            ``"train"`` trains it like any other output (the reward then teaches the format).
            Either way its tokens stay in place, so nothing after it shifts.
        missing_log_probs: What to do with a turn whose output would be trained but has no
            log-probs: ``"error"`` raises :class:`~trio_swe.InvalidArgumentError`; ``"mask"``
            keeps its output as context (loss 0). Never padded with 0.0 and trained.
        fork_threshold_tokens: A turn whose prompt diverges inside the last response realigns
            only if its output is shorter than this (slime's gate); 0 turns realignment off.
        keep_untrained: Also return samples without a single trained token (normally dropped
            and counted in ``dropped_samples``).
        append_only: Refuse any turn that is not clean (raise instead of realigning or
            forking), for clients that keep the server's token history canonical (slime PR
            #2287): a drift is then a bug to see, not extra samples to train on.

    Raises:
        InvalidArgumentError: an argument is out of range or not one of the allowed values.
    """

    def __init__(
        self,
        *,
        max_sample_tokens: int | None = None,
        ill_formed_policy: IllFormedPolicy = "mask",
        missing_log_probs: MissingLogProbsPolicy = "error",
        fork_threshold_tokens: int = 1024,
        keep_untrained: bool = False,
        append_only: bool = False,
    ) -> None:
        if max_sample_tokens is not None and (
            not isinstance(max_sample_tokens, int)
            or isinstance(max_sample_tokens, bool)
            or max_sample_tokens <= 0
        ):
            raise InvalidArgumentError(
                f"max_sample_tokens must be a positive int or None, not {max_sample_tokens!r}"
            )
        if ill_formed_policy not in ("mask", "train"):
            raise InvalidArgumentError(
                f"ill_formed_policy must be 'mask' or 'train', not {ill_formed_policy!r}"
            )
        if missing_log_probs not in ("error", "mask"):
            raise InvalidArgumentError(
                f"missing_log_probs must be 'error' or 'mask', not {missing_log_probs!r}"
            )
        if (
            not isinstance(fork_threshold_tokens, int)
            or isinstance(fork_threshold_tokens, bool)
            or fork_threshold_tokens < 0
        ):
            raise InvalidArgumentError(
                f"fork_threshold_tokens must be an int >= 0, not {fork_threshold_tokens!r}"
            )
        self.max_sample_tokens = max_sample_tokens
        self.ill_formed_policy: IllFormedPolicy = ill_formed_policy
        self.missing_log_probs: MissingLogProbsPolicy = missing_log_probs
        self.fork_threshold_tokens = fork_threshold_tokens
        self.keep_untrained = keep_untrained
        self.append_only = append_only
        self._mask_ill_formed = ill_formed_policy == "mask"
        self._error_on_missing = missing_log_probs == "error"
        self._current: _Segment | None = None
        self._closed: list[_Segment] = []
        # Turn-level counts live in the segments until finish() folds them in here.
        self._stats: dict[str, int] = dict.fromkeys(BuilderStatistics.__struct_fields__, 0)

    def classify(self, turn: TurnRecord) -> TurnKind:
        """How :meth:`add` would place ``turn`` given the tokens held now (changes nothing)."""
        return self._classify(turn)[0]

    def _classify(self, turn: TurnRecord) -> tuple[TurnKind, int]:
        seg = self._current
        if seg is None:
            return "start", 0
        return seg.place(turn.prompt_ids, len(turn.output_ids), self.fork_threshold_tokens)

    def _turns_in_chain(self) -> int:
        segs = [*self._closed, *([self._current] if self._current is not None else [])]
        return sum(len(seg.kinds) for seg in segs)

    def add(self, turn: TurnRecord) -> None:
        """Append one policy call to the chain.

        Raises:
            InvalidArgumentError: ``turn`` is not a TurnRecord; or its output would be trained
                without log-probs and ``missing_log_probs="error"``; or it is not clean and
                ``append_only`` (the builder is unchanged).
        """
        # The hot path of the builder: one memcmp and two appends per turn, kept inline.
        if type(turn) is not TurnRecord and not isinstance(turn, TurnRecord):
            raise InvalidArgumentError(f"add() takes a TurnRecord, not {type(turn).__name__}")
        out = turn.output_ids
        lp = turn.output_log_probs
        n_out = len(out)
        ill_formed = turn.ill_formed
        trained = not (ill_formed and self._mask_ill_formed)
        masked = not trained
        if trained and lp is None and n_out:
            if self._error_on_missing:
                raise InvalidArgumentError(
                    f"turn {self._turns_in_chain()} has {n_out} output tokens to train "
                    "but no output_log_probs (pass missing_log_probs='mask' to mask them)"
                )
            trained, masked = False, True

        prompt = turn.prompt_ids
        seg = self._current
        if seg is None:
            kind: TurnKind = "start"
            seg = self._current = _Segment(prompt, forked=False)
            held = seg.tokens
        else:
            held = seg.tokens
            n = len(held) >> 2
            # The common case inline (what place() checks first): the held tokens are a
            # prefix of the prompt, one memcmp over the raw int32 bytes.
            if len(prompt) >= n and held.startswith(prompt[:n]):
                kind = "clean"
                if len(prompt) > n:
                    held += prompt[n:]  # the prompt's new part: context
            else:
                kind, lcp = seg.place(prompt, n_out, self.fork_threshold_tokens)
                if self.append_only:
                    raise InvalidArgumentError(
                        f"turn {self._turns_in_chain()} is not append-only: its prompt differs "
                        f"from the held tokens at token {lcp} of {n}"
                    )
                if kind == "fork":
                    self._closed.append(seg)
                    seg = self._current = _Segment(prompt, forked=True)
                    held = seg.tokens
                else:  # realign
                    seg.cut(lcp)
                    held += prompt[lcp:]
        start = len(held) >> 2
        seg.last_response_start = start
        if n_out:
            if lp is not None and type(lp.obj) is not bytes:
                # The view's memory may change after this call (a read-only view of a mutable
                # array is shared, not copied): snapshot it now, as a copy into a buffer would.
                lp = float_view(memoryview(lp.tobytes()).cast("f"))
            seg.runs.append((start - seg.prompt_len, n_out, trained, lp))
            held += out
        seg.kinds.append(kind)
        seg.finish_reason = turn.finish_reason
        if ill_formed:
            seg.ill_formed += 1
        if masked:
            seg.masked += 1

    def finish(self, *, reward: float, metadata: dict[str, Any] | None = None) -> list[Sample]:
        """The chain's samples, in order; the builder is then empty (statistics stay).

        Every sample gets the full ``reward``, a shallow copy of ``metadata``, and under
        ``metadata["trajectory"]``: ``segment`` (its index among the chain's segments),
        ``segments``, ``turn_kinds`` (one of start/clean/realign/fork per turn),
        ``ill_formed_turns``, ``masked_turns`` and ``finish_reason`` (of its last turn). A
        sample whose last turn finished with ``"length"`` has status ``"truncated"``. Samples
        are then cut to ``max_sample_tokens`` (see :func:`truncate`), and those left without a
        trained token are dropped unless ``keep_untrained``.

        Raises:
            InvalidArgumentError: ``reward`` is not a finite number or ``metadata`` not a dict.
        """
        value = finite_reward(reward)
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidArgumentError(f"metadata must be a dict, not {type(metadata).__name__}")
        segments = self._closed
        if self._current is not None:
            segments.append(self._current)
        self._current, self._closed = None, []
        if not segments:
            return []
        stats = self._stats
        _fold_turn_counts(stats, segments)
        stats["chains"] += 1
        limit = self.max_sample_tokens
        keep_untrained = self.keep_untrained
        samples: list[Sample] = []
        for i, seg in enumerate(segments):
            md = dict(metadata) if metadata else {}
            md["trajectory"] = {
                "segment": i,
                "segments": len(segments),
                "turn_kinds": seg.kinds,
                "ill_formed_turns": seg.ill_formed,
                "masked_turns": seg.masked,
                "finish_reason": seg.finish_reason,
            }
            n_tokens = len(seg.tokens) >> 2
            size = n_tokens - seg.prompt_len  # the response region
            status: SampleStatus = "truncated" if seg.finish_reason == "length" else "completed"
            if limit is not None and n_tokens > limit:
                # truncate()'s rules, applied before the buffers are written: the cut tail
                # is never copied.
                size, status = cut_point(n_tokens, seg.prompt_len, status, md, limit)
                del seg.tokens[4 * limit :]
                stats["truncated_samples"] += 1
            mask, log_probs, trained = seg.buffers(size)
            if not trained and not keep_untrained:
                stats["dropped_samples"] += 1
                continue
            # Views of buffers nothing else references. Valid by construction (the property
            # tests decode every built sample through the checks).
            tokens = memoryview(seg.tokens).cast("i").toreadonly()
            samples.append(
                trusted_sample(
                    tokens=tokens,
                    loss_mask=memoryview(mask),
                    rollout_log_probs=float_view(memoryview(log_probs).cast("f")),
                    response_length=size,
                    reward=value,
                    status=status,
                    metadata=md,
                )
            )
            stats["samples"] += 1
            stats["tokens"] += len(tokens)
            stats["trained_tokens"] += trained
        return samples

    def statistics(self) -> BuilderStatistics:
        """A snapshot of the cumulative counters (turn counts include the unfinished chain)."""
        stats = dict(self._stats)
        _fold_turn_counts(stats, [*self._closed, *filter(None, [self._current])])
        return BuilderStatistics(**stats)


def _fold_turn_counts(stats: dict[str, int], segments: list[_Segment]) -> None:
    for seg in segments:
        kinds = seg.kinds
        stats["turns"] += len(kinds)
        stats["clean"] += kinds.count("clean")
        stats["realign"] += kinds.count("realign")
        stats["fork"] += kinds.count("fork")
        stats["ill_formed_turns"] += seg.ill_formed
        stats["masked_turns"] += seg.masked
        stats["fork_prefix_tokens"] += seg.fork_prefix
