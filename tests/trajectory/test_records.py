"""TurnRecord and Sample: coercion of inputs into typed buffers, invariants, equality, numpy
views, immutability, and the slime conversion."""

from __future__ import annotations

import array
import enum
import math

import msgspec
import numpy as np
import pytest

from trio_swe import InvalidArgumentError, Sample, TurnRecord, decode_sample, encode_sample

from ._chains import slime_like


def sample(**overrides: object) -> Sample:
    fields: dict[str, object] = {
        "tokens": [5, 6, 7, 8],
        "loss_mask": [1, 0, 1],
        "rollout_log_probs": [-0.5, 0.0, -0.25],
    }
    fields.update(overrides)
    return Sample.from_lists(**fields)  # type: ignore[arg-type]


# --- TurnRecord -------------------------------------------------------------------------------


def test_turn_from_lists_holds_typed_read_only_views() -> None:
    t = TurnRecord.from_lists(prompt_ids=[1, 2], output_ids=[3], output_log_probs=[-0.5])
    assert (t.prompt_ids.format, t.output_ids.format) == ("i", "i")
    assert t.output_log_probs is not None
    assert t.output_log_probs.format == "f"
    assert t.prompt_ids.readonly
    assert t.prompt_ids_list() == [1, 2]
    assert t.output_ids_list() == [3]
    assert t.output_log_probs_list() == [-0.5]
    assert t.finish_reason == "stop"
    assert t.ill_formed is False


def test_turn_accepts_buffers_copies_writable_ones_shares_read_only_ones() -> None:
    prompt = np.arange(5, dtype=np.int32)
    out = array.array("i", [7, 8])
    lps = np.zeros(2, np.float32)
    t = TurnRecord(prompt_ids=prompt, output_ids=out, output_log_probs=lps)  # type: ignore[arg-type]
    # Writable sources are copied: writing to them later does not change the record, and an
    # array.array stays resizable.
    prompt[0] = 99
    lps[0] = -5.0
    out.append(9)
    assert t.prompt_ids_list() == [0, 1, 2, 3, 4]
    assert t.output_ids_list() == [7, 8]
    assert t.output_log_probs_list() == [0.0, 0.0]
    # Read-only sources are shared.
    frozen = np.arange(4, dtype=np.int32)
    frozen.flags.writeable = False
    t2 = TurnRecord.from_lists(prompt_ids=frozen, output_ids=[])
    assert np.shares_memory(np.frombuffer(t2.prompt_ids, dtype=np.int32), frozen)
    raw = bytes(8)
    assert TurnRecord(prompt_ids=raw, output_ids=b"").prompt_ids.obj is raw  # type: ignore[arg-type]
    # Other widths are converted (a copy), values kept.
    t64 = TurnRecord.from_lists(
        prompt_ids=np.arange(3, dtype=np.int64),
        output_ids=[],
        output_log_probs=np.array([], np.float64),
    )
    assert t64.prompt_ids_list() == [0, 1, 2]
    assert t64.prompt_ids.format == "i"
    # Raw little-endian bytes are int32 data (what msgpack decoding hands over).
    raw = TurnRecord(prompt_ids=b"\x01\x00\x00\x00\x02\x00\x00\x00", output_ids=b"")  # type: ignore[arg-type]
    assert raw.prompt_ids_list() == [1, 2]
    assert raw.output_log_probs_list() is None


def test_turn_equality_is_by_content() -> None:
    a = TurnRecord.from_lists(prompt_ids=[1], output_ids=[2], output_log_probs=[-1.0])
    b = TurnRecord.from_lists(
        prompt_ids=np.array([1], np.int32), output_ids=(2,), output_log_probs=[-1.0]
    )
    assert a == b
    assert a != TurnRecord.from_lists(prompt_ids=[1], output_ids=[2], output_log_probs=None)
    assert a != TurnRecord.from_lists(prompt_ids=[1], output_ids=[2], output_log_probs=[-2.0])
    assert a != TurnRecord.from_lists(
        prompt_ids=[1], output_ids=[2], output_log_probs=[-1.0], ill_formed=True
    )
    assert "prompt_ids=<i x1 [1]>" in repr(a)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_ids": [2**31]}, "prompt_ids holds a value out of range"),
        ({"prompt_ids": ["a"]}, "prompt_ids holds a value of the wrong type"),
        ({"prompt_ids": "abc"}, "prompt_ids must be a sequence"),
        ({"prompt_ids": 3}, "prompt_ids must be a sequence"),
        ({"prompt_ids": b"\x01\x02\x03"}, "not a whole number of int32"),
        ({"prompt_ids": np.zeros((2, 2), np.int32)}, "one-dimensional"),
        ({"prompt_ids": np.zeros(2, np.float32)}, "must hold integers"),
        ({"output_log_probs": [-1.0, -2.0]}, "2 entries for 1 output_ids"),
        ({"output_log_probs": ["x"]}, "wrong type"),
        ({"finish_reason": None}, "finish_reason must be a str"),
        ({"ill_formed": 1}, "ill_formed must be a bool"),
    ],
)
def test_turn_rejects_bad_input(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {"prompt_ids": [1], "output_ids": [2], "output_log_probs": [-1.0]}
    fields.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=match):
        TurnRecord.from_lists(**fields)  # type: ignore[arg-type]


