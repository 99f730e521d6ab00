"""httpx connections to one origin, sharded with a stream cap: the REST API, and envd on HTTP/1.1.

envd on ``https://`` and h2c goes over the purpose-built client (:mod:`._h2pool`). httpx carries
the rest: E2B's REST API (HTTP/2 by ALPN on ``https://``, h2c when asked, else HTTP/1.1) and envd
on a plain ``http://`` origin without h2c (HTTP/1.1, e.g. debug mode). Each pooled
``httpx.AsyncClient`` is one lane of :class:`~._lanes.Lanes`: on HTTP/2 one live connection, on
HTTP/1.1 as many connections as its lane carries streams.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpcore
import httpx
import trio

from ._lanes import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_STREAMS_PER_CONNECTION,
    Lane,
    Lanes,
    PoolStatistics,
    close_quietly,
)

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
        await close_quietly(lane.conn, 5.0)

    async def aclose(self) -> None:
        """Close every connection (streams still open on them fail)."""
        for lane in self._lanes.close_all():
            await self._close_lane(lane)

    def statistics(self) -> PoolStatistics:
        return self._lanes.statistics()
