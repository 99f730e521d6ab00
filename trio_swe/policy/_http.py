"""What every HTTP policy client shares: its httpx client (owned or lent), headers, sampling
defaults, counters, ``aclose`` and ``statistics``. The engines' dialects live in their modules."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

import httpx
import msgspec
import trio

from ._types import PolicyStatistics

__all__ = ["HttpPolicy", "IdsBody"]

#: Ids per encoded slice of a prompt: ~50 KB of JSON.
_SLICE = 8192


class IdsBody:
    """A request body: a JSON object whose last member is the prompt's ids, encoded a slice at
    a time as it is sent.

    A prompt of the gateway's size (a 2 MB tool result is ~400k ids) held as a list of Python
    ints costs ~36 bytes an id, and its JSON another ~7: both on top of what the session holds.
    Here the ids stay in the caller's buffer; the length is counted by one encoding pass (so
    the request has a ``content-length``, not chunks). Up to :data:`KEEP_BYTES` of JSON, the
    pieces of that pass are sent; past it they are dropped and made again, a slice at a time,
    as httpx writes them. Iterable again, should a request be sent twice.
    """

    #: JSON of the ids kept from the counting pass (~150k ids): a bigger prompt is encoded
    #: twice rather than held.
    KEEP_BYTES = 1 << 20

    def __init__(self, fields: Mapping[str, Any], key: str, ids: Sequence[int]) -> None:
        head = msgspec.json.encode(dict(fields))
        comma = b"," if len(head) > 2 else b""
        self._head = head[:-1] + comma + msgspec.json.encode(key) + b":["
        self._ids = ids
        pieces: list[bytes] | None = []
        size = 0
        for piece in self._slices():
            size += len(piece)
            if pieces is not None:
                pieces.append(piece)
                if size > self.KEEP_BYTES:
                    pieces = None
        self._pieces = pieces
        self._length = len(self._head) + size + len(b"]}")

    def _slices(self) -> Iterator[bytes]:
        ids = self._ids
        for start in range(0, len(ids), _SLICE):
            text = msgspec.json.encode(list(ids[start : start + _SLICE]))[1:-1]
            yield b"," + text if start else text

    def __len__(self) -> int:
        return self._length

    @property
    def headers(self) -> dict[str, str]:
        """The ``content-length`` to send it with (httpx would send chunks otherwise)."""
        return {"content-length": str(self._length)}

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._head
        for piece in self._slices() if self._pieces is None else self._pieces:
            yield piece
        yield b"]}"


class HttpPolicy(trio.abc.AsyncResource):
    """Base of :class:`~trio_swe.policy.SGLangPolicy` and :class:`~trio_swe.policy.VLLMPolicy`."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None,
        read_timeout_sec: float | None,
        headers: Mapping[str, str],
        defaults: Mapping[str, Any] | None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._own_client = client is None
        # No read or pool timeout by default: a generation may take long, and waiting for a
        # free connection is bounded by the caller's budget (a cancel scope), not a constant.
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(10.0, read=read_timeout_sec, pool=None),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )
        self._headers = dict(headers)
        #: Sampling parameters (SGLang's names) under each call's own.
        self.defaults = dict(defaults or {})
        self._stats = {"requests": 0, "aborts": 0, "errors": 0, "output_tokens": 0}

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._own_client:
            await self._client.aclose()

    def statistics(self) -> PolicyStatistics:
        """Requests sent, aborts sent, errors and output tokens received."""
        return PolicyStatistics(**self._stats)
