"""The retry table and the retry loop, timed with trio's MockClock (no I/O)."""

from __future__ import annotations

import random
import ssl

import h2.events
import h2.exceptions
import httpcore
import httpx
import pytest
import trio
import trio.testing

from trio_swe.sandbox.e2b import _connect
from trio_swe.sandbox.e2b._retry import (
    STREAM_ID_ATTR,
    Failure,
    RetryPolicy,
    RetryStats,
    StreamIdleTimeout,
    StreamSilent,
    classify,
    retry_call,
    should_retry,
)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def _wrapped(event: object, stream_id: int | None = None) -> httpx.RemoteProtocolError:
    """What httpx raises for an h2 event: httpx error chained from httpcore's."""
    inner = httpcore.RemoteProtocolError(event)
    outer = httpx.RemoteProtocolError(str(inner))
    outer.__cause__ = inner
    if stream_id is not None:
        setattr(outer, STREAM_ID_ATTR, stream_id)
    return outer


def _reset(code: int) -> httpx.RemoteProtocolError:
    return _wrapped(h2.events.StreamReset(stream_id=3, error_code=code))


def _goaway(last: int, ours: int | None) -> httpx.RemoteProtocolError:
    ev = h2.events.ConnectionTerminated()
    ev.error_code = 0
    ev.last_stream_id = last
    return _wrapped(ev, ours)


def _tls_connect() -> httpx.ConnectError:
    exc = httpx.ConnectError("handshake failed")
    exc.__cause__ = ssl.SSLError("bad record mac")
    return exc


@pytest.mark.parametrize(
    ("exc", "kind", "transient", "reached", "reset"),
    [
        (httpx.ConnectError("refused"), "connect", True, False, False),
        (httpx.ConnectTimeout("slow"), "connect_timeout", True, False, False),
        (httpx.PoolTimeout("pool"), "pool_timeout", True, False, False),
        (_tls_connect(), "tls_handshake", True, False, False),
        (
            httpx.LocalProtocolError("Max outbound streams is 100, 100 open"),
            "too_many_streams",
            True,
            False,
            True,
        ),
        (
            httpx.LocalProtocolError("Invalid input RECV_HEADERS"),
            "local_protocol",
            True,
            True,
            True,
        ),
        (
            h2.exceptions.ProtocolError("Error decoding header block"),
            "h2_protocol",
            True,
            True,
            True,
        ),
        (_reset(7), "refused_stream", True, False, False),
        (_reset(2), "stream_reset", True, True, False),
        (_reset(8), "stream_reset", True, True, False),
        (_goaway(last=1, ours=3), "goaway", True, False, True),
        (_goaway(last=3, ours=3), "goaway", True, True, True),
        (_goaway(last=5, ours=None), "goaway", True, True, True),
        (httpx.RemoteProtocolError("Server disconnected"), "connection_closed", True, True, True),
        (httpx.ReadError("reset by peer"), "read", True, True, True),
        (httpx.ReadTimeout("idle"), "read_timeout", True, True, False),
        (StreamIdleTimeout("silent"), "stream_idle", True, True, True),
        (StreamSilent("silent, connection alive"), "stream_silent", True, True, False),
        (httpx.WriteTimeout("idle"), "write_timeout", True, True, False),
        (ssl.SSLError("alert"), "tls", True, True, True),
        (ConnectionResetError(104, "reset"), "connection_reset", True, True, True),
        (trio.BrokenResourceError(), "broken_stream", True, True, True),
        (_connect.ProtocolError("ended inside an envelope"), "framing", True, True, True),
        (_connect.ConnectError("unavailable", http_status=502), "http_502", True, True, False),
        (_connect.ConnectError("unavailable", http_status=503), "http_503", True, True, False),
        (
            _connect.ConnectError("unavailable", "The sandbox was not found", http_status=502),
            "sandbox_gone",
            False,
            True,
            False,
        ),
        (
            _connect.ConnectError("resource_exhausted", http_status=429),
            "http_429",
            True,
            False,
            False,
        ),
        (
            _connect.ConnectError("not_found", http_status=404),
            "connect_not_found",
            False,
            True,
            False,
        ),
        (
            _connect.ConnectError("internal", http_status=500),
            "connect_internal",
            False,
            True,
            False,
        ),
        (ValueError("bug"), "fatal", False, True, False),
        # httpcore's corrupted stream semaphore (see tests/e2b/test_pool_state.py).
        (ValueError("semaphore released too many times"), "pool_state", True, True, True),
    ],
)
def test_table(exc: BaseException, kind: str, transient: bool, reached: bool, reset: bool) -> None:
    assert classify(exc) == Failure(kind, transient, reached, reset)


