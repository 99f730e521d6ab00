"""An async context manager entered in a trio run of its own, on a thread of its own.

Servers that tests run this way keep serving whatever trio run (or asyncio loop) the client side
is in, including runs that start and end while the server lives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

import trio

T = TypeVar("T")


class TrioThread(Generic[T]):
    """Enters ``open_cm()`` in a new trio run on a thread; stays inside until :meth:`stop`.

    The waiting steps (:meth:`started`, :meth:`join`) block; async callers run them through
    ``trio.to_thread.run_sync``.
    """

    def __init__(self, open_cm: Callable[[], AbstractAsyncContextManager[T]], name: str) -> None:
        self._open_cm = open_cm
        self._ready = threading.Event()
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def _serve(self) -> None:
        async with self._open_cm() as value:
            self._box["stop"] = stop = trio.Event()
            self._box["value"] = value
            self.token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await stop.wait()

    def _run(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:
            self._box["error"] = exc
        finally:
            self._ready.set()

    def started(self) -> T:
        """Wait until the context manager is entered; its value (RuntimeError if it failed)."""
        self._ready.wait()
        if "value" not in self._box:
            raise RuntimeError(f"{self._thread.name} did not start") from self._box.get("error")
        value: T = self._box["value"]
        return value

    def stop(self) -> None:
        """Ask the run to leave the context manager (a run that already died is fine)."""
        try:
            self.token.run_sync_soon(self._box["stop"].set)
        except trio.RunFinishedError:
            pass  # it died; join() raises its error

    def join(self) -> None:
        """Wait for the thread; RuntimeError if the run failed."""
        self._thread.join()
        if "error" in self._box:
            raise RuntimeError(f"{self._thread.name} failed") from self._box["error"]
