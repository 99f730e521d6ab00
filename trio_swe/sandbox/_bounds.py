"""The time bound every ``read_file`` and ``write_file`` runs under, besides its byte bound."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import trio

from .._errors import InvalidArgumentError, SandboxFileTimeoutError


def check_file_timeout(timeout: float | None) -> float:
    """A file call's ``timeout``: positive seconds, or None (no bound: ``inf``)."""
    if timeout is None:
        return math.inf
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidArgumentError(f"timeout must be positive seconds or None, got {timeout!r}")
    return float(timeout)


@contextmanager
def file_time_bound(
    op: Literal["read", "write"], path: str, timeout: float | None
) -> Iterator[float]:
    """Run the block under ``timeout`` seconds (it gets the deadline, on trio's clock, for
    work it shields); running out raises :class:`SandboxFileTimeoutError`."""
    bound = check_file_timeout(timeout)
    with trio.move_on_after(bound) as scope:
        yield scope.deadline
    if scope.cancelled_caught:
        raise SandboxFileTimeoutError(path, op, bound)