def test_non_contiguous_numpy_input_is_copied_correctly() -> None:
    base = np.arange(10, dtype=np.int32)
    t = TurnRecord.from_lists(prompt_ids=base[::2], output_ids=[])
    assert t.prompt_ids_list() == [0, 2, 4, 6, 8]


# --- Sample -----------------------------------------------------------------------------------


def test_sample_from_lists() -> None:
    s = sample(reward=1, metadata={"a": 1})
    assert s.tokens_list() == [5, 6, 7, 8]
    assert s.loss_mask_list() == [1, 0, 1]
    assert s.rollout_log_probs_list() == [-0.5, 0.0, -0.25]
    assert s.response_length == 3  # defaults to len(loss_mask)
    assert s.prompt_length == 1
    assert s.num_trained_tokens() == 2
    assert s.reward == 1.0
    assert type(s.reward) is float
    assert s.status == "completed"
    assert s.metadata == {"a": 1}
    assert (s.tokens.format, s.loss_mask.format, s.rollout_log_probs.format) == ("i", "B", "f")


def test_sample_mask_from_numpy_bool_and_writable_buffers() -> None:
    mask = np.array([True, False, True])
    s = sample(loss_mask=mask)
    assert s.loss_mask_list() == [1, 0, 1]
    mask[1] = True
    assert s.loss_mask_list() == [1, 0, 1]
    ba = bytearray(b"\x01\x00\x01")
    s = sample(loss_mask=ba)
    ba[1] = 1
    assert s.loss_mask_list() == [1, 0, 1]


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"loss_mask": [1, 2, 0]}, "only 0 and 1, found 2"),
        ({"loss_mask": [1, -1, 0]}, "loss_mask holds a value out of range"),
        ({"loss_mask": np.array([1, 0, 1], np.int32)}, None),  # accepted: values are 0/1
        ({"rollout_log_probs": [-0.5]}, "rollout_log_probs has 1 entries but response_length is 3"),
        ({"response_length": 2}, "loss_mask has 3 entries but response_length is 2"),
        ({"response_length": 5}, "outside 0..4"),
        ({"response_length": -1}, "outside 0..4"),
        ({"response_length": True}, "response_length must be an int"),
        ({"status": "pending"}, "status must be one of"),
        ({"reward": math.nan}, "reward must be finite"),
        ({"reward": "1"}, "reward must be a float"),
        ({"metadata": [1]}, "metadata must be a dict"),
    ],
)
def test_sample_rejects_broken_invariants(overrides: dict[str, object], match: str | None) -> None:
    if match is None:
        sample(**overrides)
        return
    with pytest.raises(InvalidArgumentError, match=match):
        sample(**overrides)


def test_sample_is_immutable_and_replace_revalidates() -> None:
    s = sample()
    with pytest.raises(AttributeError):
        s.reward = 2.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.tokens[0] = 1
    assert msgspec.structs.replace(s, reward=3.0).reward == 3.0
    with pytest.raises(InvalidArgumentError):
        msgspec.structs.replace(s, response_length=1)


def test_sample_equality_is_by_content_and_bitwise_for_floats() -> None:
    assert sample() == sample(tokens=np.array([5, 6, 7, 8], np.int32))
    assert sample() != sample(tokens=[5, 6, 7, 9])
    assert sample() != sample(reward=1.0)
    assert sample() != sample(status="truncated")
    assert sample(rollout_log_probs=[0.0, 0.0, math.nan]) == sample(
        rollout_log_probs=[0.0, 0.0, math.nan]
    )
    assert sample(rollout_log_probs=[0.0, 0.0, 0.0]) != sample(rollout_log_probs=[0.0, 0.0, -0.0])
    assert sample() != "sample"


def test_numpy_views_are_zero_copy_and_read_only() -> None:
    data = encode_sample(sample())
    s = decode_sample(data)
    arrays = s.numpy()
    assert arrays.tokens.dtype == np.int32
    assert arrays.loss_mask.dtype == np.uint8
    assert arrays.rollout_log_probs.dtype == np.float32
    assert arrays.tokens.tolist() == [5, 6, 7, 8]
    assert arrays.rollout_log_probs.tolist() == [-0.5, 0.0, -0.25]
    assert not arrays.tokens.flags.writeable
    whole = np.frombuffer(data, dtype=np.uint8)
    for arr in arrays:
        assert np.shares_memory(arr, whole)  # views into the encoded bytes


