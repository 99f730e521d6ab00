"""One lock per key, kept only while a task holds or waits for it.

Backends serialize work per image (a pull, an unpack, a checkout) with a lock per image. A dict
of locks that is never pruned grows by one lock per image for the backend's whole life: a run
of days meets thousands of images. Here a key's lock exists while some task holds or waits for
it, and is dropped with the last one (a cancelled waiter included).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = trio.Lock()
        self.users = 0  # tasks holding or waiting for the lock


class KeyedLock:
    """``async with locks.hold(key):`` runs the block while no other task holds ``key``."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]

    def __len__(self) -> int:
        """How many keys are held or awaited now."""
        return len(self._entries)