def test_non_idempotent_rule() -> None:
    never = classify(_reset(7))
    maybe = classify(_reset(2))
    assert should_retry(never, idempotent=False)
    assert should_retry(maybe, idempotent=True)
    assert not should_retry(maybe, idempotent=False)
    assert not should_retry(classify(ValueError()), idempotent=True)


def test_retry_after_is_kept() -> None:
    f = classify(_connect.error_from_response(429, b"", retry_after="7"))
    assert f.retry_after == 7.0
    assert RetryPolicy(max_retry_after=5.0).delay(f, 0, random.Random(0)) == 5.0


def test_full_jitter_stays_under_the_capped_ceiling() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0)
    rng = random.Random(1)
    f = Failure("read", True, True)
    for n, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (10, 4.0), (100, 4.0)]:
        delays = [policy.delay(f, n, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # really jittered over the whole range


class Flaky:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.calls: list[float] = []

    async def __call__(self) -> str:
        self.calls.append(trio.current_time())
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


async def test_retries_transient_failures_with_backoff(clock: trio.testing.MockClock) -> None:
    flaky = Flaky([httpx.ReadTimeout("a"), _reset(2), httpx.ReadError("b")])
    stats = RetryStats()
    resets = 0

    async def reset() -> None:
        nonlocal resets
        resets += 1

    policy = RetryPolicy(base_delay=1.0, max_delay=10.0)
    got = await retry_call(
        flaky, idempotent=True, policy=policy, stats=stats, rng=random.Random(3), on_reset=reset
    )
    assert got == "ok"
    assert len(flaky.calls) == 4
    gaps = [b - a for a, b in zip(flaky.calls, flaky.calls[1:], strict=False)]
    assert all(0 <= g <= 2.0**i for i, g in enumerate(gaps))
    assert resets == 1  # only the ReadError asks for a new connection
    snap = stats.snapshot()
    assert (snap["attempts"], snap["retries"], snap["resets"]) == (4, 3, 1)
    assert snap["failures"] == {"read_timeout": 1, "stream_reset": 1, "read": 1}


async def test_retry_after_is_honoured(clock: trio.testing.MockClock) -> None:
    flaky = Flaky([_connect.error_from_response(429, b"", retry_after="3")])
    await retry_call(
        flaky, idempotent=False, policy=RetryPolicy(), stats=RetryStats(), rng=random.Random(0)
    )
    assert flaky.calls[1] - flaky.calls[0] == pytest.approx(3.0)


async def test_non_idempotent_call_is_not_retried_once_sent(clock: trio.testing.MockClock) -> None:
    flaky = Flaky([httpx.ConnectError("x"), _reset(7), _reset(2)])
    stats = RetryStats()
    with pytest.raises(httpx.RemoteProtocolError):
        await retry_call(
            flaky, idempotent=False, policy=RetryPolicy(), stats=stats, rng=random.Random(0)
        )
    assert len(flaky.calls) == 3  # connect failure and REFUSED_STREAM retried, a reset is not
    assert stats.retries == 2


async def test_attempts_are_bounded(clock: trio.testing.MockClock) -> None:
    flaky = Flaky([httpx.ConnectError("x")] * 10)
    stats = RetryStats()
    start = trio.current_time()
    with pytest.raises(httpx.ConnectError):
        await retry_call(
            flaky,
            idempotent=True,
            policy=RetryPolicy(max_attempts=4, base_delay=1.0, max_delay=2.0),
            stats=stats,
            rng=random.Random(0),
        )
    assert len(flaky.calls) == 4
    assert stats.gave_up == 1
    assert trio.current_time() - start <= 1.0 + 2.0 + 2.0


async def test_fatal_errors_are_raised_at_once(clock: trio.testing.MockClock) -> None:
    flaky = Flaky([_connect.ConnectError("not_found", http_status=404)])
    with pytest.raises(_connect.ConnectError):
        await retry_call(
            flaky, idempotent=True, policy=RetryPolicy(), stats=RetryStats(), rng=random.Random(0)
        )
    assert len(flaky.calls) == 1


async def test_cancellation_is_not_retried(clock: trio.testing.MockClock) -> None:
    flaky = Flaky([httpx.ConnectError("x")] * 100)
    with trio.move_on_after(0.05) as scope:
        await retry_call(
            flaky,
            idempotent=True,
            policy=RetryPolicy(max_attempts=100, base_delay=1.0),
            stats=RetryStats(),
            rng=random.Random(0),
        )
    assert scope.cancelled_caught
