"""The one backoff policy and retry loop of non-transport retries (boot, npm installs), timed
with trio's MockClock (no I/O)."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from trio_swe._retry import Backoff, full_jitter, retry


class Flaky(Exception):
    pass


class Fatal(Flaky):
    pass


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def test_full_jitter_stays_under_its_exponential_ceiling() -> None:
    rng = random.Random(7)
    for n, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 5.0), (40, 5.0)]:
        waits = [full_jitter(n, base_sec=1.0, max_sec=5.0, rng=rng) for _ in range(200)]
        assert all(0.0 <= w <= ceiling for w in waits), (n, max(waits))
        assert max(waits) > ceiling / 2  # spread over the whole range, not pinned low
    assert full_jitter(3, base_sec=0.0, max_sec=5.0) == 0.0


async def test_retries_until_success_and_waits_between(clock: trio.testing.MockClock) -> None:
    seen: list[int] = []
    retried: list[tuple[int, str]] = []

    async def attempt(n: int) -> str:
        seen.append(n)
        if n < 3:
            raise Flaky(f"try {n}")
        return "ok"

    t0 = trio.current_time()
    got = await retry(
        attempt,
        Backoff(attempts=5, base_sec=1.0, max_sec=10.0),
        retry_on=(Flaky,),
        on_retry=lambda n, exc: retried.append((n, str(exc))),
        rng=random.Random(1),
    )
    assert got == "ok"
    assert seen == [1, 2, 3]
    assert retried == [(1, "try 1"), (2, "try 2")]
    assert 0.0 < trio.current_time() - t0 <= 1.0 + 2.0  # two waits, each under its ceiling


async def test_the_last_failure_propagates_unchanged(clock: trio.testing.MockClock) -> None:
    calls = 0

    async def attempt(n: int) -> None:
        nonlocal calls
        calls += 1
        raise Flaky(f"try {n}")

    with pytest.raises(Flaky, match="try 3"):
        await retry(attempt, Backoff(attempts=3, base_sec=0.5, max_sec=1.0), retry_on=(Flaky,))
    assert calls == 3


@pytest.mark.parametrize(
    ("exc", "kw"),
    [
        (Fatal("no"), {"give_up_on": (Fatal,)}),  # a retryable type, excluded
        (ValueError("no"), {}),  # not a retryable type at all
    ],
)
async def test_failures_not_worth_retrying_propagate_at_once(
    clock: trio.testing.MockClock, exc: Exception, kw: dict[str, object]
) -> None:
    calls = 0

    async def attempt(n: int) -> None:
        nonlocal calls
        calls += 1
        raise exc

    t0 = trio.current_time()
    with pytest.raises(type(exc)):
        await retry(
            attempt, Backoff(attempts=5, base_sec=1.0, max_sec=1.0), retry_on=(Flaky,), **kw
        )  # type: ignore[arg-type]
    assert calls == 1
    assert trio.current_time() == t0  # no wait
