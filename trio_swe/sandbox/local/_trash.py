"""Removal of killed sandboxes' state directories, off the kill's path.

A killed sandbox's state directory (its overlay upper layer, homes, passwd...) is *renamed* into
``<state root>/trash/`` at once (one ``rename``, inside the shielded kill) and removed by one
background thread. Removing it took most of a kill (one unlink per file, milliseconds each on a
busy disk), and every grading waited for it.

Nothing is left behind: a clean interpreter exit runs every queued removal first
(``concurrent.futures`` joins its worker threads at exit, queued work included);
:meth:`Trash.wait` (the backend's ``aclose``) waits for a backend's own; a process killed
outright (SIGKILL) leaves its trash to the next backend's start-up sweep, as it leaves its live
sandboxes' directories (names keep the owner's pid).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import threading
from pathlib import Path

import trio

#: Name of the trash directory under a backend's state root.
TRASH_DIR = "trash"

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_executor_pid = 0


def _remover() -> concurrent.futures.ThreadPoolExecutor:
    """The process's one removal thread (a new one in a forked child: threads do not survive
    ``fork``)."""
    global _executor, _executor_pid
    with _lock:
        if _executor is None or _executor_pid != os.getpid():
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="trio_swe-local-trash"
            )
            _executor_pid = os.getpid()
        return _executor


class Trash:
    """The trash of one backend's state root."""

    def __init__(self, root: Path) -> None:
        self.dir = root / TRASH_DIR
        # Futures finish in the removal thread: the set is guarded.
        self._guard = threading.Lock()
        self._pending: set[concurrent.futures.Future[None]] = set()

    def discard(self, path: Path) -> None:
        """Move ``path`` out of the way now and remove it in the background.

        Synchronous and cheap (a ``mkdir`` and a ``rename``): safe inside a shielded kill. If the
        rename fails (``path`` already gone, another file system), ``path`` is removed here.
        """
        try:
            self.dir.mkdir(exist_ok=True)
            target = self.dir / path.name
            os.rename(path, target)
        except OSError:
            shutil.rmtree(path, ignore_errors=True)
            return
        try:
            future = _remover().submit(shutil.rmtree, target, True)
        except RuntimeError:  # the interpreter is shutting down: no new work is taken
            shutil.rmtree(target, ignore_errors=True)
            return
        with self._guard:
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._guard:
            self._pending.discard(future)

    @property
    def pending(self) -> int:
        """Removals queued or running."""
        with self._guard:
            return len(self._pending)

    async def wait(self) -> None:
        """Return once every removal queued so far is done."""
        with self._guard:
            pending = list(self._pending)
        if pending:
            await trio.to_thread.run_sync(concurrent.futures.wait, pending, abandon_on_cancel=True)

    def sweep(self) -> None:
        """Remove trash left by processes that are gone (entries are named ``sb-<pid>-...``)."""
        try:
            entries = list(self.dir.iterdir())
        except OSError:
            return
        for entry in entries:
            if owner_gone(entry.name):
                shutil.rmtree(entry, ignore_errors=True)


def owner_gone(name: str) -> bool:
    """Is ``sb-<pid>-...`` from a process other than this one that no longer runs?"""
    try:
        pid = int(name.split("-")[1])
    except (IndexError, ValueError):
        return False
    return pid != os.getpid() and not Path(f"/proc/{pid}").exists()
