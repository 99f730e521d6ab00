"""Records of one chain of policy calls whose prompts share one append-only token history.

An agent's next prompt is its previous prompt plus what was sampled plus the new observation.
:meth:`TurnRecorder.record` checks that (exactly: every held token is compared), converts only
the new tokens, and appends them to an int32 history that every record of the chain views: a
30-turn episode converts each token once instead of once per later turn, and its records hold
one copy of the history instead of thirty.

The check is the cost that remains, once per turn over the held tokens. For a list it is made
the cheapest exact way at hand:

* a prompt built by extending the previous Python lists holds the same int objects as the
  history: one lexicographic list comparison, against the held objects followed by an end
  marker, finds the first unequal item; CPython skips identical items with a pointer compare,
  so this reads no int object at all;
* a prompt of fresh int objects (a tokenizer's or a JSON decoder's output) is converted whole
  with ``array("I").fromlist``, the fastest exact reader of a list of ints at hand (one C call
  per item, about 7 ns), and its bytes compared with the history's by one memcmp. The new
  tokens are then already converted: each int is read once. A uint32 below ``2**31`` has the
  bits of the same int32, so while the history holds no negative id, equal bytes are equal
  ids; the new tokens' sign bits are checked (an id ``>= 2**31`` is an error). A negative id
  (which ``"I"`` refuses) takes the ``struct`` path.

Which check is tried first is chosen by looking at a few items; every check is exact, so the
choice affects only the speed. Buffers (``array.array``, numpy, views) are compared by memcmp.
"""

from __future__ import annotations

import struct
from array import array
from typing import Any

import msgspec

from .._errors import InvalidArgumentError
from ._buffers import (
    SIGN_BYTE,
    as_float32,
    as_int32,
    float_view,
    nonnegative,
    nonnegative_ids,
    pack,
)
from ._records import TurnRecord, trusted_turn

_MIN_CAPACITY = 1 << 14  # bytes of a new history buffer, at least
_pack = struct.pack
_nonnegative_ids = nonnegative_ids


class RecorderStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a :class:`TurnRecorder`.

    Attributes:
        turns: Records made.
        extended: Turns whose prompt extended the history (only its new tokens converted).
        restarted: Turns whose prompt did not extend it (the history starts over from that
            prompt; the first turn is not counted).
        converted_tokens: Prompt and output tokens written into the history.
    """

    turns: int = 0
    extended: int = 0
    restarted: int = 0
    converted_tokens: int = 0


class _EndMarker:
    """Ends the held objects in a list comparison: the comparison reaches it only if every
    held item equals the prompt's item at the same index (it then records that)."""

    __slots__ = ("reached",)

    def __init__(self) -> None:
        self.reached = False

    def __eq__(self, other: object) -> bool:
        return False

    __hash__ = None  # type: ignore[assignment]

    def __gt__(self, other: object) -> bool:  # ``item < marker``, reflected
        self.reached = True
        return False

    def __lt__(self, other: object) -> bool:  # ``marker < item``
        self.reached = True
        return False


