"""HTTP/2 connections to one origin, with a cap on concurrent streams per connection.

E2B's edge allows 100 concurrent streams per HTTP/2 connection and every sandbox shares one
origin (``https://sandbox.e2b.app``). One ``httpx.AsyncClient`` would queue the 101st stream
behind the others (or fail with "Max outbound streams"). So the pool keeps several clients, each
with at most one live HTTP/2 connection carrying at most ``streams_per_connection`` streams
(default 64, well below the edge's 100), and opens another connection when all are full, up to
``max_connections``. A connection that broke the protocol is *retired*: new streams go to a fresh
one, and the old one is closed when its last stream ends.
"""

from __future__ import annotations

import math
import random
import ssl
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Generic, Protocol, TypeVar

import httpcore
import httpx
import msgspec
import trio

from . import _connect
from ._retry import RetryPolicy, RetryStats, StreamIdleTimeout, classify, retry_call

#: Per-connection stream cap: below the E2B edge's SETTINGS_MAX_CONCURRENT_STREAMS of 100.
DEFAULT_STREAMS_PER_CONNECTION = 64
#: Connections per origin: with the cap above, 16,384 concurrent streams. Every detached command
#: holds one long-poll stream, so 10,000 concurrent commands need at least 157 connections; at 32
#: (2,048 streams) the rest waited for a slot and their commands' ends went unseen.
DEFAULT_MAX_CONNECTIONS = 256


#: Bound on one socket write that must not be interrupted (see :class:`WholeWrites`).
WRITE_BOUND_SEC = 30.0


