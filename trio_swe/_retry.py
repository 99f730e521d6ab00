"""One backoff policy and one retry loop, for every retry that is not a transport's.

Booting a sandbox (the episode's boot retry) and installing an npm CLI agent retry through
:func:`retry` with a :class:`Backoff`; the E2B client keeps its own loop (its table decides per
failure: idempotency, ``Retry-After``, pool resets) but waits by the same :func:`full_jitter`.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import msgspec
import trio

T = TypeVar("T")

_RNG = random.Random()


def full_jitter(
    retry_index: int, *, base_sec: float, max_sec: float, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``retry_index`` (0 for the first retry):
    ``uniform(0, min(max_sec, base_sec * 2**retry_index))`` (AWS's "full jitter")."""
    ceiling = min(max_sec, base_sec * (2.0 ** min(retry_index, 30)))
    return (rng or _RNG).uniform(0.0, ceiling)


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """A bounded number of attempts with full-jitter exponential backoff between them.

    Attributes:
        attempts: attempts in total, the first included (at least 1).
        base_sec: scale of the first backoff.
        max_sec: cap of one backoff.
    """

    attempts: int
    base_sec: float
    max_sec: float

    def delay(self, retry_index: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry_index`` (0 for the first retry)."""
        return full_jitter(retry_index, base_sec=self.base_sec, max_sec=self.max_sec, rng=rng)


async def retry(
    attempt: Callable[[int], Awaitable[T]],
    backoff: Backoff,
    *,
    retry_on: tuple[type[Exception], ...],
    give_up_on: tuple[type[Exception], ...] = (),
    on_retry: Callable[[int, Exception], None] | None = None,
    rng: random.Random | None = None,
) -> T:
    """``await attempt(n)`` for ``n = 1, 2, ...`` until it returns, with backoff between tries.

    An exception of ``retry_on`` (and not of ``give_up_on``) is retried while attempts remain;
    after the last attempt it propagates unchanged, as does any other exception at once. The
    caller translates it. ``on_retry(n, exc)`` runs before the wait that follows failed attempt
    ``n``. Cancellation is never caught.
    """
    n = 1
    while True:
        try:
            return await attempt(n)
        except give_up_on:
            raise
        except retry_on as exc:
            if n >= backoff.attempts:
                raise
            if on_retry is not None:
                on_retry(n, exc)
            await trio.sleep(backoff.delay(n - 1, rng))
            n += 1
