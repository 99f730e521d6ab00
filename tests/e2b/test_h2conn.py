"""The purpose-built HTTP/2 client against a scripted h2 server over an in-memory stream.

Each test plays the server's side frame by frame (h2's server state machine), so what the client
must do (reset a stream it abandons, hand back the window of data it never read, finish streams
below a graceful GOAWAY's last-stream-id, ping a silent connection) is checked deterministically,
with trio's MockClock where time matters.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest
import trio
import trio.testing

from trio_swe.sandbox.e2b._h2conn import H2Connection, H2ConnectionTerminated, H2StreamReset
from trio_swe.sandbox.e2b._retry import STREAM_ID_ATTR, classify


class Peer:
    """The server end: h2's server state machine over one side of a memory stream pair."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.events: list[h2.events.Event] = []
        self.requests: dict[int, dict[bytes, bytes]] = {}

    async def flush(self) -> None:
        if data := self.h2.data_to_send():
            await self.stream.send_all(data)

    async def start(self) -> None:
        self.h2.initiate_connection()
        await self.flush()

    async def until(self, kind: type[h2.events.Event], stream_id: int | None = None) -> object:
        """Read frames until an event of ``kind`` (on ``stream_id``) arrives."""
        while True:
            for i, ev in enumerate(self.events):
                if isinstance(ev, kind) and (
                    stream_id is None or getattr(ev, "stream_id", None) == stream_id
                ):
                    return self.events.pop(i)
            data = await self.stream.receive_some(65536)
            assert data, "the client closed the connection"
            for ev in self.h2.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    self.requests[ev.stream_id] = dict(ev.headers)  # type: ignore[arg-type]
                self.events.append(ev)
            await self.flush()

    async def respond(self, sid: int, body: bytes = b"", *, end: bool = True) -> None:
        self.h2.send_headers(sid, [(b":status", b"200"), (b"content-type", b"x/y")])
        size = self.h2.max_outbound_frame_size
        chunks = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
        for i, chunk in enumerate(chunks):
            if chunk or end:
                self.h2.send_data(sid, chunk, end_stream=end and i == len(chunks) - 1)
        await self.flush()


@asynccontextmanager
async def pair(**kw: object) -> AsyncIterator[tuple[H2Connection, Peer]]:
    client_end, server_end = trio.testing.memory_stream_pair()
    peer = Peer(server_end)

    async def connect() -> trio.abc.Stream:
        return client_end

    conn = H2Connection(
        "envd.test",
        443,
        tls=None,
        authority="envd.test",
        base_headers=[(b"user-agent", b"t")],
        connect=connect,
        **kw,  # type: ignore[arg-type]
    )
    await peer.start()
    try:
        yield conn, peer
    finally:
        await conn.aclose()


async def test_request_and_response_with_stateless_hpack() -> None:
    async with pair() as (conn, peer):
        for n in range(3):  # the same headers again: cached encodings, still decodable
            s = await conn.request(b"POST", b"/p.P/Start", [(b"x-sandbox", b"s1")], b"body")
            await peer.until(h2.events.StreamEnded, s.stream_id)
            assert peer.requests[s.stream_id][b":path"] == b"/p.P/Start"
            assert peer.requests[s.stream_id][b"x-sandbox"] == b"s1"
            assert peer.requests[s.stream_id][b"user-agent"] == b"t"
            await peer.respond(s.stream_id, b"answer %d" % n)
            await s.receive_headers()
            assert (s.status, s.header("content-type")) == (200, "x/y")
            assert await s.read_all() == b"answer %d" % n
            s.close()


