"""A client of one sandbox's envd: Connect RPCs for processes, HTTP for files and health.

Every request takes a stream slot from the shared pool of the envd origin (the purpose-built
HTTP/2 client of :mod:`._h2pool`, or httpx's :class:`~._httpxpool.ConnectionPool` on HTTP/1.1), plain requests go
through the one request-and-retry function :func:`~._fetch.fetch`, and all are counted. Server
streams get an idle watchdog: envd sends a keepalive event every ``Keepalive-Ping-Interval``
seconds, so a stream silent for much longer than that is dead (on HTTP/2 a read timeout cannot
see it: the connection's other streams keep the socket busy).
"""

from __future__ import annotations

import base64
import math
import random
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Final, TypeVar
from urllib.parse import quote

import httpx
import msgspec
import trio

from . import _connect, _wire
from ._fetch import Answer, Exchange, Transport, fetch
from ._retry import (
    STREAM_ID_ATTR,
    RetryPolicy,
    RetryStats,
    StreamIdleTimeout,
    StreamSilent,
    classify,
)

T = TypeVar("T")

ENVD_PORT: Final = 49983
PROCESS_SERVICE: Final = "process.Process"
FILESYSTEM_SERVICE: Final = "filesystem.Filesystem"
_PROCESS_PATHS: Final = {
    m: _connect.procedure_path(PROCESS_SERVICE, m).encode() for m in ("Start", "Connect")
}
#: Longest wait for a Start's response headers before the connection is synced (the value a
#: 15 s keepalive gave).
_HEADERS_TIMEOUT_CAP: Final = 38.5


