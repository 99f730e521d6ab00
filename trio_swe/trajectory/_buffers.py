"""Typed, read-only, contiguous buffers: the storage of token ids, loss masks and log-probs.

Every buffer in a record is a one-dimensional, C-contiguous, read-only :class:`memoryview` with
a native single-character format: ``"i"`` (int32) for token ids, ``"B"`` (uint8) for the loss
mask, ``"f"`` (float32) for log-probs. Such a view slices in O(1), hands its memory to
``numpy.frombuffer`` without a copy, and msgspec writes it to msgpack as one ``bin`` blob.

The coercion helpers accept whatever callers naturally hold (lists, ``array.array``, numpy
arrays, raw little-endian bytes, views). A read-only buffer of the right layout is shared; a
writable one is copied (a record must not change when its source does); lists and other
layouts are converted.
"""

from __future__ import annotations

import array
import struct
import sys
from collections.abc import Iterable
from typing import Any, cast

from .._errors import InvalidArgumentError

# The wire format (msgpack bin) is the in-memory layout, so it is little-endian int32/float32.
LITTLE_ENDIAN = sys.byteorder == "little"
if any(array.array(t).itemsize != 4 for t in "iIf"):  # pragma: no cover
    raise ImportError("trio_swe.trajectory needs a platform with 4-byte C int and float")
#: Index of each native int32's most significant byte (the one holding the sign bit).
SIGN_BYTE = 3 if LITTLE_ENDIAN else 0

_BYTE_FORMATS = frozenset({"B", "b", "c"})
_INT32_FORMATS = frozenset({"i", "@i", "=i", "<i", "l", "@l", "=l", "<l"})
_FLOAT32_FORMATS = frozenset({"f", "@f", "=f", "<f"})
_MASK_FORMATS = frozenset({"B", "b", "c", "?", "@B", "=B", "<B", "@?", "=?"})


def float_view(mv: memoryview[float]) -> memoryview:
    """Typeshed types a view by its items; record fields are plain ``memoryview`` (msgspec
    evaluates field annotations at runtime, where ``memoryview[float]`` does not exist)."""
    return cast(memoryview, mv)


def _view(value: object) -> memoryview | None:
    """A memoryview of ``value`` if it exposes the buffer protocol, else None."""
    if isinstance(value, memoryview):
        return value
    if isinstance(value, str):
        return None
    try:
        return memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def nonnegative_ids(items: list[Any]) -> bytes | None:
    """``items`` as native int32 bytes if every item is an int in ``[0, 2**31)`` (all real
    token ids), else None (negative, too large, not an int: slower paths decide).

    The fastest exact reader of a list of ints at hand (about 3x ``struct`` and 6x
    ``array("i")``): ``array("I").fromlist`` converts each item with one C call, where the
    signed typecodes parse a format string per item. For a value in ``[0, 2**31)`` its uint32
    bytes are the int32 bytes of the same id; no sign bit set (:func:`nonnegative`) says
    every value is below ``2**31``.
    """
    arr = array.array("I")
    try:
        arr.fromlist(items)
    except Exception:  # whatever the item raised, the struct path raises it again or names it
        return None
    data = arr.tobytes()
    return data if data[SIGN_BYTE::4].isascii() else None


def nonnegative(data: bytes) -> bool:
    """Whether no int32 in the native bytes ``data`` has its sign bit set (every id >= 0, or,
    read as uint32, every value < ``2**31``): one strided copy and one C scan."""
    return data[SIGN_BYTE::4].isascii()


def pack(items: list[Any] | tuple[Any, ...], typecode: str) -> bytes | None:
    """``items`` as native int32 (``"i"``) or float32 (``"f"``) bytes, or None if some item
    does not pack (out of range, wrong type: the caller's slower path then names it).

    Ids in ``[0, 2**31)`` (all real token ids) go through :func:`nonnegative_ids`; others, and
    floats, through ``struct``, about 4x faster than ``array.array("i")`` or ``"f"`` (which
    parse a format string per item). The result is immutable bytes: a record's buffer with no
    more copies. For in-range values all give the same bits (round-to-nearest for float32).
    """
    if typecode == "i":
        data = nonnegative_ids(items if type(items) is list else list(items))
        if data is not None:
            return data
    try:
        return struct.pack(f"={len(items)}{typecode}", *items)
    except (struct.error, OverflowError, TypeError):
        return None


def _from_iterable(value: object, typecode: str, name: str) -> memoryview:
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Iterable):
        raise InvalidArgumentError(
            f"{name} must be a sequence of numbers or a buffer, not {type(value).__name__}"
        )
    if typecode != "B":
        items = value if isinstance(value, (list, tuple)) else list(value)
        data = pack(items, typecode)
        if data is not None:
            fast: memoryview = memoryview(data).cast(typecode)  # type: ignore[call-overload]
            return fast
        value = items  # array.array's errors below name the bad item
    try:
        arr = array.array(typecode, value)
    except OverflowError as exc:
        kind = "int32" if typecode == "i" else "uint8"
        raise InvalidArgumentError(f"{name} holds a value out of range for {kind}: {exc}") from None
    except TypeError as exc:
        raise InvalidArgumentError(f"{name} holds a value of the wrong type: {exc}") from None
    # Over immutable bytes (one more memcpy): a record made from lists can be shared as is.
    view: memoryview = memoryview(arr.tobytes()).cast(typecode)  # type: ignore[call-overload]
    return view


def _convert(value: object, mv: memoryview, typecode: str, name: str) -> memoryview:
    """Element-by-element conversion of a buffer of another layout (e.g. numpy int64)."""
    try:
        items: object = mv.tolist()
    except NotImplementedError:  # a format memoryview cannot unpack (e.g. big-endian ">i")
        items = value
    return _from_iterable(items, typecode, name)


