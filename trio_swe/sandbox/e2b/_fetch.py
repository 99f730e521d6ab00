"""One request with retries, for every pool: the :class:`Exchange`/:class:`Transport` interfaces
both clients implement, and :func:`fetch` (REST, files, health, unary RPCs) over them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from . import _connect
from ._lanes import PoolStatistics
from ._retry import RetryPolicy, RetryStats, StreamIdleTimeout, classify, retry_call


class Exchange(Protocol):
    """One request in flight on a pool (either client): read the answer, then close it.

    ``status``/``header`` are valid after :meth:`receive_headers`; ``stream_id`` is our
    HTTP/2 stream id when known (for the GOAWAY rule of the retry table).
    """

    @property
    def stream_id(self) -> int | None: ...

    @property
    def status(self) -> int: ...

    def header(self, name: str) -> str | None: ...

    async def receive_headers(self, deadline: float = math.inf, *, shield: bool = False) -> bool:
        """Wait for the response headers; False when ``deadline`` passed first. ``shield``:
        cancellation does not interrupt the wait (it takes effect after it)."""
        ...

    async def receive(self) -> bytes: ...

    async def receive_by(self, deadline: float, *, shield: bool = False) -> bytes | None:
        """:meth:`receive`, or None when ``deadline`` passed first. ``shield``: cancellation
        does not interrupt the wait (it takes effect after it)."""
        ...

    def receive_nowait(self) -> bytes | None:
        """A chunk at hand without waiting (``b""``: the end), or None: await :meth:`receive`."""
        ...

    async def read_all(self) -> bytes: ...

    async def aclose(self) -> None: ...

    @property
    def confirms_silence(self) -> bool:
        """True when :meth:`silent_since` can prove a stream silent on a live connection;
        False when it cannot tell (httpx, HTTP/1.1): a watchdog then takes silence at face value."""
        ...

    @property
    def news(self) -> int:
        """A count that grows with each frame received for this stream (0 if not tracked)."""
        ...

    async def silent_since(self, news: int, sent_after: float) -> bool:
        """Nothing arrived since :attr:`news` was ``news``, although everything the peer sent
        before a PING sent at or after ``sent_after`` has been read (the silence is the
        stream's, not a connection or event loop that is behind)."""
        ...


class Transport(Protocol):
    """Connections to one origin that send requests as :class:`Exchange` s."""

    origin: str

    async def open(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> Exchange: ...

    def open_nowait(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> Exchange | None:
        """:meth:`open` when it can be done without waiting, else None (then await it)."""
        ...

    async def reset(self, exchange: Any) -> None: ...

    async def aclose(self) -> None: ...

    def statistics(self) -> PoolStatistics: ...


class Answer:
    """A response: status, body (``over``: cut at the caller's limit), headers (:meth:`header`)."""

    __slots__ = ("_ex", "content", "over", "status")

    def __init__(self, status: int, content: bytes, ex: Exchange, over: bool = False) -> None:
        self.status = status
        self.content = content
        self.over = over
        self._ex = ex

    @property
    def status_code(self) -> int:
        """``status``, under httpx's name."""
        return self.status

    def header(self, name: str) -> str | None:
        """The response header ``name`` (lowercase), or None."""
        return self._ex.header(name)


class Counted(Protocol):
    """A client whose attempts and connection resets are counted."""

    rpcs: int
    resets: int


async def fetch(
    transport: Transport,
    method: str,
    path: str,
    *,
    headers: Sequence[tuple[bytes, bytes]],
    body: bytes | None,
    ok: tuple[int, ...],
    idempotent: bool,
    timeout: float,
    policy: RetryPolicy,
    stats: RetryStats,
    rng: random.Random,
    owner: Counted,
    shield: bool = False,
    limit: int | None = None,
) -> Answer:
    """One plain request (REST, files, health, unary RPCs) with retries; the body read whole.

    Each attempt is bounded by ``timeout`` (a deadline on each wait, or a cancel scope around
    an ``open`` that must wait), not a read timeout: on HTTP/2 the connection's other streams
    keep the socket busy, so a hung request never times out.
    ``shield``: an attempt, once sent, runs to its answer (still bounded by ``timeout``) even if
    the caller is cancelled, so a cancelled mutation cannot land after the caller cleaned up;
    cancellation takes effect between attempts. A failure the retry table marks ``reset_pool``
    retires the connection. ``limit``: read at most ``limit + 1`` bytes of the body (memory
    stays bounded whatever the server sends); ``Answer.over`` says there were more.

    Raises:
        ConnectError: a status outside ``ok`` (after retries when transient).
    """
    bmethod, bpath = method.encode(), path.encode()

    async def attempt() -> Answer:
        owner.rpcs += 1
        ex: Exchange | None = None
        answer: Answer | None = None
        try:
            deadline = trio.current_time() + timeout
            ex = transport.open_nowait(bmethod, bpath, headers, body)
            if ex is not None:
                # Sent without waiting (the h2 client): the waits carry the deadline, no scope.
                answer = await _answer(ex, ok, limit, deadline, shield)
            else:
                with trio.CancelScope(shield=shield, deadline=deadline):
                    ex = await transport.open(bmethod, bpath, headers, body)
                    answer = await _answer(ex, ok, limit)
            if answer is None:
                raise StreamIdleTimeout(f"{method} {path.split('?')[0]} timed out")
        except Exception as exc:
            if classify(exc).reset_pool:
                owner.resets += 1
                stats.resets += 1
                await transport.reset(ex if ex is not None else exc)
            raise
        finally:
            if ex is not None:
                await ex.aclose()
        if answer.status not in ok:
            raise _connect.error_from_response(
                answer.status,
                answer.content,
                content_type=answer.header("content-type"),
                retry_after=answer.header("retry-after"),
            )
        return answer

    return await retry_call(attempt, idempotent=idempotent, policy=policy, stats=stats, rng=rng)


async def _answer(
    ex: Exchange,
    ok: tuple[int, ...],
    limit: int | None,
    deadline: float = math.inf,
    shield: bool = False,
) -> Answer | None:
    """The status and body of ``ex`` (at most ``limit + 1`` bytes of a body in ``ok``), or
    None when ``deadline`` passed first."""
    if not await ex.receive_headers(deadline, shield=shield):
        return None
    cap = math.inf if limit is None or ex.status not in ok else limit
    parts = []
    size = 0
    while chunk := await ex.receive_by(deadline, shield=shield):
        parts.append(chunk)
        size += len(chunk)
        if size > cap:
            content = b"".join(parts)
            return Answer(ex.status, content[: int(cap) + 1], ex, True)
    if chunk is None:
        return None
    return Answer(ex.status, b"".join(parts), ex)
