"""The tokenizer protocol; a dependency-free byte-level tokenizer for demos and tests; a Hugging
Face tokenizer with its whole vocabulary valid (checkpoints' chat templates are in ``models/``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

__all__ = ["ByteTokenizer", "RawTextTokenizer", "Tokenizer", "vocabulary_size"]


@runtime_checkable
class Tokenizer(Protocol):
    """Text to token ids and back. Any Hugging Face tokenizer fits this protocol.

    The bash agent keeps the token history append-only: it encodes each new piece of text
    (an observation, a role header) on its own with ``add_special_tokens=False`` and appends the
    ids, so earlier tokens (and their log-probs) are never re-tokenized.
    """

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Token ids of ``text``."""
        ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str:
        """The text of ``token_ids``."""
        ...


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0..255); no special tokens, no vocabulary file.

    Decoding never fails: a sequence cut inside a multi-byte character decodes with U+FFFD.
    """

    vocab_size = 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The UTF-8 bytes of ``text`` as ids."""
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``token_ids`` (each must be in ``range(256)``)."""
        return bytes(token_ids).decode("utf-8", errors="replace")


def vocabulary_size(tokenizer: object) -> int | None:
    """How many ids ``tokenizer`` knows, added tokens included, or None when it does not say.

    A Hugging Face tokenizer's ``len()`` counts its added (special) tokens, which its
    ``vocab_size`` leaves out (Qwen3: 151669 against 151643).
    """
    size = getattr(tokenizer, "vocab_size", None)
    if hasattr(tokenizer, "__len__"):
        size = len(tokenizer)
    return size if isinstance(size, int) else None


class RawTextTokenizer:
    """A Hugging Face tokenizer as a :class:`Tokenizer` that encodes text as written (no special
    tokens added) with its whole vocabulary, special tokens included, valid: what a scripted server
    replaying completions already in the model's format needs."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.vocab_size = len(tokenizer)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens))
