"""Fixtures of the envd test server's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trustme

from trio_swe.testing import EnvdServer, open_envd_server


@pytest.fixture(scope="session")
def session_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[trustme.CA, Path]:
    """One CA per test process: the e2b SDK caches its TLS trust store process-wide."""
    ca = trustme.CA()
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return ca, path


@pytest.fixture
async def server() -> AsyncIterator[EnvdServer]:
    """A plain (HTTP/1.1 + h2c) server without the fault proxy."""
    async with open_envd_server() as s:
        yield s


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP/1.1 client."""
    async with httpx.AsyncClient(timeout=60) as c:
        yield c


@pytest.fixture
async def h2c_client() -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP/2 prior-knowledge (h2c) client."""
    async with httpx.AsyncClient(http1=False, http2=True, timeout=60) as c:
        yield c
