"""Closing resources on the way out: shielded, bounded, and never failing the caller.

Agents and backends are :class:`trio.abc.AsyncResource`-shaped (an ``aclose()``), so closing
them is one call each. Used wherever a run ends and its agents' HTTP clients or a backend's
connection pools must be closed even under cancellation (``trio-swe run``, slime's generate).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol

import trio

__all__ = ["Closeable", "aclose_quietly"]

logger = logging.getLogger(__name__)


class Closeable(Protocol):
    """Anything with trio's ``aclose()``: agents, backends, policies."""

    async def aclose(self) -> None: ...


async def aclose_quietly(resources: Iterable[Closeable | None], *, timeout_sec: float) -> None:
    """``aclose()`` each resource, shielded from cancellation and bounded by ``timeout_sec``.

    Closing connections must not be skipped by a cancellation, and a broken connection that
    fails to close must not fail the caller: the failure is logged.
    """
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + timeout_sec
        for resource in resources:
            if resource is None:
                continue
            try:
                await resource.aclose()
            except Exception:
                logger.warning("closing %r failed", resource, exc_info=True)
