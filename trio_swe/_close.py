"""Closing resources on the way out: shielded, bounded, and never failing the caller.

Used wherever a run ends and its agents' HTTP clients or a backend's connection pools must be
closed even under cancellation (``trio-swe run``, slime's generate).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any

import trio

from .agents import Agent

__all__ = ["agent_closer", "close_quietly"]

logger = logging.getLogger(__name__)


async def close_quietly(closers: Iterable[Callable[[], Any] | None], *, timeout_sec: float) -> None:
    """Call each closer (awaiting it if it returns an awaitable), shielded and bounded.

    Closing connections must not be skipped by a cancellation, and a broken connection that
    fails to close must not fail the caller: the failure is logged.
    """
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + timeout_sec
        for close in closers:
            if close is None:
                continue
            try:
                result = close()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.warning("closing %r failed", close, exc_info=True)


def agent_closer(agent: Agent) -> Callable[[], Any] | None:
    """The agent's ``aclose``, or its policy's (the bash agent's SGLang client), if any."""
    close = getattr(agent, "aclose", None)
    if close is None:
        close = getattr(getattr(agent, "policy", None), "aclose", None)
    return close if callable(close) else None