def _is_raw(value: object, mv: memoryview) -> bool:
    """Python's own bytes-like objects with a byte format hold raw little-endian data (what
    msgpack decoding hands over); a numpy uint8 array or ``array("B")`` holds numbers."""
    return (
        isinstance(value, (bytes, bytearray, memoryview))
        and mv.c_contiguous
        and mv.format in _BYTE_FORMATS
    )


def _flat(mv: memoryview, name: str) -> memoryview:
    if mv.ndim != 1:
        raise InvalidArgumentError(f"{name} must be one-dimensional, got {mv.ndim} dimensions")
    return mv


def _raw(mv: memoryview) -> memoryview:
    """The bytes of a contiguous view, read-only: shared if ``mv`` is read-only, else copied
    (a record must not change when the caller later writes to its array)."""
    if mv.readonly:
        try:
            return mv.cast("B")
        except TypeError:  # a non-native format spelling such as "<i": copy instead
            pass
    return memoryview(mv.tobytes())


def as_int32(value: object, name: str) -> memoryview:
    """``value`` as a read-only int32 view.

    Read-only int32 buffers (``bytes``, our own views) are shared; writable ones (numpy arrays,
    ``array.array``) are copied with one memcpy; other layouts are converted.

    Raises:
        InvalidArgumentError: ``value`` is not a flat sequence of int32-representable integers,
            or raw bytes whose length is not a multiple of 4.
    """
    mv = _view(value)
    if mv is None:
        return _from_iterable(value, "i", name)
    if mv.format == "i" and mv.readonly and mv.c_contiguous:
        return mv  # the common case: already one of ours
    _flat(mv, name)
    fmt = mv.format
    if _is_raw(value, mv):
        if mv.nbytes % 4:
            raise InvalidArgumentError(f"{name}: {mv.nbytes} bytes is not a whole number of int32")
        return _raw(mv).cast("i").toreadonly()
    if mv.c_contiguous and fmt in _INT32_FORMATS and mv.itemsize == 4:
        return _raw(mv).cast("i").toreadonly()
    if fmt.lstrip("@=<>!") in ("b", "B", "h", "H", "i", "I", "l", "L", "q", "Q", "n", "N"):
        # Other integer widths (numpy int64 is the usual one): convert element by element.
        return _convert(value, mv, "i", name)
    raise InvalidArgumentError(f"{name} must hold integers, got a buffer of format {fmt!r}")


def as_float32(value: object, name: str) -> memoryview:
    """``value`` as a read-only float32 view (shared, copied or converted as in :func:`as_int32`).

    Raises:
        InvalidArgumentError: ``value`` is not a flat sequence of numbers, or raw bytes whose
            length is not a multiple of 4.
    """
    mv = _view(value)
    if mv is None:
        return _from_iterable(value, "f", name)
    if mv.format == "f" and mv.readonly and mv.c_contiguous:
        return mv
    _flat(mv, name)
    fmt = mv.format
    if _is_raw(value, mv):
        if mv.nbytes % 4:
            raise InvalidArgumentError(
                f"{name}: {mv.nbytes} bytes is not a whole number of float32"
            )
        return float_view(_raw(mv).cast("f").toreadonly())
    if mv.c_contiguous and fmt in _FLOAT32_FORMATS:
        return float_view(_raw(mv).cast("f").toreadonly())
    if fmt.lstrip("@=<>!") in ("e", "f", "d"):
        return _convert(value, mv, "f", name)
    raise InvalidArgumentError(f"{name} must hold floats, got a buffer of format {fmt!r}")


def as_mask(value: object, name: str) -> memoryview:
    """``value`` as a read-only uint8 view whose every element is 0 or 1 (shared, copied or
    converted as in :func:`as_int32`).

    Raises:
        InvalidArgumentError: ``value`` is not flat, or holds a value other than 0 and 1.
    """
    mv = _view(value)
    if mv is None:
        mv = _from_iterable(value, "B", name)
    elif not (mv.c_contiguous and mv.itemsize == 1 and mv.format in _MASK_FORMATS):
        _flat(mv, name)
        mv = _convert(value, mv, "B", name)
    raw = mv.tobytes()
    # One C pass: delete every 0 and 1; anything left is invalid. (Faster than two counts.)
    rest = raw.translate(None, b"\x00\x01")
    if rest:
        raise InvalidArgumentError(f"{name} must hold only 0 and 1, found {rest[0]}")
    if mv.format == "B" and mv.readonly:
        return mv
    return memoryview(raw)  # the copy made for the check: owned, immutable


def common_prefix_bytes(held: bytes | bytearray, other: memoryview) -> int:
    """Length in bytes of the longest common prefix of ``held`` and ``other`` (a 'B' view).

    ``bytearray.startswith`` is a memcmp, about 100x faster than comparing memoryviews, so the
    common (fully matching) case costs one memcmp and a mismatch a binary search of memcmps.
    """
    n = min(len(held), len(other))
    if held.startswith(other[:n]):
        return n
    lo, hi = 0, n  # invariant: prefix of length lo matches, of length hi does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if held.startswith(other[:mid]):
            lo = mid
        else:
            hi = mid
    return lo


def describe(mv: memoryview) -> str:
    """A short repr of a buffer for error messages and reprs: its length and first items."""
    head: list[Any] = mv[:6].tolist()
    more = ", ..." if len(mv) > 6 else ""
    return f"<{mv.format} x{len(mv)} [{', '.join(map(str, head))}{more}]>"
