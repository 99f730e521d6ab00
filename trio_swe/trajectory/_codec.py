"""Codecs: msgpack (zero-copy decode), JSON (for people), and a streaming file of samples.

msgpack: a :class:`Sample` is a map whose buffers are ``bin`` blobs holding little-endian
int32/uint8/float32. Decoding returns views into the input, so a decoded sample costs a few
small allocations whatever its length. Padding entries (keys ``"_0"``, ``"_1"``, ignored when
decoding) place the int32 and float32 data at offsets that are multiples of 4 from the start of
the message, so views of a decoded ``bytes`` object are aligned for numpy and torch.

File (``write_samples``/``read_samples``): an 8-byte magic ``b"TSWSMP\\x00\\x01"``, then per
sample an 8-byte little-endian length and that many bytes of msgpack. Reading streams one
sample at a time.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from .._errors import ConfigError, SampleDecodeError
from ._buffers import LITTLE_ENDIAN
from ._records import Sample, SampleStatus

FILE_MAGIC = b"TSWSMP\x00\x01"
_LENGTH = struct.Struct("<Q")

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Sample)


def _check_host() -> None:
    if not LITTLE_ENDIAN:  # pragma: no cover - no big-endian CI
        raise ConfigError("the sample codecs write the in-memory layout: a little-endian host")


_PADS = tuple(b"\x00" * k for k in range(4))


def _bin_header_size(n: int) -> int:
    return 2 if n < 0x100 else 3 if n < 0x10000 else 5


def _pad_at(offset: int, key_size: int, nbytes: int) -> tuple[bytes, int]:
    """The pad for an entry ``"_i": bin(k)`` (5 + k bytes) starting at ``offset`` that puts the
    data of the bin entry after it (key of ``key_size`` bytes) on a multiple of 4; and the
    offset where that data ends."""
    head = 5 + key_size + _bin_header_size(nbytes)
    k = -(offset + head) % 4
    return _PADS[k], offset + head + k + nbytes


def _wire(sample: Sample) -> dict[str, Any]:
    """The map msgpack writes for ``sample``, with its alignment pads."""
    if not isinstance(sample, Sample):
        raise TypeError(f"expected a Sample, not {type(sample).__name__}")
    tokens, lp = sample.tokens, sample.rollout_log_probs
    # Sizes are known in advance: the fixmap header is 1 byte, the keys "tokens" 7 and
    # "rollout_log_probs" 18 (fixstr).
    pad0, end = _pad_at(1, 7, tokens.nbytes)
    pad1, _ = _pad_at(end, 18, lp.nbytes)
    return {
        "_0": pad0,
        "tokens": tokens,
        "_1": pad1,
        "rollout_log_probs": lp,
        "loss_mask": sample.loss_mask,
        "response_length": sample.response_length,
        "reward": sample.reward,
        "status": sample.status,
        "metadata": sample.metadata,
    }


def encode_sample(sample: Sample) -> bytes:
    """``sample`` as msgpack; its buffers are written as ``bin`` (one memcpy each).

    The int32 and float32 data start at multiples of 4 from the start of the message.

    Raises:
        TypeError: ``sample`` is not a Sample, or its metadata holds a value msgspec cannot
            encode.
    """
    _check_host()
    return _encoder.encode(_wire(sample))


def decode_sample(data: bytes | bytearray | memoryview) -> Sample:
    """A sample from :func:`encode_sample` output, its buffers views into ``data`` (no copy).

    The sample keeps ``data`` alive. Pass ``bytes`` (immutable); a mutable buffer would let the
    sample change under you.

    Raises:
        SampleDecodeError: ``data`` is not a valid encoded sample (malformed msgpack, a missing
            or mistyped field, or fields that break the sample invariants).
    """
    _check_host()
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SampleDecodeError(f"not an encoded Sample: {exc}") from exc


class _SampleJSON(msgspec.Struct, kw_only=True):
    """The JSON shape: buffers as plain lists of numbers."""

    tokens: list[int]
    loss_mask: list[int]
    rollout_log_probs: list[float]
    response_length: int
    reward: float = 0.0
    status: SampleStatus = "completed"
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(_SampleJSON)


def encode_sample_json(sample: Sample) -> bytes:
    """``sample`` as JSON with the buffers as lists of numbers, for reading and diffing.

    Log-probs are float32 values printed as the shortest float64 that reads back as the same
    float32. Non-finite log-probs cannot be written (JSON has no NaN) and raise ValueError.
    """
    if not isinstance(sample, Sample):
        raise TypeError(f"encode_sample_json takes a Sample, not {type(sample).__name__}")
    lp = sample.rollout_log_probs_list()
    if any(x != x or x in (float("inf"), float("-inf")) for x in lp):
        raise ValueError("rollout_log_probs holds a non-finite value, which JSON cannot carry")
    return _json_encoder.encode(
        _SampleJSON(
            tokens=sample.tokens.tolist(),
            loss_mask=sample.loss_mask.tolist(),
            rollout_log_probs=lp,
            response_length=sample.response_length,
            reward=sample.reward,
            status=sample.status,
            metadata=sample.metadata,
        )
    )


def decode_sample_json(data: bytes | str) -> Sample:
    """A sample from :func:`encode_sample_json` output (the buffers are new copies).

    Raises:
        SampleDecodeError: ``data`` is not a valid JSON sample.
    """
    try:
        js = _json_decoder.decode(data)
        return Sample(
            tokens=js.tokens,  # type: ignore[arg-type]  # coerced in __post_init__
            loss_mask=js.loss_mask,  # type: ignore[arg-type]
            rollout_log_probs=js.rollout_log_probs,  # type: ignore[arg-type]
            response_length=js.response_length,
            reward=js.reward,
            status=js.status,
            metadata=js.metadata,
        )
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
        raise SampleDecodeError(f"not a JSON Sample: {exc}") from exc


def write_samples(path: str | os.PathLike[str], samples: Iterable[Sample]) -> int:
    """Write ``samples`` (any iterable, consumed lazily) to a file at ``path``; returns the count.

    The file appears atomically: samples go to a temporary file in the same directory, renamed
    over ``path`` once all are written. If anything fails (or the iterable raises), the
    temporary file is removed and ``path`` is untouched.
    """
    _check_host()
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    count = 0
    buf = bytearray()  # reused: each record is encoded in place after its length prefix
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(FILE_MAGIC)
            for sample in samples:
                _encoder.encode_into(_wire(sample), buf, _LENGTH.size)
                _LENGTH.pack_into(buf, 0, len(buf) - _LENGTH.size)
                f.write(buf)
                count += 1
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return count


def read_samples(path: str | os.PathLike[str]) -> Iterator[Sample]:
    """Stream the samples of a file written by :func:`write_samples`, one at a time.

    Each sample's buffers are views into its own record's bytes (one read per sample).

    Raises:
        SampleDecodeError: the file does not start with the magic, ends inside a record, or a
            record does not decode (the message names the record's index).
        OSError: the file cannot be opened or read.
    """
    _check_host()
    path = os.fspath(path)
    with open(path, "rb") as f:
        magic = f.read(len(FILE_MAGIC))
        if magic != FILE_MAGIC:
            raise SampleDecodeError(f"{path}: not a trio_swe sample file (bad magic {magic!r})")
        index = 0
        while True:
            head = f.read(_LENGTH.size)
            if not head:
                return
            if len(head) != _LENGTH.size:
                raise SampleDecodeError(f"{path}: file ends inside the length of record {index}")
            (size,) = _LENGTH.unpack(head)
            left = os.fstat(f.fileno()).st_size - f.tell()
            if size > left:  # checked first: a corrupt length must not allocate petabytes
                raise SampleDecodeError(
                    f"{path}: record {index} needs {size} bytes, the file holds {left}"
                )
            data = f.read(size)
            try:
                sample = decode_sample(data)
            except SampleDecodeError as exc:
                raise SampleDecodeError(f"{path}: record {index}: {exc}") from exc
            yield sample
            index += 1
