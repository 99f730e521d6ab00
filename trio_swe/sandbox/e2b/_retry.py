"""The retry policy of the E2B backend: one table says which failures are transient.

Rules:

* A failure is retried only if its row says *transient* and attempts remain.
* A call marked non-idempotent is retried only when the request provably never reached the
  server: the connection could not be opened, the pool had no slot, the stream was refused
  (``REFUSED_STREAM``), a GOAWAY's last-stream-id is below our stream, or a gateway answered 429
  (rate limiting refuses a request before forwarding it).
* Backoff is full-jitter exponential (``uniform(0, min(cap, base * 2**n))``); a ``Retry-After``
  from the server replaces it (capped).
* Rows marked *reset_pool* (protocol errors: the HTTP/2 connection's state can no longer be
  trusted) make the caller replace the connection before the next attempt.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import h2.exceptions
import httpx
import msgspec
import trio

from ..._retry import full_jitter
from . import _connect

T = TypeVar("T")

# h2 error codes (RFC 9113 §7) that we look at.
_REFUSED_STREAM: Final = 0x7

#: Attribute our transport sets on an exception raised while a response stream was open.
STREAM_ID_ATTR: Final = "_trio_swe_stream_id"


class StreamIdleTimeout(httpx.ReadTimeout):
    """Our own watchdog fired: a stream or request sent nothing for too long.

    On HTTP/2 httpx's read timeout cannot see a silent stream (the connection's other streams
    keep the socket busy), so the envd client bounds each read with a cancel scope instead.
    """


class StreamSilent(StreamIdleTimeout):
    """A stream sent nothing for too long while its connection provably kept up.

    The HTTP/2 client syncs with the peer (a PING, whose answer follows every frame sent
    before it) before raising this: the connection is alive and read up, so only this stream
    is lost and the connection stays in use. (A plain :class:`StreamIdleTimeout` cannot tell a
    silent stream from a silent connection, or from a starved event loop reading late.)
    """


class Failure(msgspec.Struct, frozen=True):
    """How one failure is handled.

    Attributes:
        kind: the row of the table that matched (also the statistics key).
        transient: worth another attempt.
        reached: the request may have reached the server (False only when provably not).
        reset_pool: replace the connection before retrying.
        retry_after: seconds the server asked us to wait.
    """

    kind: str
    transient: bool
    reached: bool
    reset_pool: bool = False
    retry_after: float | None = None


def _h2_event(exc: BaseException) -> Any:
    """The h2 event (StreamReset / ConnectionTerminated) that httpcore wrapped, if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for arg in cur.args:
            name = type(arg).__name__
            if name in ("StreamReset", "ConnectionTerminated"):
                return arg
        cur = cur.__cause__ or cur.__context__
    return None


def _has_cause(exc: BaseException, types: tuple[type[BaseException], ...]) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, types):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _connect_failure(exc: _connect.ConnectError) -> Failure:
    status = exc.http_status
    if status == 502 and "not found" in exc.message.lower():
        # The edge's "The sandbox was not found": it is gone, retrying cannot help.
        return Failure("sandbox_gone", False, True)
    if status == 429 or (status is None and exc.code == "resource_exhausted"):
        return Failure("http_429", True, False, retry_after=exc.retry_after)
    if status in (502, 503) or (status == 200 and exc.code == "unavailable"):
        return Failure(f"http_{status}", True, True, retry_after=exc.retry_after)
    return Failure(f"connect_{exc.code}", False, True)


def _protocol_failure(exc: httpx.RemoteProtocolError, stream_id: int | None) -> Failure:
    event = _h2_event(exc)
    name = type(event).__name__
    if name == "StreamReset":
        if int(getattr(event, "error_code", -1)) == _REFUSED_STREAM:
            return Failure("refused_stream", True, False)
        return Failure("stream_reset", True, True)
    if name == "ConnectionTerminated":
        last = getattr(event, "last_stream_id", None)
        below = stream_id is not None and last is not None and last < stream_id
        return Failure("goaway", True, not below, reset_pool=True)
    # "Server disconnected", h11 incomplete body, ...
    return Failure("connection_closed", True, True, reset_pool=True)


#: THE table: (kind or resolver, exception types, transient, reached, reset_pool). First match
#: wins; ``resolver`` rows look deeper at the exception. Order: most specific first.
_TABLE: Final[list[tuple[str, tuple[type[BaseException], ...], bool, bool, bool]]] = [
    # Never reached the server.
    ("pool_timeout", (httpx.PoolTimeout,), True, False, False),
    ("connect_timeout", (httpx.ConnectTimeout,), True, False, False),
    ("connect", (httpx.ConnectError,), True, False, False),
    # httpcore wraps every h2 ProtocolError met while sending or awaiting headers as a
    # LocalProtocolError; only "Max outbound streams" provably never sent (refined below).
    ("local_protocol", (httpx.LocalProtocolError,), True, True, True),
    # A raw h2 error from a response body (bad header block, frames on a closed connection).
    ("h2_protocol", (h2.exceptions.ProtocolError,), True, True, True),
    # Sent, maybe processed.
    # Silent while its connection kept up: the stream alone is lost.
    ("stream_silent", (StreamSilent,), True, True, False),
    # A silent stream may be a silent connection: put no new streams on it.
    ("stream_idle", (StreamIdleTimeout,), True, True, True),
    ("read_timeout", (httpx.ReadTimeout,), True, True, False),
    ("write_timeout", (httpx.WriteTimeout,), True, True, False),
    ("remote_protocol", (httpx.RemoteProtocolError,), True, True, True),  # refined below
    ("read", (httpx.ReadError,), True, True, True),
    ("write", (httpx.WriteError,), True, True, True),
    ("close", (httpx.CloseError,), True, True, True),
    ("framing", (_connect.ProtocolError,), True, True, True),
    ("tls", (ssl.SSLError,), True, True, True),
    ("connection_reset", (ConnectionError,), True, True, True),
    ("broken_stream", (trio.BrokenResourceError, trio.ClosedResourceError), True, True, True),
    ("deadline", (trio.TooSlowError, TimeoutError), True, True, False),
    ("network", (httpx.NetworkError, httpx.TimeoutException), True, True, True),
]


