"""A sandbox's background tasks: started in the nursery that ``open_sandbox`` owns."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVarTuple

import trio

from .._errors import SandboxNotRunningError

PosArgs = TypeVarTuple("PosArgs")


def start_in(
    nursery: trio.Nursery,
    sandbox_id: str,
    async_fn: Callable[[*PosArgs], Awaitable[object]],
    *args: *PosArgs,
) -> None:
    """``nursery.start_soon(async_fn, *args)``, with a closed nursery as a typed error.

    Backends implement :meth:`Sandbox.start_background` with it.

    Raises:
        SandboxNotRunningError: the nursery takes no new tasks: the sandbox is closing.
    """
    try:
        nursery.start_soon(async_fn, *args)
    except RuntimeError as exc:  # trio: "Nursery is closed to new arrivals"
        raise SandboxNotRunningError(f"sandbox {sandbox_id} is closing") from exc
