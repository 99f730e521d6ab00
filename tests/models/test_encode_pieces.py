"""A long text is tokenized in pieces (so a cap stops the work early and the tokenizer's
transient memory is one piece's): the ids are the whole text's, id for id, and a cap refuses
only what is truly over it."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_swe.models import ChatModel, TokenLimitError, _chat

# What pieces could be cut between and must join as the whole does: words, spaces, newline
# runs, code punctuation, digits, contractions, accents, CJK, emoji, special tokens.
ATOMS = st.sampled_from(
    [
        "a", "Z", "word", " ", "  ", "\n", "\n\n", "\r\n", "\t", "'s", "'t", ".", "{}", "();",
        "=", "0", "42", "\u00e9", "e\u0301", "\u4e2d\u6587", "\U0001f600", "<|im_start|>",
        "<|im_end|>", "<tool_call>", "x_y", "-", "#", "\\", '"',
    ]
)  # fmt: skip
TEXTS = st.lists(ATOMS, min_size=1, max_size=300).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXTS, piece=st.integers(min_value=1, max_value=40))
def test_pieces_encode_to_the_whole_texts_ids(qwen3: ChatModel, text: str, piece: int) -> None:
    assert qwen3.exact_pieces  # Qwen3's pre-tokenizer splits where the pieces are cut
    whole = qwen3.encode(text)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_chat, "ENCODE_PIECE_CHARS", piece)
        assert qwen3.encode_ids(text).tolist() == whole
        # A cap refuses exactly what is over it (never a text that fits).
        for limit in (len(whole) - 1, len(whole), len(whole) // 2):
            if len(whole) > limit >= 0:
                with pytest.raises(TokenLimitError) as err:
                    qwen3.encode_ids(text, limit=limit)
                assert limit < err.value.tokens <= len(whole)
            elif limit >= 0:
                assert qwen3.encode_ids(text, limit=limit).tolist() == whole


def test_a_cap_stops_tokenizing_at_the_piece_that_passes_it(qwen3: ChatModel) -> None:
    text = "Instance: x\n" + "word " * 400_000  # 2 MB, ~400k tokens
    calls: list[int] = []
    inner = qwen3.encode

    def counting(t: str) -> list[int]:
        calls.append(len(t))
        return inner(t)

    qwen3.encode = counting  # type: ignore[method-assign]
    try:
        with pytest.raises(TokenLimitError) as err:
            qwen3.encode_ids(text, limit=20_000)
        assert err.value.tokens > 20_000
        # A token per 5 characters: the pieces up to the one that passes the cap, not the 2 MB.
        assert sum(calls) <= 5 * 20_000 + 2 * _chat.ENCODE_PIECE_CHARS
        calls.clear()
        # Longer than the cap could ever hold at the vocabulary's longest token: no encoding.
        with pytest.raises(TokenLimitError):
            qwen3.encode_ids(text, limit=len(text) // qwen3.max_token_bytes - 1)
        assert calls == []
    finally:
        del qwen3.encode


def test_pieces_end_at_a_split_past_their_size(qwen3: ChatModel) -> None:
    # Splits every 41 characters, pieces of 8: each piece runs on to the next split, so the
    # text is encoded in pieces (never again whole, as after a cut anywhere).
    text = "Instance: x\n" + " ".join(["abcdefghij" * 4] * 200)
    whole = qwen3.encode(text)
    calls: list[int] = []
    inner = qwen3.encode

    def counting(t: str) -> list[int]:
        calls.append(len(t))
        return inner(t)

    qwen3.encode = counting  # type: ignore[method-assign]
    try:
        with pytest.MonkeyPatch.context() as m:
            m.setattr(_chat, "ENCODE_PIECE_CHARS", 8)
            assert qwen3.encode_ids(text).tolist() == whole
    finally:
        del qwen3.encode
    assert len(calls) > 100
    assert max(calls) <= 8 + 41
