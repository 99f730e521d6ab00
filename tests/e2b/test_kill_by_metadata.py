"""Sandboxes found by their metadata and killed: what reaps the sandboxes of a dead owner.

The REST API lists sandboxes filtered by metadata (``GET /v2/sandboxes?metadata=...``); the
official SDK is the oracle for the filter's encoding.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest
import trio

from trio_swe import InvalidArgumentError, open_sandbox
from trio_swe.sandbox.e2b import E2BBackend
from trio_swe.testing import EnvdServer

e2b = pytest.importorskip("e2b")

#: A value that needs quoting at both levels of the filter's encoding.
ODD = "a b&c=d/é%"


async def test_kill_sandboxes_kills_exactly_the_matching_ones(
    server_backend: tuple[EnvdServer, E2BBackend],
) -> None:
    server, backend = server_backend
    async with AsyncExitStack() as stack:
        mine = [
            await stack.enter_async_context(
                open_sandbox(backend, "base", metadata={"owner": ODD, "n": str(i)})
            )
            for i in range(2)
        ]
        other = await stack.enter_async_context(
            open_sandbox(backend, "base", metadata={"owner": "someone else"})
        )
        half = await stack.enter_async_context(
            open_sandbox(backend, "base", metadata={"owner": ODD[:3]})
        )

        # The SDK's own filter finds the same sandboxes as ours.
        def sdk_list() -> list[str]:
            query = e2b.SandboxQuery(metadata={"owner": ODD})
            paginator = e2b.Sandbox.list(
                query=query,
                api_key=server.api_key,
                api_url=server.api_url,
                sandbox_url=server.sandbox_url,
                domain=server.domain,
            )
            return [s.sandbox_id for s in paginator.next_items()]

        assert sorted(await trio.to_thread.run_sync(sdk_list)) == sorted(s.id for s in mine)

        killed = await backend.kill_sandboxes({"owner": ODD})
        assert sorted(killed) == sorted(s.id for s in mine)
        assert sorted(server.live_sandbox_ids()) == sorted([other.id, half.id])
        assert await backend.kill_sandboxes({"owner": ODD}) == []  # nothing left to match
        assert await backend.kill_sandboxes({"owner": ODD, "n": "0"}) == []
        with pytest.raises(InvalidArgumentError, match="metadata pair"):
            await backend.kill_sandboxes({})
    # The blocks' own kills of the already killed sandboxes are no errors (404 is success).
    assert server.live_sandbox_ids() == []
    assert backend.statistics().live == 0