class TurnRecorder:
    """Makes the :class:`TurnRecord` s of one chain (an agent session), sharing its history.

    Use one per chain, in turn order::

        recorder = TurnRecorder()
        turn = recorder.record(prompt_ids=prompt, output_ids=out.output_ids,
                               output_log_probs=out.log_probs, finish_reason=out.finish_reason)

    Each record equals ``TurnRecord.from_lists`` of the same arguments. Its ``prompt_ids`` and
    ``output_ids`` are read-only views of the recorder's history, which only ever grows: no
    record's tokens change afterwards, whatever the caller does with its lists or arrays.
    A prompt that does not extend the history (a client re-rendered it) is converted whole and
    becomes the new history; older records keep theirs.
    """

    def __init__(self) -> None:
        self._buf = bytearray(_MIN_CAPACITY)
        self._w = memoryview(self._buf)
        self._used = 0  # bytes of the history: the last prompt and its output
        # The history as the caller's int objects while its prompts are built by extending
        # its lists; given up for good once a list prompt holds other objects (keeping them
        # would only cost memory).
        self._objects: list[Any] | None = None
        self._track_objects = True
        # Whether the history holds an id < 0: its bytes then also match a uint32 >= 2**31.
        self._negative = False
        self._stats = dict.fromkeys(RecorderStatistics.__struct_fields__, 0)

    def statistics(self) -> RecorderStatistics:
        """A snapshot of the counters."""
        return RecorderStatistics(**self._stats)

    def record(
        self,
        *,
        prompt_ids: Any,
        output_ids: Any,
        output_log_probs: Any = None,
        finish_reason: str = "stop",
        ill_formed: bool = False,
    ) -> TurnRecord:
        """A record of one policy call, its prompt checked against the history held.

        Args:
            prompt_ids: The whole prompt: a list or tuple of ints, or an int32-compatible
                buffer (what :class:`TurnRecord` accepts).
            output_ids: The sampled ids (list, tuple or buffer).
            output_log_probs: One log-prob per output id, or None.
            finish_reason: The server's finish reason.
            ill_formed: The output did not parse.

        Raises:
            InvalidArgumentError: as :meth:`TurnRecord.from_lists` (an id that does not fit
                int32, a length mismatch, a wrong type); the recorder is then unchanged.
        """
        if not isinstance(finish_reason, str):
            raise InvalidArgumentError(
                f"finish_reason must be a str, not {type(finish_reason).__name__}"
            )
        if not isinstance(ill_formed, bool):
            raise InvalidArgumentError(
                f"ill_formed must be a bool, not {type(ill_formed).__name__}"
            )
        # The hot path inline (each call costs more than its work here: see _extend_to).
        out: bytes | memoryview | None = None
        if type(output_ids) is list:
            out = _nonnegative_ids(output_ids)
        out_known = out is not None
        if out is None:
            out = _int32_bytes(output_ids, "output_ids")
        lps: memoryview | None = None
        if type(output_log_probs) is list:
            try:
                lps = memoryview(_pack(f"={len(output_log_probs)}f", *output_log_probs))
            except (struct.error, OverflowError, TypeError):
                pass  # _log_probs names the bad item
        if lps is not None:
            lps = float_view(lps.cast("f"))
        elif output_log_probs is not None:
            lps = _log_probs(output_log_probs)
        if lps is not None and 4 * len(lps) != len(out):
            raise InvalidArgumentError(
                f"output_log_probs has {len(lps)} entries for {len(out) // 4} output_ids"
            )
        converted = self._extend_to(prompt_ids)
        prompt_end = self._used
        self._append(out, out_known)
        if self._objects is not None:
            self._follow_output(output_ids)
        stats = self._stats
        stats["turns"] += 1
        stats["converted_tokens"] += converted + len(out) // 4
        # Views taken after the append: of the newest buffer, which holds the prompt too.
        w = self._w
        return trusted_turn(  # every field checked above (the property tests compare)
            prompt_ids=w[:prompt_end].cast("i").toreadonly(),
            output_ids=w[prompt_end : self._used].cast("i").toreadonly(),
            output_log_probs=lps,
            finish_reason=finish_reason,
            ill_formed=ill_formed,
        )

    # -- the history ---------------------------------------------------------------------

    def _append(self, data: bytes | memoryview, nonnegative_known: bool = False) -> None:
        """Write ``data`` after the history, growing into a new buffer if it does not fit
        (the old one stays as it is, for the records that view it)."""
        if not (nonnegative_known or self._negative):
            self._negative = not nonnegative(data if type(data) is bytes else bytes(data))
        used, n = self._used, len(data)
        if used + n > len(self._buf):
            grown = bytearray(max(2 * len(self._buf), 2 * (used + n)))
            grown[:used] = self._w[:used]
            self._buf, self._w = grown, memoryview(grown)
        # A same-size slice assignment: allowed while records export the buffer, and the
        # bytes written were never viewed.
        self._w[used : used + n] = data
        self._used = used + n

    def _restart(self, data: bytes | memoryview, nonnegative_known: bool = False) -> None:
        """The history becomes ``data``, in a new buffer (viewed bytes are never rewritten)."""
        self._buf = bytearray(max(2 * len(data), _MIN_CAPACITY))
        self._w = memoryview(self._buf)
        self._used = 0
        self._negative = False
        self._append(data, nonnegative_known)

    def _extend_to(self, prompt: Any) -> int:
        """Make the history ``prompt``: append its new tokens if it extends the history, else
        start over from it. Returns the number of tokens written. Raises before changing
        anything if the prompt holds a bad id."""
        held = self._used // 4
        if not isinstance(prompt, (list, tuple)):
            whole = _int32_bytes(prompt, "prompt_ids")
            self._objects = None
            return self._extend_or_restart(whole)
        if type(prompt) is not list:
            prompt = list(prompt)  # what struct would iterate (a subclass may differ)
        objects = self._objects
        if objects is not None and len(prompt) >= held:
            if _same_objects(objects, prompt):
                if _starts_with(prompt, objects):
                    tail = prompt[held:]
                    data = _nonnegative_ids(tail)
                    if data is None:
                        self._append(_int32_bytes(tail, "prompt_ids"))
                    else:
                        self._append(data, True)
                    objects.extend(tail)
                    self._stats["extended"] += 1
                    return len(tail)
            else:
                self._track_objects = False  # fresh objects: stop keeping them
                self._objects = objects = None
        # nonnegative_ids without its copy: only the new tokens are copied (and checked).
        # Inline, as the calls of this path cost more than their work, most likely because
        # the caller's big lists, made and freed between turns, leave the caches cold.
        arr = array("I")
        try:
            arr.fromlist(prompt)
        except Exception:  # a negative id or a bad item: struct converts it or names the item
            written = self._extend_or_restart(_int32_bytes(prompt, "prompt_ids"))
        else:
            raw = memoryview(arr).cast("B")
            used = self._used
            # Not with a negative id held: the prompt holds none, so it cannot extend.
            if (
                self._stats["turns"]
                and not self._negative
                and len(raw) >= used
                and self._buf.startswith(raw[:used])
            ):
                tail = raw[used:].tobytes()
                if tail[SIGN_BYTE::4].isascii():  # all < 2**31 (the held part matched ids >= 0)
                    self._append(tail, True)
                    self._stats["extended"] += 1
                    return len(tail) // 4
            whole = raw.tobytes()
            if not nonnegative(whole):
                _int32_bytes(prompt, "prompt_ids")  # raises, naming the id >= 2**31
                raise AssertionError("unreachable")  # pragma: no cover
            if self._stats["turns"]:
                self._stats["restarted"] += 1
            self._restart(whole, True)
            written = len(whole) // 4
        self._objects = list(prompt) if self._track_objects else None
        return written

    def _extend_or_restart(self, whole: bytes | memoryview) -> int:
        used = self._used
        n = len(whole) // 4
        first = self._stats["turns"] == 0
        # One memcmp: the held bytes against the prompt's first ``used`` bytes.
        if not first and n >= used // 4 and self._buf.startswith(memoryview(whole)[:used]):
            self._append(memoryview(whole)[used:])
            self._stats["extended"] += 1
            return n - used // 4
        if not first:
            self._stats["restarted"] += 1
        self._restart(whole)
        return n

    def _follow_output(self, output_ids: Any) -> None:
        """Extend the held objects by the output (or drop them)."""
        if self._objects is not None:
            if isinstance(output_ids, (list, tuple)):
                self._objects.extend(output_ids)
            else:
                self._objects = None


