"""Fixtures: a local envd-compatible server and an E2BBackend pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from trio_swe.sandbox.e2b import E2BBackend
from trio_swe.testing import EnvdServer

from .helpers import open_server_and_backend


@pytest.fixture
async def server_backend() -> AsyncIterator[tuple[EnvdServer, E2BBackend]]:
    async with open_server_and_backend() as pair:
        yield pair
