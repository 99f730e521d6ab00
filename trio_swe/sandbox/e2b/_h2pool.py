"""Connections to one origin over the purpose-built HTTP/2 client, sharded with a stream cap.

envd's one HTTP/2 client (on ``https://`` and h2c origins). The sharding rules of
:class:`~._lanes.Lanes`: at most ``streams_per_connection`` streams per connection (E2B's
edge allows 100), another connection opened once the least loaded one is half full, up to
``max_connections``; beyond that callers wait for a free slot. A connection that failed, got a
GOAWAY or was retired takes no new streams and is closed once its last stream ended.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Sequence
from typing import Any

import trio

from ._h2conn import H2Connection, H2Stream, split_origin
from ._lanes import Lane, Lanes, PoolStatistics, close_quietly


class H2Exchange:
    """A request on an :class:`H2Pool`: the stream, and the slot it holds until closed."""

    __slots__ = ("_closed", "_lane", "_pool", "stream", "stream_id")

    def __init__(self, pool: H2Pool, lane: Lane[H2Connection], stream: H2Stream) -> None:
        self._pool = pool
        self._lane = lane
        self.stream = stream
        self.stream_id: int | None = stream.stream_id
        self._closed = False

    @property
    def status(self) -> int:
        return self.stream.status

    def header(self, name: str) -> str | None:
        return self.stream.header(name)

    async def receive_headers(self, deadline: float = math.inf, *, shield: bool = False) -> bool:
        return await self.stream.receive_headers(deadline, shield=shield)

    async def receive(self) -> bytes:
        return await self.stream.receive()

    async def receive_by(self, deadline: float, *, shield: bool = False) -> bytes | None:
        return await self.stream.receive_by(deadline, shield=shield)

    def receive_nowait(self) -> bytes | None:
        return self.stream.receive_nowait()

    #: :meth:`silent_since` proves a silence (the connection read all the peer sent).
    confirms_silence = True

    @property
    def news(self) -> int:
        return self.stream.news

    async def silent_since(self, news: int, sent_after: float) -> bool:
        return await self.stream.silent_since(news, sent_after)

    async def read_all(self) -> bytes:
        return await self.stream.read_all()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stream.close()
        await self._pool._release(self._lane)


class H2Pool:
    """HTTP/2 connections to ``origin`` (``https://`` with ALPN h2, or ``http://`` as h2c).

    Args:
        origin: ``scheme://host:port``.
        verify: TLS verification (``True`` or an ``ssl.SSLContext``).
        streams_per_connection: cap of concurrent streams on one connection.
        max_connections: cap of connections.
        headers: sent with every request (``user-agent``...).
        connect_timeout: seconds to open a connection.
        ping_interval: a connection silent this long gets a PING.
        ping_timeout: a connection that hears nothing for this long after a PING is failed
            (default: ``ping_interval``).
    """

    def __init__(
        self,
        origin: str,
        *,
        verify: ssl.SSLContext | bool = True,
        streams_per_connection: int = 64,
        max_connections: int = 32,
        headers: dict[str, str] | None = None,
        connect_timeout: float = 10.0,
        ping_interval: float = 30.0,
        ping_timeout: float | None = None,
    ) -> None:
        self.origin = origin.rstrip("/")
        scheme, self._host, self._port = split_origin(self.origin)
        self._tls: ssl.SSLContext | None = None
        if scheme == "https":
            ctx = verify if isinstance(verify, ssl.SSLContext) else ssl.create_default_context()
            if verify is False:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["h2"])
            self._tls = ctx
        default_port = 443 if scheme == "https" else 80
        self._authority = self._host if self._port == default_port else f"{self._host}:{self._port}"
        self._base = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._lanes: Lanes[H2Connection] = Lanes(
            self.origin,
            streams_per_connection,
            max_connections,
            self._new_conn,
            usable=_usable,
            close_soon=self._close_soon,
            client="h2",
        )

    @property
    def resets(self) -> int:
        return self._lanes.resets

    @property
    def connections_opened(self) -> int:
        return self._lanes.connections_opened

    def _new_conn(self) -> H2Connection:
        return H2Connection(
            self._host,
            self._port,
            tls=self._tls,
            authority=self._authority,
            base_headers=self._base,
            connect_timeout=self._connect_timeout,
            ping_interval=self._ping_interval,
            ping_timeout=self._ping_timeout,
        )

    def _close_soon(self, lane: Lane[H2Connection]) -> None:
        # No stream left to finish: close it from a system task (we may be sync here).
        trio.lowlevel.spawn_system_task(self._close_lane, lane)

    def open_nowait(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> H2Exchange | None:
        """:meth:`open` when it needs no wait (a free slot on a connected connection, the body
        within the windows); None otherwise (then await :meth:`open`)."""
        lanes = self._lanes
        if lanes.closed or lanes.full:
            return None
        lane = lanes.pick()
        conn = lane.conn
        if not conn.connected or not conn.fits(body):
            return None
        lanes.take(lane)
        try:
            stream, _ = conn.request_nowait(method, path, headers, body)
        except BaseException as exc:
            if isinstance(exc, Exception):
                exc._trio_swe_lane = lane  # type: ignore[attr-defined]  # for reset()
            if lanes.release(lane):
                self._close_soon(lane)
            raise
        return H2Exchange(self, lane, stream)

    async def open(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> H2Exchange:
        """Take a stream slot and send one request (wait for the answer on the exchange)."""
        lane = await self._lanes.acquire()
        try:
            stream = await lane.conn.request(method, path, headers, body)
        except BaseException as exc:
            if isinstance(exc, Exception):
                exc._trio_swe_lane = lane  # type: ignore[attr-defined]  # for reset()
            await self._release(lane)
            raise
        return H2Exchange(self, lane, stream)

    async def _release(self, lane: Lane[H2Connection]) -> None:
        if self._lanes.release(lane):
            await self._close_lane(lane)
        else:
            lane.conn._flush()  # the stream's RST_STREAM or window credit, if any

    @property
    def active_streams(self) -> int:
        return self._lanes.active_streams

    async def reset(self, exchange: Any) -> None:
        """Retire the connection behind ``exchange`` (after a protocol error); idempotent."""
        lane = getattr(
            exchange, "_trio_swe_lane" if isinstance(exchange, BaseException) else "_lane", None
        )
        if isinstance(lane, Lane) and lane in self._lanes.lanes:
            self._lanes.resets += 1
            if self._lanes.retire(lane):
                self._close_soon(lane)

    async def _close_lane(self, lane: Lane[H2Connection]) -> None:
        if self._lanes.forget(lane):
            await close_quietly(lane.conn)

    async def aclose(self) -> None:
        """Close every connection (streams still open on them fail)."""
        for lane in self._lanes.close_all():
            await close_quietly(lane.conn)

    def statistics(self) -> PoolStatistics:
        return self._lanes.statistics()


def _usable(conn: H2Connection) -> bool:
    return conn.usable
