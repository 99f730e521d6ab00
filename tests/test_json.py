"""trio_swe._json.loads: msgspec's speed, json's answers (what json accepted it still accepts,
with the same value; what it refused is still a ValueError)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from trio_swe._json import loads

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats()
    | st.text(st.characters(codec="utf-8") | st.characters(categories=["Cs"])),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@given(value=JSON, ascii_only=st.booleans())
@example(value="\ud800", ascii_only=False)  # a str msgspec cannot encode: json decides
def test_a_value_comes_back_as_json_reads_it(value: Any, ascii_only: bool) -> None:
    # ensure_ascii=True writes lone surrogates as \ud800 escapes, NaN and inf as literals:
    # what msgspec refuses and json takes.
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert _same(loads(text), json.loads(text))
    if ascii_only:
        assert _same(loads(text.encode()), json.loads(text.encode()))


@pytest.mark.parametrize(
    "text", [b"", b"{", b'{"a":1} x', b"\xff", b"[" * 100_000, b"nan", b"{'a': 1}"]
)
def test_what_json_refuses_is_a_value_error(text: bytes) -> None:
    with pytest.raises(ValueError):
        loads(text)