def _int32_bytes(value: Any, name: str) -> bytes | memoryview:
    """``value`` as int32 bytes (a 'B' view or bytes; an int32 buffer is not copied first:
    the history copies it at once)."""
    if isinstance(value, (list, tuple)):
        data = pack(value, "i")
        if data is None:
            as_int32(value, name)  # raises, naming the bad item
            raise AssertionError("unreachable")  # pragma: no cover
        return data
    try:
        mv = memoryview(value)
    except TypeError:
        mv = None
    if mv is not None and mv.format == "i" and mv.ndim == 1 and mv.c_contiguous:
        return mv.cast("B")
    return as_int32(value, name).cast("B")


def _log_probs(value: Any) -> memoryview:
    if isinstance(value, (list, tuple)):
        data = pack(value, "f")
        if data is not None:
            return float_view(memoryview(data).cast("f"))
    lps = as_float32(value, "output_log_probs")
    if type(lps.obj) is not bytes:
        # A shared view of memory the caller may change later: snapshot it.
        lps = float_view(memoryview(lps.tobytes()).cast("f"))
    return lps


def _same_objects(held: list[Any], prompt: list[Any]) -> bool:
    """Whether ``prompt`` seems to hold the history's own int objects (a few items looked at;
    the answer only picks the faster exact check)."""
    n = len(held)
    return n > 0 and prompt[n - 1] is held[n - 1] and prompt[n // 2] is held[n // 2]


def _starts_with(prompt: list[Any], held: list[Any]) -> bool:
    """Exactly whether ``prompt[:len(held)] == held``, in one pass and without a slice.

    ``prompt < held + [marker]`` compares item by item up to the first unequal pair; if that
    is the marker, every held item matched. Identical items are skipped by a pointer compare
    (others compare by value: an item equal to the held id, such as ``5.0`` for 5, counts as
    that id).
    """
    n = len(held)
    if len(prompt) == n:
        return prompt == held
    marker = _EndMarker()
    held.append(marker)
    try:
        prompt < held  # noqa: B015  # evaluated for the marker's side effect
    except TypeError:  # an item that does not compare with an int: the slow path names it
        return False
    finally:
        held.pop()
    return marker.reached