class _WholeWriteStream(httpcore.AsyncNetworkStream):
    """A network stream whose writes, once begun, complete (or fail): never half-cancelled.

    httpcore's HTTP/2 connection drains h2's whole outbound buffer, the frames of *every*
    stream (other requests' HEADERS, WINDOW_UPDATEs), before writing it. A cancellation that
    lands in that write (a watchdog or deadline of one request whose body read acknowledged
    data) throws those frames away: other requests never reach the server, and the peer's
    HPACK table no longer matches ours (the fault proxy saw ``InvalidTableIndex``; a real
    server answers COMPRESSION_ERROR). A write is short unless the peer stops reading, so it
    runs shielded, bounded by ``WRITE_BOUND_SEC`` (then the connection is failed for good).
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        bound = WRITE_BOUND_SEC if timeout is None else min(timeout, WRITE_BOUND_SEC)
        with trio.CancelScope(shield=True, deadline=trio.current_time() + bound) as scope:
            await self._inner.write(buffer, None)
        if scope.cancelled_caught:
            raise httpcore.WriteTimeout(f"a socket write did not complete in {bound:g} s")

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _WholeWriteStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class WholeWrites(httpcore.AsyncNetworkBackend):
    """httpcore network backend wrapper: every stream it opens is a :class:`_WholeWriteStream`."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _WholeWriteStream(stream)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._inner.connect_unix_socket(path, timeout, socket_options)
        return _WholeWriteStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def whole_write_transport(**kwargs: Any) -> httpx.AsyncHTTPTransport:
    """An ``httpx.AsyncHTTPTransport`` whose connections use :class:`WholeWrites`.

    httpx does not take a network backend, so the one of its httpcore pool is wrapped (the pool
    opens connections lazily, with whatever backend it holds then).
    """
    transport = httpx.AsyncHTTPTransport(**kwargs)
    pool = transport._pool
    if not isinstance(getattr(pool, "_network_backend", None), httpcore.AsyncNetworkBackend):
        raise RuntimeError("httpcore's connection pool layout changed: cannot wrap its backend")
    pool._network_backend = WholeWrites(pool._network_backend)
    return transport


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
        False when it cannot tell (httpx): a watchdog then takes silence at face value."""
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


class HttpxExchange:
    """:class:`Exchange` over an httpx streaming response (sent and answered by ``open``)."""

    def __init__(
        self, pool: ConnectionPool, lane: Lane[httpx.AsyncClient], response: httpx.Response
    ) -> None:
        self._pool = pool
        self._lane = lane
        self._response = response
        self._chunks = response.aiter_raw()
        self._closed = False
        self.stream_id: int | None = response.extensions.get("stream_id")

    @property
    def client(self) -> httpx.AsyncClient:
        return self._lane.conn

    @property
    def status(self) -> int:
        return self._response.status_code

    def header(self, name: str) -> str | None:
        value: str | None = self._response.headers.get(name)
        return value

    async def receive_headers(self, deadline: float = math.inf, *, shield: bool = False) -> bool:
        if not shield:
            await trio.lowlevel.checkpoint_if_cancelled()
        return True  # httpx's send() returned with them

    async def receive(self) -> bytes:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return b""

    async def receive_by(self, deadline: float, *, shield: bool = False) -> bytes | None:
        with trio.CancelScope(deadline=deadline, shield=shield):
            return await self.receive()
        return None

    def receive_nowait(self) -> bytes | None:
        return None

    confirms_silence = False
    news = 0

    async def silent_since(self, news: int, sent_after: float) -> bool:
        return True  # httpcore gives no way to sync with the peer: silence is taken as it is

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.receive():
            parts.append(chunk)
        return b"".join(parts)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with trio.CancelScope(shield=True):
                await self._response.aclose()
        finally:
            await self._pool._release(self._lane)


class PoolStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """One origin's connection pool.

    Attributes:
        origin: ``scheme://host:port``.
        connections: connections open now.
        connections_opened: connections opened in all.
        retired_draining: retired connections still finishing their streams.
        resets: pool resets after protocol errors.
        active_streams: streams in flight now.
        peak_streams: the most streams in flight at once.
        streams_total: streams opened in all.
        slot_waits: requests that waited for a free stream slot.
        streams_per_connection: the cap of concurrent streams on one connection.
        client: ``"httpx"``, or ``"h2"`` for the purpose-built client (:mod:`._h2conn`).
    """

    origin: str
    connections: int
    connections_opened: int
    retired_draining: int
    resets: int
    active_streams: int
    peak_streams: int
    streams_total: int
    slot_waits: int
    streams_per_connection: int
    client: str = "httpx"


C = TypeVar("C")


class Lane(Generic[C]):
    """One connection of a pool, with the streams it carries."""

    __slots__ = ("active", "conn", "retired")

    def __init__(self, conn: C) -> None:
        self.conn = conn
        self.active = 0
        self.retired = False


class Lanes(Generic[C]):
    """The sharding bookkeeping of both pools: which connection takes the next stream.

    At most ``per_conn`` streams per connection; another connection once the least loaded one
    is half full, up to ``max_conns``; beyond ``per_conn * max_conns`` streams callers wait for
    a free slot. A retired connection takes no new streams and is closed once its last stream
    ended (the caller closes it when :meth:`release` or :meth:`retire` says so). Counts what
    :class:`PoolStatistics` reports.
    """

    def __init__(
        self,
        origin: str,
        per_conn: int,
        max_conns: int,
        new_conn: Callable[[], C],
        usable: Callable[[C], bool] | None = None,
        close_soon: Callable[[Lane[C]], None] | None = None,
        *,
        client: str,
    ) -> None:
        if per_conn < 1 or max_conns < 1:
            raise ValueError("streams_per_connection and max_connections must be >= 1")
        self.origin = origin
        self.per_conn = per_conn
        self.max_conns = max_conns
        self._new_conn = new_conn
        self._usable = usable
        self._close_soon = close_soon
        self._client = client
        self.lanes: list[Lane[C]] = []
        self.retired: list[Lane[C]] = []
        self._in_use = 0
        self._waiters = trio.lowlevel.ParkingLot()
        self.closed = False
        self.connections_opened = 0
        self.resets = 0
        self.streams_total = 0
        self.peak_streams = 0
        self.slot_waits = 0

    @property
    def full(self) -> bool:
        return self._in_use >= self.per_conn * self.max_conns

    def pick(self) -> Lane[C]:
        """The lane for the next stream (opening one when due); no slot is taken. Lanes found
        unusable are retired (and handed to ``close_soon`` when they carry no stream)."""
        best: Lane[C] | None = None
        usable = self._usable
        for lane in list(self.lanes) if usable is not None else self.lanes:
            if usable is not None and not usable(lane.conn):
                if self.retire(lane) and self._close_soon is not None:
                    self._close_soon(lane)
                continue
            if best is None or lane.active < best.active:
                best = lane
        # Spread: another connection once the least loaded one is half full (never a stream on
        # a full one: the slot count guarantees a lane can be opened then).
        if best is None or (best.active >= self.per_conn // 2 and len(self.lanes) < self.max_conns):
            self.connections_opened += 1
            best = Lane(self._new_conn())
            self.lanes.append(best)
        return best

    def take(self, lane: Lane[C]) -> None:
        """Count a stream on ``lane`` (a slot must be free: see :attr:`full`)."""
        self._in_use += 1
        lane.active += 1
        self.streams_total += 1
        if self._in_use > self.peak_streams:
            self.peak_streams = self._in_use

    async def acquire(self) -> Lane[C]:
        """Wait for a free slot, pick a lane and count the stream on it."""
        if self.closed:
            raise RuntimeError("connection pool is closed")
        if self.full:
            self.slot_waits += 1
            while self.full:
                await self._waiters.park()
        lane = self.pick()
        self.take(lane)
        return lane

    def release(self, lane: Lane[C]) -> bool:
        """A stream on ``lane`` ended; True when the lane is to be closed now."""
        lane.active -= 1
        self._in_use -= 1
        if self._waiters:
            self._waiters.unpark()
        return lane.active == 0 and (
            lane.retired or (self._usable is not None and not self._usable(lane.conn))
        )

    def retire(self, lane: Lane[C]) -> bool:
        """Put no new stream on ``lane``; True when it was in use and carries none now (close
        it). False when it was retired already."""
        if lane not in self.lanes:
            return False
        self.lanes.remove(lane)
        lane.retired = True
        self.retired.append(lane)
        return lane.active == 0

    def forget(self, lane: Lane[C]) -> bool:
        """Drop ``lane`` from the pool (it is being closed); False when it was gone already."""
        if lane in self.retired:
            self.retired.remove(lane)
        elif lane in self.lanes:
            self.lanes.remove(lane)
        else:
            return False
        return True

    def close_all(self) -> list[Lane[C]]:
        """Every lane, forgotten (the pool is closing)."""
        self.closed = True
        lanes = self.lanes + self.retired
        self.lanes, self.retired = [], []
        return lanes

    @property
    def active_streams(self) -> int:
        return self._in_use

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            origin=self.origin,
            connections=len(self.lanes),
            connections_opened=self.connections_opened,
            retired_draining=len(self.retired),
            resets=self.resets,
            active_streams=self._in_use,
            peak_streams=self.peak_streams,
            streams_total=self.streams_total,
            slot_waits=self.slot_waits,
            streams_per_connection=self.per_conn,
            client=self._client,
        )


class ConnectionPool:
    """Connections to one origin; hands out a client with a free stream slot.

    Connections open lazily; a new one opens when the least loaded is half full, so streams
    spread over up to ``max_connections`` connections (:class:`Lanes`).

    Args:
        origin: ``scheme://host:port``.
        http2: use HTTP/2 (ALPN over TLS).
        h2c: speak HTTP/2 with prior knowledge on ``http://`` (no HTTP/1.1 at all).
        verify: TLS verification (``True`` or an ``ssl.SSLContext``).
        streams_per_connection: cap of concurrent streams on one connection.
        max_connections: cap of connections; beyond ``streams_per_connection *
            max_connections`` concurrent streams, callers wait for a free slot.
        headers: sent with every request.
        connect_timeout: seconds to open a connection.
    """

    def __init__(
        self,
        origin: str,
        *,
        http2: bool = True,
        h2c: bool = False,
        verify: ssl.SSLContext | bool = True,
        streams_per_connection: int = DEFAULT_STREAMS_PER_CONNECTION,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.origin = origin.rstrip("/")
        self._http2 = http2 or h2c
        self._h2c = h2c
        self._verify = verify
        self._per_conn = streams_per_connection
        self._headers = dict(headers or {})
        self._connect_timeout = connect_timeout
        self._lanes: Lanes[httpx.AsyncClient] = Lanes(
            self.origin, streams_per_connection, max_connections, self._new_client, client="httpx"
        )

    @property
    def resets(self) -> int:
        return self._lanes.resets

    def _new_client(self) -> httpx.AsyncClient:
        # One live connection per client on HTTP/2 (+1 to replace one that got a GOAWAY);
        # on HTTP/1.1 a connection carries one stream at a time, so allow the whole cap.
        limits = httpx.Limits(
            max_connections=2 if self._http2 else self._per_conn,
            max_keepalive_connections=2 if self._http2 else self._per_conn,
            keepalive_expiry=300.0,
        )
        transport = whole_write_transport(
            verify=self._verify, http1=not self._h2c, http2=self._http2, limits=limits
        )
        return httpx.AsyncClient(
            base_url=self.origin,
            transport=transport,
            headers=self._headers,
            timeout=httpx.Timeout(self._connect_timeout * 3, connect=self._connect_timeout),
            trust_env=False,
        )

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[httpx.AsyncClient]:
        """Reserve one stream slot; yields the client to send that one request with."""
        lane = await self._lanes.acquire()
        try:
            yield lane.conn
        finally:
            await self._release(lane)

    def open_nowait(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> None:
        return None  # httpx always awaits its response headers

    async def open(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> HttpxExchange:
        """Take a stream slot, send one request and wait for its response headers."""
        lane = await self._lanes.acquire()
        client = lane.conn
        try:
            request = client.build_request(
                method.decode(),
                path.decode(),
                content=body,
                headers=list(headers),
                timeout=httpx.Timeout(
                    connect=self._connect_timeout, read=None, write=30.0, pool=30.0
                ),
            )
            response = await client.send(request, stream=True)
        except BaseException as exc:
            if isinstance(exc, Exception):
                exc._trio_swe_lane = lane  # type: ignore[attr-defined]  # for reset()
            await self._release(lane)
            raise
        return HttpxExchange(self, lane, response)

    async def _release(self, lane: Lane[httpx.AsyncClient]) -> None:
        if self._lanes.release(lane):
            await self._close_lane(lane)

    @property
    def active_streams(self) -> int:
        return self._lanes.active_streams

    async def reset(self, client: Any) -> None:
        """Retire the connection behind ``client`` (an ``httpx.AsyncClient``, an exchange, or
        an exception raised by :meth:`open`) after a protocol error; idempotent."""
        if isinstance(client, HttpxExchange):
            lane: Any = client._lane
        elif isinstance(client, BaseException):
            lane = getattr(client, "_trio_swe_lane", None)
        else:
            lane = next((x for x in self._lanes.lanes if x.conn is client), None)
        if isinstance(lane, Lane) and lane in self._lanes.lanes:
            self._lanes.resets += 1
            if self._lanes.retire(lane):
                await self._close_lane(lane)

    async def _close_lane(self, lane: Lane[httpx.AsyncClient]) -> None:
        self._lanes.forget(lane)
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + 5.0
            try:
                await lane.conn.aclose()
            except Exception:
                pass  # a broken connection may fail to close cleanly; it is gone either way

    async def aclose(self) -> None:
        """Close every connection (streams still open on them fail)."""
        for lane in self._lanes.close_all():
            await self._close_lane(lane)

    def statistics(self) -> PoolStatistics:
        return self._lanes.statistics()


# --- one request with retries, for every client of a pool ------------------------------------


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
