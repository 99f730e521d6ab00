"""``Sandbox.start_background`` on every backend (the ``backend`` fixture): a task of the
sandbox outlives its caller's cancel scope, ends when the sandbox closes, and a closed sandbox
refuses new tasks with a typed error (issue 11 item 8: no public ``Sandbox.nursery``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from trio_swe import SandboxNotRunningError
from trio_swe.sandbox import Backend, Sandbox, open_sandbox


async def test_background_task_outlives_its_caller_and_ends_with_the_sandbox(
    backend: Backend, tmp_path: Path
) -> None:
    image = tmp_path / "image"
    image.mkdir(exist_ok=True)
    (image / "f").write_text("x")
    started = trio.Event()
    ran: list[str] = []
    ended: list[str] = []

    async def task(name: str) -> None:
        ran.append(name)
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            ended.append(name)

    kept: Sandbox | None = None
    with trio.fail_after(60):  # a hang guard only
        async with open_sandbox(backend, str(image)) as sb:
            kept = sb
            with trio.CancelScope() as caller:
                sb.start_background(task, "poller")
                await started.wait()
                caller.cancel()  # the caller goes away...
                await trio.sleep_forever()
            assert caller.cancelled_caught
            await trio.testing.wait_all_tasks_blocked()
            assert (ran, ended) == (["poller"], [])  # ...and its task still runs
    assert ended == ["poller"]  # cancelled when the sandbox closed
    assert not hasattr(kept, "nursery")
    with pytest.raises(SandboxNotRunningError, match="closing"):
        kept.start_background(task, "late")
    assert ran == ["poller"]