async def test_a_stream_closed_early_is_reset_and_its_unread_data_credited() -> None:
    # A connection window of 65,535 only: unread data not handed back would stall it.
    async with pair(connection_window=65535) as (conn, peer):
        s1 = await conn.request(b"GET", b"/files", [], None)
        await peer.until(h2.events.RequestReceived, s1.stream_id)
        await peer.respond(s1.stream_id, b"x" * 60000, end=False)
        await s1.receive_headers()
        await s1.aclose()  # read nothing of the body
        reset = await peer.until(h2.events.StreamReset, s1.stream_id)
        assert reset.error_code == h2.errors.ErrorCodes.CANCEL  # type: ignore[attr-defined]
        s3 = await conn.request(b"GET", b"/files", [], None)
        await peer.until(h2.events.RequestReceived, s3.stream_id)
        with trio.fail_after(5):
            while peer.h2.local_flow_control_window(s3.stream_id) < 60000:
                await peer.until(h2.events.WindowUpdated)
        await peer.respond(s3.stream_id, b"y" * 60000)
        await s3.receive_headers()
        assert await s3.read_all() == b"y" * 60000


async def test_graceful_goaway_finishes_streams_below_last_stream_id() -> None:
    async with pair() as (conn, peer):
        s1 = await conn.request(b"GET", b"/a", [], None)
        s3 = await conn.request(b"GET", b"/b", [], None)
        await peer.until(h2.events.RequestReceived, s3.stream_id)
        peer.h2.close_connection(last_stream_id=s1.stream_id)
        await peer.flush()
        # h2 itself would send nothing more after a GOAWAY; a real server finishes stream 1.
        peer.h2.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN
        await peer.respond(s1.stream_id, b"done")
        await s1.receive_headers()
        assert await s1.read_all() == b"done"
        with pytest.raises(H2ConnectionTerminated) as info:
            await s3.receive_headers()
        exc = info.value
        setattr(exc, STREAM_ID_ATTR, s3.stream_id)
        failure = classify(exc)
        assert (failure.kind, failure.transient, failure.reached) == ("goaway", True, False)
        assert not conn.usable
        with pytest.raises(httpx.ConnectError):  # provably not sent: retry-safe
            await conn.request(b"GET", b"/c", [], None)


async def test_a_reset_stream_raises_with_its_code() -> None:
    async with pair() as (conn, peer):
        s = await conn.request(b"GET", b"/a", [], None)
        await peer.until(h2.events.RequestReceived, s.stream_id)
        peer.h2.reset_stream(s.stream_id, error_code=h2.errors.ErrorCodes.REFUSED_STREAM)
        await peer.flush()
        with pytest.raises(H2StreamReset) as info:
            await s.receive_headers()
        assert classify(info.value).kind == "refused_stream"
        assert conn.usable  # a stream's reset leaves the connection in use


async def test_the_peer_closing_fails_open_streams_as_connection_closed() -> None:
    async with pair() as (conn, peer):
        s = await conn.request(b"GET", b"/a", [], None)
        await peer.until(h2.events.RequestReceived, s.stream_id)
        await peer.stream.aclose()
        with pytest.raises(httpx.RemoteProtocolError) as info:
            await s.receive_headers()
        assert classify(info.value).kind == "connection_closed"


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_a_silent_connection_is_pinged_then_failed(clock: trio.testing.MockClock) -> None:
    async with pair(ping_interval=10.0) as (conn, peer):
        s = await conn.request(b"GET", b"/a", [], None)
        await peer.until(h2.events.RequestReceived, s.stream_id)
        t0 = trio.current_time()
        await peer.until(h2.events.PingReceived)  # h2 acks it: the connection lives on
        assert 9.0 <= trio.current_time() - t0 <= 11.0
        # Then the peer goes silent for good: the next PING gets no answer.
        with pytest.raises(httpx.ReadError, match="PING"):
            await s.receive_headers()
        assert trio.current_time() - t0 >= 29.0
        assert not conn.usable


async def test_empty_data_frames_do_not_end_the_body() -> None:
    # E2B's edge pads downloads with empty DATA frames; the body ends only with END_STREAM.
    async with pair() as (conn, peer):
        s = await conn.request(b"GET", b"/files", [], None)
        await peer.until(h2.events.RequestReceived, s.stream_id)
        await peer.respond(s.stream_id, b"a", end=False)
        for part in (b"", b"b", b"", b""):
            peer.h2.send_data(s.stream_id, part)
        peer.h2.end_stream(s.stream_id)
        await peer.flush()
        await s.receive_headers()
        assert await s.read_all() == b"ab"
