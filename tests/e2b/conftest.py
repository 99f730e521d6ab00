"""Fixtures: a local envd-compatible server and an E2BBackend pointed at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from trio_swe.sandbox.e2b import E2BBackend, RetryPolicy
from trio_swe.testing import EnvdServer, FaultPlan, open_envd_server

#: Fast retries and a short keepalive so that silent streams are found in ~3.5 s in tests.
TEST_POLICY = RetryPolicy(max_attempts=8, base_delay=0.05, max_delay=0.5, max_retry_after=1.0)


def e2b_backend_for(server: EnvdServer, **kw: Any) -> E2BBackend:
    """An E2BBackend speaking h2c to ``server`` (HTTP/2 without TLS, like tests of E2B's edge)."""
    opts: dict[str, Any] = {
        "h2c": True,
        "keepalive_interval": 1.0,
        "retry_policy": TEST_POLICY,
        "seed": 1,
        "request_timeout": 20.0,
    }
    opts.update(kw)
    return E2BBackend(
        api_key=server.api_key, api_url=server.api_url, sandbox_url=server.sandbox_url, **opts
    )


@asynccontextmanager
async def open_server_and_backend(
    faults: FaultPlan | None = None, **server_kw: Any
) -> AsyncIterator[tuple[EnvdServer, E2BBackend]]:
    async with (
        open_envd_server(faults=faults, **server_kw) as server,
        e2b_backend_for(server) as backend,
    ):
        yield server, backend


@pytest.fixture
async def server_backend() -> AsyncIterator[tuple[EnvdServer, E2BBackend]]:
    async with open_server_and_backend() as pair:
        yield pair
