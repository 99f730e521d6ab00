"""Connections to one origin over the purpose-built HTTP/2 client, sharded with a stream cap.

The same rules as :class:`~._pool.ConnectionPool` (httpx): at most ``streams_per_connection``
streams per connection (E2B's edge allows 100), another connection opened once the least loaded
one is half full, up to ``max_connections``; beyond that callers wait for a free slot. A
connection that failed, got a GOAWAY or was retired takes no new streams and is closed once its
last stream ended.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Sequence
from typing import Any

import trio

from ._h2conn import H2Connection, H2Stream, split_origin
from ._pool import PoolStatistics


class _Lane:
    __slots__ = ("active", "conn", "retired")

    def __init__(self, conn: H2Connection) -> None:
        self.conn = conn
        self.active = 0
        self.retired = False


class H2Exchange:
    """A request on an :class:`H2Pool`: the stream, and the slot it holds until closed."""

    __slots__ = ("_closed", "_lane", "_pool", "stream", "stream_id")

    def __init__(self, pool: H2Pool, lane: _Lane, stream: H2Stream) -> None:
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

    async def receive_by(self, deadline: float) -> bytes | None:
        return await self.stream.receive_by(deadline)

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
        if streams_per_connection < 1 or max_connections < 1:
            raise ValueError("streams_per_connection and max_connections must be >= 1")
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
        self._per_conn = streams_per_connection
        self._max_conns = max_connections
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._lanes: list[_Lane] = []
        self._retired: list[_Lane] = []
        self._in_use = 0
        self._waiters = trio.lowlevel.ParkingLot()
        self._closed = False
        # counters
        self.connections_opened = 0
        self.resets = 0
        self.streams_total = 0
        self.peak_streams = 0
        self.slot_waits = 0

    def _new_lane(self) -> _Lane:
        self.connections_opened += 1
        conn = H2Connection(
            self._host,
            self._port,
            tls=self._tls,
            authority=self._authority,
            base_headers=self._base,
            connect_timeout=self._connect_timeout,
            ping_interval=self._ping_interval,
            ping_timeout=self._ping_timeout,
        )
        lane = _Lane(conn)
        self._lanes.append(lane)
        return lane

    def _pick(self) -> _Lane:
        best: _Lane | None = None
        for lane in list(self._lanes):
            if not lane.conn.usable:
                self._retire(lane)
                continue
            if best is None or lane.active < best.active:
                best = lane
        # Spread: another connection once the least loaded one is half full (never a stream on
        # a full one; the slot count guarantees a lane can be opened then).
        if best is None or (
            best.active >= self._per_conn // 2 and len(self._lanes) < self._max_conns
        ):
            best = self._new_lane()
        return best

    def open_nowait(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> H2Exchange | None:
        """:meth:`open` when it needs no wait (a free slot on a connected connection, the body
        within the windows); None otherwise (then await :meth:`open`)."""
        if self._closed or self._in_use >= self._per_conn * self._max_conns:
            return None
        lane = self._pick()
        conn = lane.conn
        if not conn.connected or not conn.fits(body):
            return None
        self._in_use += 1
        lane.active += 1
        self.streams_total += 1
        active = self.active_streams
        if active > self.peak_streams:
            self.peak_streams = active
        try:
            stream, _ = conn.request_nowait(method, path, headers, body)
        except BaseException as exc:
            if isinstance(exc, Exception):
                exc._trio_swe_lane = lane  # type: ignore[attr-defined]  # for reset()
            if self._release_nowait(lane):
                trio.lowlevel.spawn_system_task(self._close_lane, lane)
            raise
        return H2Exchange(self, lane, stream)

    async def open(
        self, method: bytes, path: bytes, headers: Sequence[tuple[bytes, bytes]], body: bytes | None
    ) -> H2Exchange:
        """Take a stream slot and send one request (wait for the answer on the exchange)."""
        if self._closed:
            raise RuntimeError("connection pool is closed")
        if self._in_use >= self._per_conn * self._max_conns:
            self.slot_waits += 1
            while self._in_use >= self._per_conn * self._max_conns:
                await self._waiters.park()
        self._in_use += 1
        lane = self._pick()
        lane.active += 1
        self.streams_total += 1
        active = self.active_streams
        if active > self.peak_streams:
            self.peak_streams = active
        try:
            stream = await lane.conn.request(method, path, headers, body)
        except BaseException as exc:
            if isinstance(exc, Exception):
                exc._trio_swe_lane = lane  # type: ignore[attr-defined]  # for reset()
            await self._release(lane)
            raise
        return H2Exchange(self, lane, stream)

    async def _release(self, lane: _Lane) -> None:
        if self._release_nowait(lane):
            await self._close_lane(lane)

    def _release_nowait(self, lane: _Lane) -> bool:
        """Give the slot back; True when the lane is to be closed now (its last stream)."""
        lane.active -= 1
        self._in_use -= 1
        if self._waiters:
            self._waiters.unpark()
        if lane.retired or not lane.conn.usable:
            return lane.active == 0
        lane.conn._flush()
        return False

    @property
    def active_streams(self) -> int:
        return sum(lane.active for lane in self._lanes) + sum(lane.active for lane in self._retired)

    def _retire(self, lane: _Lane) -> None:
        if lane in self._lanes:
            self._lanes.remove(lane)
            lane.retired = True
            self._retired.append(lane)
            if lane.active == 0:
                # No stream left to finish: close it from a system task (we may be sync here).
                trio.lowlevel.spawn_system_task(self._close_lane, lane)

    async def reset(self, exchange: Any) -> None:
        """Retire the connection behind ``exchange`` (after a protocol error); idempotent."""
        lane = getattr(
            exchange, "_trio_swe_lane" if isinstance(exchange, BaseException) else "_lane", None
        )
        if isinstance(lane, _Lane) and lane in self._lanes:
            self.resets += 1
            self._retire(lane)

    async def _close_lane(self, lane: _Lane) -> None:
        if lane in self._retired:
            self._retired.remove(lane)
        elif lane in self._lanes:
            self._lanes.remove(lane)
        else:
            return
        with trio.CancelScope(shield=True):
            try:
                await lane.conn.aclose()
            except Exception:
                pass  # a broken connection may fail to close cleanly; it is gone either way

    async def aclose(self) -> None:
        """Close every connection (streams still open on them fail)."""
        self._closed = True
        lanes = self._lanes + self._retired
        for lane in lanes:
            await self._close_lane(lane)

    def statistics(self) -> PoolStatistics:
        return PoolStatistics(
            origin=self.origin,
            connections=len(self._lanes),
            connections_opened=self.connections_opened,
            retired_draining=len(self._retired),
            resets=self.resets,
            active_streams=self.active_streams,
            peak_streams=self.peak_streams,
            streams_total=self.streams_total,
            slot_waits=self.slot_waits,
            streams_per_connection=self._per_conn,
            client="h2",
        )