# --- slime conversion -------------------------------------------------------------------------


class Status(enum.Enum):  # the shape of slime's Sample.Status
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    PENDING = "pending"


def test_slime_dict_roundtrip_and_extras() -> None:
    s = sample(status="truncated", metadata={"m": [1, 2]})
    d = s.to_slime_dict()
    assert d == {
        "tokens": [5, 6, 7, 8],
        "response_length": 3,
        "loss_mask": [1, 0, 1],
        "rollout_log_probs": [-0.5, 0.0, -0.25],
        "reward": 0.0,
        "status": "truncated",
        "metadata": {"m": [1, 2]},
        "remove_sample": False,
    }
    assert Sample.from_slime_dict(slime_like(s)) == s  # slime's other fields are ignored
    assert sample(status="aborted").to_slime_dict()["remove_sample"] is True


def test_from_slime_dict_conventions() -> None:
    base = {"tokens": [1, 2, 3], "response_length": 2, "rollout_log_probs": [-1.0, -2.0]}
    s = Sample.from_slime_dict(
        {**base, "loss_mask": None, "status": Status.TRUNCATED, "reward": None}
    )
    assert s.loss_mask_list() == [1, 1]  # None: all trained (slime's convention)
    assert s.status == "truncated"
    assert s.reward == 0.0
    s = Sample.from_slime_dict({**base, "loss_mask": [0, 0], "rollout_log_probs": None})
    assert s.rollout_log_probs_list() == [0.0, 0.0]  # nothing trained, so nothing is invented
    assert Sample.from_slime_dict({**base, "remove_sample": True}).status == "aborted"
    # float64 log-probs round to float32.
    s = Sample.from_slime_dict({**base, "rollout_log_probs": [-0.1, -0.2]})
    assert s.rollout_log_probs_list() == [array.array("f", [-0.1])[0], array.array("f", [-0.2])[0]]


@pytest.mark.parametrize(
    ("d", "match"),
    [
        ({"response_length": 0}, "no 'tokens'"),
        ({"tokens": [1]}, "no 'response_length'"),
        ({"tokens": [1, 2], "response_length": 1}, "rollout_log_probs is None"),
        (
            {
                "tokens": [1],
                "response_length": 1,
                "rollout_log_probs": [0.0],
                "status": Status.PENDING,
            },
            "status must be one of",
        ),
        ({"tokens": [1], "response_length": 2, "rollout_log_probs": [0.0, 0.0]}, "outside 0..1"),
    ],
)
def test_from_slime_dict_rejects(d: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        Sample.from_slime_dict(d)


def test_turn_records_encode_with_msgspec() -> None:
    """Turns can be logged and replayed with plain msgspec: buffers travel as bin."""
    t = TurnRecord.from_lists(
        prompt_ids=[1, 2], output_ids=[3], output_log_probs=[-0.5], finish_reason="length"
    )
    data = msgspec.msgpack.encode(t)
    back = msgspec.msgpack.decode(data, type=TurnRecord)
    assert back == t
    assert back.prompt_ids.format == "i"
    none = TurnRecord.from_lists(prompt_ids=[1], output_ids=[2])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(none), type=TurnRecord) == none
    with pytest.raises(msgspec.ValidationError, match="output_log_probs has 2 entries"):
        msgspec.msgpack.decode(
            msgspec.msgpack.encode({**msgspec.structs.asdict(t), "output_log_probs": bytes(8)}),
            type=TurnRecord,
        )


@pytest.mark.parametrize("dtype", ["<i4", ">i4", "<i8", ">i8", "i2", "u2", "u1"])
def test_integer_buffers_of_any_layout_convert(dtype: str) -> None:
    src = np.array([0, 1, 2, 100], dtype=dtype)
    t = TurnRecord.from_lists(prompt_ids=src, output_ids=src[::-1])
    assert t.prompt_ids_list() == [0, 1, 2, 100]
    assert t.output_ids_list() == [100, 2, 1, 0]
    assert t.prompt_ids.format == "i"


@pytest.mark.parametrize("dtype", ["<f4", ">f4", "<f8", ">f8", "f2"])
def test_float_buffers_of_any_layout_convert(dtype: str) -> None:
    s = sample(rollout_log_probs=np.array([-0.5, 0.0, -0.25], dtype=dtype))
    assert s.rollout_log_probs_list() == [-0.5, 0.0, -0.25]
    assert s.rollout_log_probs.format == "f"