def classify(exc: BaseException, *, stream_id: int | None = None) -> Failure:
    """Classify a failure of one attempt.

    Args:
        exc: what the attempt raised.
        stream_id: our HTTP/2 stream id, when known (for GOAWAY's last-stream-id rule); by
            default read from the attribute :data:`STREAM_ID_ATTR` on ``exc``.
    """
    if stream_id is None:
        stream_id = getattr(exc, STREAM_ID_ATTR, None)
    if isinstance(exc, _connect.ConnectError):
        return _connect_failure(exc)
    if isinstance(exc, ValueError) and "semaphore released too many times" in str(exc):
        # httpcore 1.0's HTTP/2 connection, when the first request on a new connection is
        # cancelled just after the preface (in the loop that sets its stream semaphore up),
        # over-releases that semaphore once the server's SETTINGS arrive: the reading request
        # fails with this, the events of other streams in that read are dropped. The
        # connection cannot be trusted: replace it (the request may have been sent).
        return Failure("pool_state", True, True, True)
    for kind, types, transient, reached, reset in _TABLE:
        if isinstance(exc, types):
            if kind == "remote_protocol":
                return _protocol_failure(exc, stream_id)  # type: ignore[arg-type]
            if kind == "connect" and _has_cause(exc, (ssl.SSLError,)):
                return Failure("tls_handshake", True, False)
            if kind == "local_protocol" and (
                _has_cause(exc, (h2.exceptions.TooManyStreamsError,))
                or "max outbound streams" in str(exc).lower()
            ):
                return Failure("too_many_streams", True, False, True)
            return Failure(kind, transient, reached, reset)
    return Failure("fatal", False, True)


def should_retry(failure: Failure, *, idempotent: bool) -> bool:
    """The rule: transient, and either idempotent or provably never reached the server."""
    return failure.transient and (idempotent or not failure.reached)


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Bounded, full-jitter exponential backoff.

    Attributes:
        max_attempts: attempts in total, the first included.
        base_delay: scale of the first backoff (seconds).
        max_delay: cap of one backoff.
        max_retry_after: cap on a server's ``Retry-After``.
    """

    max_attempts: int = 6
    base_delay: float = 0.1
    max_delay: float = 5.0
    max_retry_after: float = 30.0

    def delay(self, failure: Failure, retry_index: int, rng: random.Random) -> float:
        """Seconds to sleep before retry number ``retry_index`` (0 for the first retry)."""
        if failure.retry_after is not None:
            return min(failure.retry_after, self.max_retry_after)
        return full_jitter(retry_index, base_sec=self.base_delay, max_sec=self.max_delay, rng=rng)


class RetryStats:
    """Counters shared by everything that retries through one backend."""

    def __init__(self) -> None:
        self.calls = 0
        self.attempts = 0
        self.retries = 0
        self.resets = 0
        self.gave_up = 0
        self.by_kind: dict[str, int] = {}

    def snapshot(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "attempts": self.attempts,
            "retries": self.retries,
            "resets": self.resets,
            "gave_up": self.gave_up,
            "failures": dict(self.by_kind),
        }


async def retry_call(
    attempt: Callable[[], Awaitable[T]],
    *,
    idempotent: bool,
    policy: RetryPolicy,
    stats: RetryStats,
    rng: random.Random,
    on_reset: Callable[[], Awaitable[None]] | None = None,
) -> T:
    """Run ``attempt`` until it succeeds, fails for good, or runs out of attempts.

    The last failure is re-raised unchanged; the caller translates it into a typed error.
    Cancellation is never caught.
    """
    stats.calls += 1
    retry_index = 0
    while True:
        stats.attempts += 1
        try:
            return await attempt()
        except Exception as exc:
            failure = classify(exc)
            stats.by_kind[failure.kind] = stats.by_kind.get(failure.kind, 0) + 1
            if failure.reset_pool and on_reset is not None:
                stats.resets += 1
                await on_reset()
            if not should_retry(failure, idempotent=idempotent):
                raise
            if retry_index + 1 >= policy.max_attempts:
                stats.gave_up += 1
                raise
            await trio.sleep(policy.delay(failure, retry_index, rng))
            retry_index += 1
            stats.retries += 1
