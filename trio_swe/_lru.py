"""A mapping that keeps only its most recently used entries.

Long-lived objects cache per-key work (a row's swebench TestSpec, a resolved image, a sandbox
root's mount plan). A run of days meets thousands of rows and images, so each such cache has a
bound, and the least recently used entry goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """At most ``maxsize`` entries (and, with ``max_bytes``, at most that many bytes as
    :meth:`put` weighs them); :meth:`get` and :meth:`put` make an entry the most recent.

    A count alone does not bound memory when entries can be of any size (the gateway's chat
    models hold a client's tool list: 64 of 1 MB each are not 64 small ones).

    Not thread-safe: a cache shared by threads is used under its owner's lock.
    """

    def __init__(self, maxsize: int, *, max_bytes: int | None = None) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be at least 1, got {maxsize}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative, got {max_bytes}")
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        #: The bytes of the entries held, as :meth:`put` weighed them.
        self.nbytes = 0
        self._data: OrderedDict[K, V] = OrderedDict()
        self._sizes: dict[K, int] = {}

    def get(self, key: K) -> V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: K, value: V, *, nbytes: int = 0) -> None:
        """Keep ``value`` (weighing ``nbytes``); the least recently used entries go until
        both bounds hold. An entry over ``max_bytes`` alone is not kept."""
        self.pop(key)
        if self.max_bytes is not None and nbytes > self.max_bytes:
            return
        self._data[key] = value
        self._sizes[key] = nbytes
        self.nbytes += nbytes
        while len(self._data) > self.maxsize or (
            self.max_bytes is not None and self.nbytes > self.max_bytes
        ):
            old, _ = self._data.popitem(last=False)
            self.nbytes -= self._sizes.pop(old)

    def pop(self, key: K) -> None:
        if key in self._data:
            del self._data[key]
            self.nbytes -= self._sizes.pop(key)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data