def _encode_headers(headers: Mapping[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in headers.items()]


def basic_user(user: str) -> str:
    """envd's user selection: ``Authorization: Basic base64("<user>:")``."""
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


class DeadlinePassed(Exception):
    """The caller's own deadline (``not_after``) passed while a stream was awaited.

    The wait ends without a cancel scope of its own (a scope per exec cost more than the
    HTTP/2 work of a short one): the caller reads this as its deadline, not as a failure of
    the stream."""


class EventStream:
    """The events of one ``Start``/``Connect`` server stream, read with an idle watchdog."""

    def __init__(self, exchange: Exchange, idle_timeout: float) -> None:
        self._ex = exchange
        self._decoder = _connect.EnvelopeDecoder()
        self._pending: deque[_connect.Envelope] = deque()
        self._idle = idle_timeout
        self.finished = False

    async def next_event(
        self, not_after: float = math.inf, *, shield: bool = False, idle: float | None = None
    ) -> _wire.ProcessEvent | None:
        """The next event; ``None`` after a clean end-of-stream.

        ``not_after``: the caller's deadline (then :class:`DeadlinePassed`); ``shield``:
        cancellation does not interrupt the wait (it takes effect at the caller's next
        checkpoint), as in a shielded cancel scope; ``idle``: this wait's watchdog instead of
        the stream's ``idle_timeout``.

        Raises:
            ConnectError: the end-of-stream message carried an error.
            ProtocolError: the body ended without an end-of-stream message, or mid-envelope.
            StreamIdleTimeout: nothing arrived for ``idle_timeout`` seconds.
            DeadlinePassed: ``not_after`` passed first.
        """
        pending = self._pending
        while True:
            while pending:
                env = pending.popleft()
                if env.flags & _connect.FLAG_END_STREAM:
                    self.finished = True
                    await self._drain(not_after, shield)
                    err = _connect.end_stream_error(_connect.parse_end_stream(env.payload))
                    if err is not None:
                        raise err
                    return None
                msg = _wire.decode(env.payload, _wire.StartResponse)
                if msg.event is not None:
                    return msg.event
            if self.finished:
                return None
            chunk = self._ex.receive_nowait()  # no watchdog for what is already here
            if chunk is None:
                chunk = await self._receive_watched(not_after, shield, idle or self._idle)
            elif not shield:
                await trio.lowlevel.checkpoint_if_cancelled()
            if not chunk:
                self._decoder.check_complete()
                raise _connect.ProtocolError("stream ended without an end-of-stream message")
            pending.extend(self._decoder.feed(chunk))

    async def _receive_watched(self, not_after: float, shield: bool, idle: float) -> bytes:
        """The next chunk; raises once the stream (not its connection) was silent too long.

        The watchdog firing proves nothing by itself: a starved event loop reads its sockets
        late, and then every stream looks silent at once. So the connection syncs with the
        peer first (:meth:`~._fetch.Exchange.silent_since`); only a stream still silent after
        everything the peer sent has been read is dead. A dead connection is the connection's
        own liveness check's to find (one failure for all its streams, not one per stream).
        """
        ex = self._ex
        while True:
            news = ex.news
            deadline = trio.current_time() + idle
            chunk = await ex.receive_by(min(deadline, not_after), shield=shield)
            if chunk is not None:
                return chunk
            if trio.current_time() >= not_after:
                raise DeadlinePassed
            # The watchdog fired (rare): the sync is bounded by the caller's deadline.
            with trio.CancelScope(shield=shield, deadline=not_after) as scope:
                silent = await ex.silent_since(news, deadline)
            if scope.cancelled_caught:
                raise DeadlinePassed
            if silent:
                if ex.confirms_silence:
                    raise StreamSilent(f"stream silent for {idle:.1f} s on a live connection")
                raise StreamIdleTimeout(f"stream silent for {idle:.1f} s")
            chunk = ex.receive_nowait()
            if chunk is not None:
                return chunk
            # Otherwise the news was a failure: the next receive raises it.

    async def _drain(self, not_after: float, shield: bool) -> None:
        """Read the body to its end after the end-of-stream message (normally nothing is left).

        The HTTP/2 end of the stream usually follows at once: reading it means the close
        sends no RST_STREAM (and httpx's body iterators end instead of being finalized by trio,
        a system task per async generator). The outcome is already known: a failure is ignored.
        """
        while chunk := self._ex.receive_nowait():
            pass
        if chunk == b"":
            return  # ended already (the usual case on HTTP/2): no watchdog needed
        deadline = min(trio.current_time() + self._idle, not_after)
        try:
            while await self._ex.receive_by(deadline, shield=shield):
                pass
        except (httpx.TransportError, httpx.StreamError):
            pass


async def _await_headers(
    ex: Exchange, due: float, not_after: float = math.inf, shield: bool = False
) -> int:
    """The response status, or 0 when none came by ``due`` while the connection kept up, or
    by ``not_after`` (the caller's deadline, which a shielded wait must not overrun).

    As :meth:`EventStream._receive_watched`: past ``due`` the connection syncs with the peer
    before the silence is believed. ``shield``: cancellation does not interrupt the wait.
    """
    while not ex.status:
        news = ex.news
        if await ex.receive_headers(min(due, not_after), shield=shield):
            break
        if trio.current_time() >= not_after:
            break
        with trio.CancelScope(shield=shield, deadline=not_after):
            if await ex.silent_since(news, due):
                break
    return ex.status


class EnvdClient:
    """envd of one sandbox, reached through ``pool`` with routing/auth ``headers``.

    Args:
        pool: connections to the envd origin (either client: :class:`~._fetch.Transport`).
        headers: ``X-Access-Token``, ``E2b-Sandbox-Id``, ``E2b-Sandbox-Port``...
        policy: retry policy.
        stats: where retries and resets are counted (shared with the backend).
        keepalive_interval: seconds between envd keepalive events we ask for.
        request_timeout: bound on a unary call or file transfer attempt.
    """

    def __init__(
        self,
        pool: Transport,
        headers: Mapping[str, str],
        *,
        policy: RetryPolicy,
        stats: RetryStats,
        rng: random.Random,
        keepalive_interval: float = 15.0,
        request_timeout: float = 60.0,
    ) -> None:
        self.pool = pool
        self.headers = dict(headers)
        self._headers = _encode_headers(self.headers)
        self.policy = policy
        self.stats = stats
        self.rng = rng
        self.keepalive_interval = keepalive_interval
        self.idle_timeout = keepalive_interval * 2.5 + 1.0
        # The response headers of a Start come when envd started the process, not with a
        # keepalive: a loaded sandbox gets at least 15 s, a long keepalive does not stretch it
        # (a shielded Start waits this long at most before syncing the connection).
        self.headers_timeout = min(max(self.idle_timeout, 15.0), _HEADERS_TIMEOUT_CAP)
        #: The watchdog of a Start's first event (envd's ``start``, sent with the headers).
        self.start_timeout = min(self.idle_timeout, _HEADERS_TIMEOUT_CAP)
        self.request_timeout = request_timeout
        self.rpcs = 0
        self.resets = 0
        # Every request's headers as HTTP/2 sends them, built once: the sandbox's routing and
        # auth, then Connect's fixed headers (and the keepalive we ask for, on streams).
        keepalive = (b"keepalive-ping-interval", str(max(1, round(keepalive_interval))).encode())
        self._stream_headers = [*self._headers, keepalive, *_connect.STREAM_HEADERS]
        self._unary_headers = [*self._headers, *_connect.UNARY_HEADERS]
        self._auth: dict[str, tuple[bytes, bytes]] = {}
        #: A stream request's headers by (user, Connect-Timeout-Ms): execs repeat a few.
        self._stream_headers_for: dict[
            tuple[str | None, int | None], list[tuple[bytes, bytes]]
        ] = {}

    def _user(self, user: str) -> tuple[bytes, bytes]:
        """The ``authorization`` header that selects ``user`` (cached per user)."""
        header = self._auth.get(user)
        if header is None:
            if len(self._auth) > 64:
                self._auth.clear()
            header = self._auth[user] = (b"authorization", basic_user(user).encode())
        return header

    # --- plumbing ------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        raw_headers: Sequence[tuple[bytes, bytes]] | None = None,
        idempotent: bool,
        ok: tuple[int, ...] = (200,),
        shield: bool = False,
        limit: int | None = None,
        timeout: float | None = None,
    ) -> Answer:
        """One plain HTTP request (files, health, unary RPCs) with retries; body read.

        ``headers``: more headers than the sandbox's own; ``raw_headers`` instead: the
        request's complete headers as HTTP/2 sends them (built once by the callers here). See :func:`~._fetch.fetch` (``shield``: a sent attempt runs to its answer; ``limit``:
        read at most ``limit + 1`` bytes of the body; ``timeout``: each attempt's bound
        instead of the client's ``request_timeout``).

        Raises:
            ConnectError: a status outside ``ok`` (after retries when transient).
        """
        return await fetch(
            self.pool,
            method,
            path,
            headers=raw_headers or self._with(*_encode_headers(headers or {})),
            body=content,
            ok=ok,
            idempotent=idempotent,
            timeout=self.request_timeout if timeout is None else timeout,
            policy=self.policy,
            stats=self.stats,
            rng=self.rng,
            owner=self,
            shield=shield,
            limit=limit,
        )

    def _with(self, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
        """The sandbox's headers and ``extra``."""
        return [*self._headers, *extra]

    async def _unary(
        self,
        service: str,
        method: str,
        message: msgspec.Struct,
        response_type: type[T],
        *,
        idempotent: bool,
        user: str | None = None,
    ) -> T:
        headers = self._unary_headers
        if user:
            headers = [*headers, self._user(user)]
        resp = await self.request(
            "POST",
            _connect.procedure_path(service, method),
            content=_wire.encode(message),
            raw_headers=headers,
            idempotent=idempotent,
        )
        return _wire.decode(resp.content, response_type)

    async def unary(
        self,
        method: str,
        message: msgspec.Struct,
        response_type: type[T],
        *,
        idempotent: bool,
        user: str | None = None,
    ) -> T:
        """A unary Connect call to ``process.Process/<method>``."""
        return await self._unary(
            PROCESS_SERVICE, method, message, response_type, idempotent=idempotent, user=user
        )

    @asynccontextmanager
    async def open_stream(
        self,
        method: str,
        message: msgspec.Struct,
        *,
        user: str | None = None,
        timeout_ms: int | None = None,
        shield: bool = False,
        not_after: float = math.inf,
    ) -> AsyncIterator[EventStream]:
        """Open one ``process.Process/<method>`` server stream (one attempt, no retry).

        ``shield``: sending the request and waiting for the response headers is not
        interrupted by cancellation (bounded by the headers timeout), so a caller that is
        cancelled knows whether its ``Start`` reached envd. ``not_after`` caps that wait: the
        caller's own deadline is never overrun by a shielded wait.

        Failures raised inside the block carry our HTTP/2 stream id (for the GOAWAY rule) and
        retire the connection when the retry table says so.
        """
        key = (user, timeout_ms)
        headers = self._stream_headers_for.get(key)
        if headers is None:
            headers = [*self._stream_headers]
            if user:
                headers.append(self._user(user))
            if timeout_ms is not None:
                headers.append(_connect.timeout_header(timeout_ms))
            if len(self._stream_headers_for) > 64:
                self._stream_headers_for.clear()
            self._stream_headers_for[key] = headers
        body = _connect.encode_envelope(_wire.encode(message))
        path = (
            _PROCESS_PATHS.get(method) or _connect.procedure_path(PROCESS_SERVICE, method).encode()
        )
        self.rpcs += 1
        ex: Exchange | None = None
        stream_id: int | None = None
        status = 0
        try:
            # Response headers come once envd started the process: give a loaded sandbox
            # more time than a silent stream gets.
            due = trio.current_time() + self.headers_timeout
            ex = self.pool.open_nowait(b"POST", path, headers, body)
            if ex is None:
                with trio.CancelScope(shield=shield, deadline=min(due, not_after)):
                    ex = await self.pool.open(b"POST", path, headers, body)
            if ex is not None:
                stream_id = ex.stream_id
                status = await _await_headers(ex, due, not_after, shield)
            if ex is None or not status:
                if trio.current_time() >= not_after:
                    raise DeadlinePassed  # the caller's deadline, not the stream's failure
                if ex is not None and ex.confirms_silence:
                    raise StreamSilent("no response headers, on a live connection")
                raise StreamIdleTimeout("no response headers")
            if status != 200:
                with trio.CancelScope(deadline=not_after) as scope:  # an error answer: rare
                    content = await ex.read_all()
                if scope.cancelled_caught:
                    raise DeadlinePassed
                raise _connect.error_from_response(
                    status,
                    content,
                    content_type=ex.header("content-type"),
                    retry_after=ex.header("retry-after"),
                )
            yield EventStream(ex, self.idle_timeout)
        except DeadlinePassed:
            raise
        except Exception as exc:
            if stream_id is not None:
                setattr(exc, STREAM_ID_ATTR, stream_id)
            if classify(exc).reset_pool:
                self.resets += 1
                self.stats.resets += 1
                await self.pool.reset(ex if ex is not None else exc)
            raise
        finally:
            if ex is not None:
                await ex.aclose()

    # --- envd API ------------------------------------------------------------------------

    async def send_signal(self, selector: _wire.ProcessSelector, signal: str) -> bool:
        """Signal a process; False when envd does not know it (already gone)."""
        try:
            await self.unary(
                "SendSignal",
                _wire.SendSignalRequest(process=selector, signal=signal),
                _wire.SendSignalResponse,
                idempotent=True,
            )
        except _connect.ConnectError as exc:
            if exc.code == "not_found":
                return False
            raise
        return True

    async def list_processes(self) -> list[_wire.ProcessInfo]:
        resp = await self.unary("List", _wire.ListRequest(), _wire.ListResponse, idempotent=True)
        return resp.processes

    async def health(self) -> bool:
        """``GET /health``: True when envd answers 204; False when the edge says it is gone.

        Only the edge's "The sandbox was not found" (502) means gone: any other 502/503 (a
        gateway hiccup) is not proof, and raises like any other failure.
        """
        try:
            await self.request("GET", "/health", idempotent=True, ok=(200, 204))
        except _connect.ConnectError as exc:
            if exc.http_status in (404, 410) or (
                exc.http_status == 502 and "not found" in exc.message.lower()
            ):
                return False
            raise
        return True

    async def write_file(
        self, path: str, data: bytes, *, user: str, not_after: float = math.inf
    ) -> None:
        """``POST /files?path=...`` with an octet-stream body (overwrites; idempotent).

        A sent attempt runs to its answer even if cancelled, bounded by the request timeout
        and by ``not_after`` (the caller's deadline, on trio's clock)."""
        await self.request(
            "POST",
            f"/files?path={quote(path, safe='/')}&username={quote(user, safe='')}",
            content=data,
            raw_headers=self._with(
                (b"content-type", b"application/octet-stream"), self._user(user)
            ),
            idempotent=True,
            shield=True,
            timeout=min(self.request_timeout, max(not_after - trio.current_time(), 0.001)),
        )

    async def read_file(self, path: str, *, user: str) -> bytes:
        """``GET /files?path=...``; raises ConnectError (``not_found`` for a missing file)."""
        resp = await self.request(
            "GET",
            f"/files?path={quote(path, safe='/')}&username={quote(user, safe='')}",
            raw_headers=self._with(self._user(user), (b"accept-encoding", b"identity")),
            idempotent=True,
        )
        return resp.content

    async def stat(self, path: str, *, user: str) -> _wire.EntryInfo:
        """``filesystem.Filesystem/Stat``; raises ConnectError (``not_found`` when missing)."""
        resp = await self._unary(
            FILESYSTEM_SERVICE,
            "Stat",
            _wire.StatRequest(path=path),
            _wire.StatResponse,
            idempotent=True,
            user=user,
        )
        entry = resp.entry
        if entry is None:
            raise _connect.ProtocolError(f"Stat {path}: the answer has no entry")
        return entry

    async def read_file_capped(
        self, path: str, *, user: str, limit: int | None
    ) -> tuple[bytes, bool]:
        """``GET /files`` reading at most ``limit + 1`` bytes: ``(data, more_than_limit)``.

        Asks for ``Range: bytes=0-<limit>`` (envd serves ranges) and stops reading the body
        past the limit whatever the server sends, so memory stays bounded either way.
        """
        extra = self._with(self._user(user), (b"accept-encoding", b"identity"))
        if limit is not None:
            extra.append((b"range", f"bytes=0-{limit}".encode()))
        resp = await self.request(
            "GET",
            f"/files?path={quote(path, safe='/')}&username={quote(user, safe='')}",
            raw_headers=extra,
            idempotent=True,
            ok=(200, 206, 416),  # 416: a range of an empty file
            limit=limit,
        )
        if resp.status == 416:
            return b"", False
        return resp.content, resp.over
