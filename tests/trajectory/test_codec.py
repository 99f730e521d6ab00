"""Codecs: msgpack (zero-copy decode), JSON, streaming files; and truncation edge cases."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from trio_swe import (
    InvalidArgumentError,
    Sample,
    SampleDecodeError,
    decode_sample,
    decode_sample_json,
    encode_sample,
    encode_sample_json,
    read_samples,
    truncate,
    write_samples,
)
from trio_swe.trajectory._codec import FILE_MAGIC


def make(n: int, *, prompt: int = 2, seed: int = 0) -> Sample:
    rl = n - prompt
    return Sample.from_lists(
        tokens=[(seed * 7 + i) % 50_000 for i in range(n)],
        loss_mask=[i % 2 for i in range(rl)],
        rollout_log_probs=[-(i % 9) / 4 for i in range(rl)],
        reward=float(seed),
        metadata={"seed": seed, "nested": {"k": [1, "x", None]}},
    )


# --- msgpack ----------------------------------------------------------------------------------


def test_msgpack_buffers_are_bin_and_decoded_as_views() -> None:
    s = make(100)
    data = encode_sample(s)
    raw = msgspec.msgpack.decode(data)  # untyped: shows the wire shape
    assert list(raw) == [
        "_0",
        "tokens",
        "_1",
        "rollout_log_probs",
        "loss_mask",
        "response_length",
        "reward",
        "status",
        "metadata",
    ]
    assert len(raw["_0"]) < 4
    assert len(raw["_1"]) < 4
    assert data.index(s.tokens.tobytes()) % 4 == 0
    assert isinstance(raw["tokens"], bytes)
    assert len(raw["tokens"]) == 400
    assert len(raw["loss_mask"]) == 98
    assert len(raw["rollout_log_probs"]) == 392
    back = decode_sample(data)
    assert back == s
    assert back.tokens.obj is data
    # From a memoryview slice of a larger buffer too (e.g. a file record).
    framed = b"xx" + data
    assert decode_sample(memoryview(framed)[2:]) == s


def test_decode_rejects_invalid_data() -> None:
    good = msgspec.msgpack.decode(encode_sample(make(6)))
    with pytest.raises(SampleDecodeError, match="not an encoded Sample"):
        decode_sample(b"\xc1garbage")
    with pytest.raises(SampleDecodeError, match="loss_mask must hold only 0 and 1"):
        decode_sample(msgspec.msgpack.encode({**good, "loss_mask": b"\x00\x02\x00\x01"}))
    with pytest.raises(SampleDecodeError, match="response_length"):
        decode_sample(msgspec.msgpack.encode({**good, "response_length": 3}))
    with pytest.raises(SampleDecodeError, match="not a whole number of int32"):
        decode_sample(msgspec.msgpack.encode({**good, "tokens": b"\x00" * 5}))
    with pytest.raises(SampleDecodeError, match="status"):
        decode_sample(msgspec.msgpack.encode({**good, "status": "pending"}))
    with pytest.raises(SampleDecodeError, match="tokens"):
        decode_sample(msgspec.msgpack.encode({k: v for k, v in good.items() if k != "tokens"}))
    assert isinstance(SampleDecodeError("x"), ValueError)


def test_encode_rejects_non_samples() -> None:
    with pytest.raises(TypeError):
        encode_sample({"tokens": []})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode_sample_json({"tokens": []})  # type: ignore[arg-type]


# --- JSON -------------------------------------------------------------------------------------


def test_json_is_readable_lists() -> None:
    s = make(5)
    text = encode_sample_json(s)
    d = json.loads(text)
    assert d["tokens"] == [0, 1, 2, 3, 4]
    assert d["loss_mask"] == [0, 1, 0]
    assert d["rollout_log_probs"] == [0.0, -0.25, -0.5]
    assert d["status"] == "completed"
    assert decode_sample_json(text) == s
    assert decode_sample_json(text.decode()) == s


def test_json_refuses_non_finite_and_bad_input() -> None:
    s = Sample.from_lists(tokens=[1], loss_mask=[0], rollout_log_probs=[-math.inf])
    with pytest.raises(ValueError, match="non-finite"):
        encode_sample_json(s)
    with pytest.raises(SampleDecodeError):
        decode_sample_json(b'{"tokens": [1]}')
    with pytest.raises(SampleDecodeError, match="only 0 and 1"):
        decode_sample_json(
            b'{"tokens":[1],"loss_mask":[3],"rollout_log_probs":[0.0],"response_length":1}'
        )


# --- files ------------------------------------------------------------------------------------


def test_file_roundtrip_streams(tmp_path: Path) -> None:
    samples = [make(10 + i, seed=i) for i in range(40)]
    path = tmp_path / "s.bin"
    assert write_samples(path, iter(samples)) == 40
    assert path.read_bytes().startswith(FILE_MAGIC)
    it = read_samples(path)
    assert isinstance(it, Iterator)
    assert next(it) == samples[0]  # lazily, one record at a time
    assert list(it) == samples[1:]
    assert list(read_samples(str(path))) == samples
    assert write_samples(tmp_path / "empty.bin", []) == 0
    assert list(read_samples(tmp_path / "empty.bin")) == []


def test_write_is_atomic_and_cleans_up(tmp_path: Path) -> None:
    path = tmp_path / "s.bin"
    write_samples(path, [make(5)])
    before = path.read_bytes()

    def failing() -> Iterator[Sample]:
        yield make(6)
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        write_samples(path, failing())
    assert path.read_bytes() == before  # the old file is untouched
    assert os.listdir(tmp_path) == ["s.bin"]  # and no temporary file is left
    with pytest.raises(TypeError):
        write_samples(path, [make(6), "not a sample"])  # type: ignore[list-item]
    unencodable = Sample.from_lists(
        tokens=[1], loss_mask=[], rollout_log_probs=[], metadata={"x": object()}
    )
    with pytest.raises(TypeError):
        write_samples(path, [unencodable])
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["s.bin"]
    with pytest.raises(FileNotFoundError):
        write_samples(tmp_path / "missing" / "s.bin", [make(5)])


def test_read_rejects_corrupt_files(tmp_path: Path) -> None:
    good = tmp_path / "good.bin"
    write_samples(good, [make(8), make(9)])
    data = good.read_bytes()
    bad = tmp_path / "bad.bin"

    bad.write_bytes(b"NOTMAGIC" + data[8:])
    with pytest.raises(SampleDecodeError, match="bad magic"):
        list(read_samples(bad))

    bad.write_bytes(data[:-3])  # ends inside record 1: record 0 still arrives
    it = read_samples(bad)
    assert next(it) == make(8)
    with pytest.raises(SampleDecodeError, match="record 1 needs"):
        next(it)

    bad.write_bytes(data + b"\x01\x02")
    with pytest.raises(SampleDecodeError, match="inside the length of record 2"):
        list(read_samples(bad))

    huge = FILE_MAGIC + (2**62).to_bytes(8, "little") + b"x" * 10
    bad.write_bytes(huge)
    with pytest.raises(SampleDecodeError, match="record 0 needs"):
        list(read_samples(bad))

    rec = b"\xc1\xc1\xc1"
    bad.write_bytes(FILE_MAGIC + len(rec).to_bytes(8, "little") + rec)
    with pytest.raises(SampleDecodeError, match="record 0: not an encoded Sample"):
        list(read_samples(bad))


# --- truncation -------------------------------------------------------------------------------


def test_truncate_keeps_head_and_marks_status() -> None:
    s = make(10, prompt=4)
    cut = truncate(s, 6)
    assert cut.tokens_list() == s.tokens_list()[:6]
    assert cut.response_length == 2
    assert cut.loss_mask_list() == [0, 1]
    assert cut.rollout_log_probs_list() == [0.0, -0.25]
    assert cut.status == "truncated"
    assert cut.metadata["truncated_from"] == 10
    assert "truncated_from" not in s.metadata  # the input is untouched
    assert cut.tokens.obj is s.tokens.obj  # a view, not a copy
    assert truncate(s, 10) is s
    assert truncate(s, 11) is s
    # Truncating a truncated sample keeps the original length.
    assert truncate(cut, 5).metadata["truncated_from"] == 10


@pytest.mark.parametrize("limit", [0, 3, 4])
def test_truncate_into_prompt_aborts(limit: int) -> None:
    s = make(10, prompt=4)
    cut = truncate(s, limit)
    assert cut.status == "aborted"
    assert cut.response_length == 0
    assert cut.tokens_list() == s.tokens_list()[:limit]
    assert cut.loss_mask_list() == []
    assert cut.metadata["abort_reason"] == "prompt_exceeds_max_tokens"
    # The result is a valid sample: it survives the codec.
    assert decode_sample(encode_sample(cut)) == cut


def test_truncate_aborted_stays_aborted() -> None:
    s = msgspec.structs.replace(make(10, prompt=4), status="aborted")
    assert truncate(s, 7).status == "aborted"


@pytest.mark.parametrize("bad", [-1, 1.5, True, None, "3"])
def test_truncate_rejects_bad_limit(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_tokens"):
        truncate(make(5), bad)  # type: ignore[arg-type]
