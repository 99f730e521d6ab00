"""Backends that the backend-agnostic suites (e.g. tests/sandbox/test_detached.py) run against.

Each entry opens a ready Backend for one test and tears everything down afterwards. A suite that
uses the ``backend`` fixture runs once per entry, unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from trio_swe.sandbox import Backend
from trio_swe.sandbox.local import LocalBackend


@asynccontextmanager
async def open_local_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    del tmp_path
    yield LocalBackend()


BACKENDS: dict[str, Callable[[Path], AbstractAsyncContextManager[Backend]]] = {
    "local": open_local_backend,
}
