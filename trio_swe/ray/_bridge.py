"""Awaiting Ray object refs from trio, without a thread per ref.

``ObjectRef.future()`` gives a :class:`concurrent.futures.Future` completed by Ray's core worker;
its done-callback runs on one of Ray's threads and wakes the waiting trio task through the run's
token. A cancelled waiter leaves the remote task alone: whoever owns it decides whether to
``ray.cancel`` it (see :func:`cancel_and_wait`).
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

import ray
import trio

__all__ = ["ActorHandle", "ObjectRef", "cancel_and_wait", "wait_ref"]


#: Ray's handles and refs, untyped here: their stubs type only what ``@ray.remote`` can see.
ActorHandle = Any
ObjectRef = Any


async def wait_ref(ref: ObjectRef) -> Any:
    """The value of ``ref``; its task's exception is raised (``RayTaskError``, ``RayActorError``)."""
    future: concurrent.futures.Future[Any] = ref.future()
    if not future.done():
        token = trio.lowlevel.current_trio_token()
        event = trio.Event()

        def wake(_: object) -> None:
            try:
                token.run_sync_soon(event.set)
            except trio.RunFinishedError:
                pass  # the waiter's run is gone; nobody is waiting

        future.add_done_callback(wake)
        await event.wait()
    return future.result()


async def cancel_and_wait(ref: ObjectRef, *, timeout_sec: float) -> Any:
    """``ray.cancel`` the task behind ``ref`` and wait (shielded, bounded) until it has ended.

    An async actor's task is cancelled as an asyncio task: the actor's cleanup (a trio episode
    killing its sandboxes) runs before the task ends, so returning here means it is done, or the
    worker is dead, or ``timeout_sec`` passed. Returns the task's value if it completed anyway
    (it had finished before the cancel arrived), else None.
    """
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + timeout_sec
        try:
            ray.cancel(ref)
        except Exception:  # an already finished or foreign ref: nothing to cancel
            pass
        try:
            return await wait_ref(ref)
        except Exception:
            pass  # TaskCancelledError as expected, or the worker died meanwhile
    return None
