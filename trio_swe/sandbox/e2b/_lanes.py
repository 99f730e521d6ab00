"""Which connection of a pool takes the next stream: the sharding rules both pools share.

E2B's edge allows 100 concurrent streams per HTTP/2 connection and every sandbox shares one
origin (``https://sandbox.e2b.app``). So a pool keeps several connections, each carrying at most
``streams_per_connection`` streams (default 64, well below the edge's 100), and opens another
when the least loaded is half full, up to ``max_connections``; beyond that callers wait for a
free slot. A connection that broke the protocol is *retired*: new streams go to a fresh one, and
the old one is closed when its last stream ends. Used by :class:`~._h2pool.H2Pool` (envd over
HTTP/2) and :class:`~._httpxpool.ConnectionPool` (httpx: the REST API, HTTP/1.1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

import msgspec
import trio

#: Per-connection stream cap: below the E2B edge's SETTINGS_MAX_CONCURRENT_STREAMS of 100.
DEFAULT_STREAMS_PER_CONNECTION = 64
#: Connections per origin: with the cap above, 16,384 concurrent streams. Every detached command
#: holds one long-poll stream, so 10,000 concurrent commands need at least 157 connections; at 32
#: (2,048 streams) the rest waited for a slot and their commands' ends went unseen.
DEFAULT_MAX_CONNECTIONS = 256


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


class _Closable(Protocol):
    async def aclose(self) -> None: ...


async def close_quietly(conn: _Closable, bound: float = math.inf) -> None:
    """Close a pool's connection, shielded (for at most ``bound`` s)."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + bound):
        try:
            await conn.aclose()
        except Exception:
            pass  # a broken connection may fail to close cleanly; it is gone either way
