"""A policy output as it is generated, split into what may be streamed to the client before
the output is complete (sans-IO).

The sampled ids arrive in pieces; they are decoded incrementally (a piece that ends inside a
multi-byte character waits for the next) and the text so far is split the way the model's
parser will split the whole output (:meth:`~trio_swe.models.ChatModel.parse`):

* *reasoning*: inside ``<think>...</think>`` (the template's generation prompt may open it);
* *text*: the visible content after the reasoning, up to the first tool-call marker.

Only what the final parse cannot take back is handed out: whitespace the parse strips, and a
suffix that may be the start of a marker (``</think>``, ``<tool_call>``, the stop token), wait
for what follows. Tool calls are never streamed: the gateway emits them once the whole output
parsed. When the output is complete, :meth:`OutputStream.finish` gives the rest to send and
what the client then holds in all (``delivered``), which is what the session records as the
client's copy of the reply (the sampled ids are recorded as sampled either way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from ..models import ChatModel
from ._common import Reply

__all__ = ["Delta", "OutputStream"]

Channel = Literal["reasoning", "text"]

_OPEN, _CLOSE = "<think>", "</think>"
#: Where a tool call starts (Hermes and Qwen3-Coder both open with ``<tool_call>``; a bare
#: ``<function=`` is ill-formed but must not be streamed as text either).
CALL_MARKERS = ("<tool_call>", "<function=")


class Delta(msgspec.Struct, frozen=True):
    """A piece to send: its channel and text."""

    channel: Channel
    text: str


def _held(text: str, markers: Sequence[str]) -> int:
    """How many trailing characters of ``text`` may be the start of one of ``markers``."""
    keep = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:n]):
                keep = max(keep, n)
                break
    return keep


class OutputStream:
    """Streams one output's reasoning and text (see the module docstring).

    Args:
        model: the chat model the output is parsed with (its tokenizer decodes the pieces).
    """

    def __init__(self, model: ChatModel) -> None:
        self._model = model
        self._ids: list[int] = []
        self._prefix = 0  # decode window: ids[_prefix:_read] gave text already emitted
        self._read = 0
        self.raw = ""  # the decoded output so far
        gen = model.generation_prompt.rstrip()
        self._thinking_first = gen.endswith(_OPEN)
        self.reasoning = ""  # sent so far, per channel
        self.text = ""
        self.reasoning_started = False
        self._stop = model.stop_text

    # -- decoding ------------------------------------------------------------------------

    def _decode(self, new: Sequence[int]) -> None:
        self._ids.extend(new)
        decode = self._model.decode
        before = decode(self._ids[self._prefix : self._read])
        after = decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.raw += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)

    # -- splitting -----------------------------------------------------------------------

    def _split(self, final: bool) -> tuple[str | None, str | None]:
        """``(reasoning so far, text so far)``, each None while it cannot be told yet."""
        raw = self.raw
        if raw.endswith(self._stop):  # the stop token ends the output: never text
            raw = raw[: -len(self._stop)]
        head = raw.lstrip()
        if _CLOSE in raw:
            before, _, rest = raw.partition(_CLOSE)
            before = before.lstrip()
            if before.startswith(_OPEN):
                before = before[len(_OPEN) :]
            return before.strip("\n"), self._visible(rest.lstrip("\n"), final)
        if head.startswith(_OPEN) or self._thinking_first:
            body = head[len(_OPEN) :] if head.startswith(_OPEN) else head
            body = body.lstrip("\n")
            if not final:
                body = body[: len(body) - _held(body, (_CLOSE, self._stop))].rstrip("\n")
            return body, None
        if not final and _OPEN.startswith(head):
            return None, None  # may still become <think>
        return None, self._visible(raw, final)

    def _rest(self) -> str:
        """The whole output after its reasoning (if closed), stop token excluded, stripped."""
        raw = self.raw[: -len(self._stop)] if self.raw.endswith(self._stop) else self.raw
        if _CLOSE in raw:
            raw = raw.partition(_CLOSE)[2]
        elif self.reasoning_started:
            return ""  # cut inside the reasoning: nothing visible
        return raw.strip()

    def _visible(self, rest: str, final: bool) -> str:
        cut = min((i for i in (rest.find(m) for m in CALL_MARKERS) if i >= 0), default=-1)
        if cut >= 0:
            return rest[:cut].strip()
        if final:
            return rest.strip()
        body = rest.lstrip()
        body = body[: len(body) - _held(body, (*CALL_MARKERS, self._stop))]
        return body.rstrip()

    def feed(self, new: Sequence[int]) -> list[Delta]:
        """Take the next sampled ids; return what may be sent now."""
        self._decode(new)
        reasoning, text = self._split(final=False)
        return self._deltas(reasoning, text)

    def _deltas(self, reasoning: str | None, text: str | None) -> list[Delta]:
        out: list[Delta] = []
        if reasoning is not None and not self.text and reasoning.startswith(self.reasoning):
            piece = reasoning[len(self.reasoning) :]
            if piece or (not self.reasoning_started and text is not None):
                out.append(Delta("reasoning", piece))
                self.reasoning = reasoning
                self.reasoning_started = True
        if text is not None and text.startswith(self.text) and len(text) > len(self.text):
            out.append(Delta("text", text[len(self.text) :]))
            self.text = text
        return out

    def finish(self, reply: Reply) -> tuple[list[Delta], Reply]:
        """The output is complete and ``reply`` is its parse: the deltas still to send (before
        the tool calls) and the reply as the client will hold it (the text and reasoning it
        was sent)."""
        out: list[Delta] = []
        reasoning = self.reasoning if self.reasoning_started else None
        if (
            reply.reasoning is not None
            and not self.text
            and reply.reasoning.startswith(self.reasoning)
        ):
            piece = reply.reasoning[len(self.reasoning) :]
            if piece or not self.reasoning_started:
                out.append(Delta("reasoning", piece))
            reasoning = reply.reasoning
        text = self.text
        if (self.reasoning_started and reply.reasoning is None) or not reply.text.startswith(
            self.text
        ):
            # The parse disagrees with what was streamed (an ill-formed call after streamed
            # reasoning, an output cut inside its reasoning): the rest goes as it came.
            rest = self._rest()
            piece = rest[len(self.text) :] if rest.startswith(self.text) else ""
        else:
            piece = reply.text[len(self.text) :]
        if piece:
            out.append(Delta("text", piece))
            text += piece
        delivered = msgspec.structs.replace(reply, text=text, reasoning=reasoning)
        return out, delivered
