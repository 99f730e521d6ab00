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

from trio_swe.sandbox.e2b import _connect, _wire
from trio_swe.sandbox.e2b._envd import EventStream, _await_headers
from trio_swe.sandbox.e2b._h2conn import (
    H2Connection,
    H2ConnectionTerminated,
    H2StreamReset,
)
from trio_swe.sandbox.e2b._h2io import RawSocketStream
from trio_swe.sandbox.e2b._h2io import readable as _readable
from trio_swe.sandbox.e2b._retry import STREAM_ID_ATTR, StreamSilent, classify


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

    async def respond_data(self, sid: int, body: bytes) -> None:
        self.h2.send_data(sid, body)
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


# --- silence is measured per connection (the 1,000-sandbox congestion collapse) ------------
#
# A stream's idle watchdog firing proves nothing alone: a starved event loop reads its sockets
# late and every stream looks silent at once. Before a stream is declared dead the connection
# syncs with the peer (a PING, answered after every frame sent before it); only a stream still
# silent then is lost (StreamSilent: the connection stays in use), and a silent connection is
# the connection's own liveness check's to fail, once for all its streams.

IDLE = 3.5


def _event(**kw: object) -> bytes:
    return _connect.encode_envelope(
        _wire.encode(_wire.StartResponse(event=_wire.ProcessEvent(**kw)))  # type: ignore[arg-type]
    )


_KEEPALIVE = _event(keepalive=_wire.KeepAlive())


async def _started(conn: H2Connection, peer: Peer, n: int = 1) -> list[EventStream]:
    """``n`` streams with their headers and a first event read."""
    streams = []
    for _ in range(n):
        s = await conn.request(b"POST", b"/process.Process/Start", [], b"x")
        await peer.until(h2.events.StreamEnded, s.stream_id)
        await peer.respond(s.stream_id, _event(start=_wire.StartEvent(pid=1)), end=False)
        await s.receive_headers()
        events = EventStream(s, IDLE)
        assert (await events.next_event()).start is not None  # type: ignore[union-attr]
        streams.append(events)
    return streams


async def _ping_from(peer: Peer) -> bytes:
    """Read until the client's next PING; return its data (h2 queued the ACK, unsent)."""
    while True:
        data = await peer.stream.receive_some(65536)
        assert data, "the client closed the connection"
        for ev in peer.h2.receive_data(data):
            if isinstance(ev, h2.events.PingReceived):
                return ev.ping_data


async def test_a_stream_whose_frames_come_before_the_sync_answer_is_not_idle(
    clock: trio.testing.MockClock,
) -> None:
    # The reader was behind: the stream's keepalive was on its way when the watchdog fired.
    async with pair(ping_interval=100.0) as (conn, peer):
        (events,) = await _started(conn, peer)
        result: list[object] = []

        async def read() -> None:
            result.append(await events.next_event())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            t0 = trio.current_time()
            assert (await _ping_from(peer)).startswith(b"sync")
            assert trio.current_time() - t0 >= IDLE
            ack = peer.h2.data_to_send()  # the ACK h2 queued: send the stream's frame first
            peer.h2.send_data(1, _KEEPALIVE)
            await peer.stream.send_all(peer.h2.data_to_send() + ack)
        assert isinstance(result[0], _wire.ProcessEvent)
        assert result[0].keepalive is not None
        assert conn.usable
        # And the stream goes on: a later event is read as usual.
        await peer.respond_data(1, _event(end=_wire.EndEvent(exited=True)))
        assert (await events.next_event()).end is not None  # type: ignore[union-attr]


async def test_a_stream_silent_on_a_live_connection_is_lost_alone(
    clock: trio.testing.MockClock,
) -> None:
    # The connection keeps hearing another stream's keepalives and answers the sync PING: the
    # silence is the stream's own. It fails as stream_silent, the connection stays in use.
    async with pair(ping_interval=100.0) as (conn, peer):
        silent, busy = await _started(conn, peer, 2)
        done = trio.Event()

        async def chatter() -> None:
            while not done.is_set():
                await peer.respond_data(3, _KEEPALIVE)
                await busy.next_event()
                with trio.move_on_after(1.0):
                    await peer.until(h2.events.PingReceived)  # h2 acks it

        async with trio.open_nursery() as nursery:
            nursery.start_soon(chatter)
            t0 = trio.current_time()
            with pytest.raises(StreamSilent) as info:
                await silent.next_event()
            done.set()
        assert trio.current_time() - t0 >= IDLE
        failure = classify(info.value)
        assert (failure.kind, failure.transient, failure.reset_pool) == (
            "stream_silent",
            True,
            False,
        )
        assert conn.usable


async def test_a_silent_connection_fails_all_its_streams_once(
    clock: trio.testing.MockClock,
) -> None:
    # Nothing at all comes back: the streams' watchdogs share one sync PING (no storm of them),
    # and the connection is failed after ping_timeout without an answer; every stream gets that
    # one connection failure (the pool retires one connection, not one per stream).
    async with pair(ping_interval=100.0, ping_timeout=5.0) as (conn, peer):
        streams = await _started(conn, peer, 4)
        errors: list[BaseException] = []

        async def read(events: EventStream) -> None:
            try:
                await events.next_event()
            except Exception as exc:
                errors.append(exc)

        t0 = trio.current_time()
        pings = 0
        async with trio.open_nursery() as nursery:

            async def count_pings() -> None:
                nonlocal pings
                while True:
                    data = await peer.stream.receive_some(65536)
                    if not data:
                        return
                    for ev in peer.h2.receive_data(data):
                        pings += isinstance(ev, h2.events.PingReceived)
                    peer.h2.clear_outbound_data_buffer()  # never answer

            nursery.start_soon(count_pings)
            with trio.fail_after(60):
                async with trio.open_nursery() as readers:
                    for events in streams:
                        readers.start_soon(read, events)
            nursery.cancel_scope.cancel()
        assert trio.current_time() - t0 >= IDLE + 5.0
        assert pings == 1
        assert all(isinstance(e, httpx.ReadError) and "PING" in str(e) for e in errors)
        assert len({id(e) for e in errors}) == 1
        assert classify(errors[0]).reset_pool
        assert not conn.usable


async def test_headers_late_behind_the_reader_are_waited_for(
    clock: trio.testing.MockClock,
) -> None:
    # The response headers' watchdog syncs with the peer as well before giving up.
    async with pair(ping_interval=100.0) as (conn, peer):
        s = await conn.request(b"POST", b"/process.Process/Start", [], b"x")
        await peer.until(h2.events.StreamEnded, s.stream_id)
        status: list[int] = []

        async def wait() -> None:
            status.append(await _await_headers(s, trio.current_time() + IDLE))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            assert (await _ping_from(peer)).startswith(b"sync")
            ack = peer.h2.data_to_send()
            peer.h2.send_headers(s.stream_id, [(b":status", b"200")])
            await peer.stream.send_all(peer.h2.data_to_send() + ack)
        assert status == [200]
        # Without the headers before the answer: 0 (the caller raises "no response headers").
        s2 = await conn.request(b"POST", b"/process.Process/Start", [], b"x")
        await peer.until(h2.events.StreamEnded, s2.stream_id)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.until, h2.events.PingReceived)  # h2 answers it
            assert await _await_headers(s2, trio.current_time() + IDLE) == 0


async def test_readable_sees_bytes_waiting_on_the_socket() -> None:
    a, b = trio.socket.socketpair()
    with a, b:
        stream = trio.SocketStream(a)
        assert not _readable(stream)
        await b.send(b"x")  # on a socketpair, readable once sent
        assert _readable(stream)
    assert not _readable(trio.testing.memory_stream_pair()[0])


# --- waits with deadlines (no cancel scope per wait), writes that never block callers -------


async def test_a_wait_ends_at_its_deadline_and_an_old_deadline_ends_no_later_wait(
    clock: trio.testing.MockClock,
) -> None:
    async with pair() as (conn, peer):
        s = await conn.request(b"GET", b"/a", [], None)
        await peer.until(h2.events.RequestReceived, s.stream_id)
        t0 = trio.current_time()
        assert not await s.receive_headers(t0 + 2.0)
        assert 2.0 <= trio.current_time() - t0 <= 2.2
        # The first wait's deadline entry is stale now; a wait without deadline outlives it.
        await peer.respond(s.stream_id, b"x", end=False)
        assert await s.receive_headers(trio.current_time() + 5.0)
        t1 = trio.current_time()
        got: list[bytes | None] = []

        async def late_data() -> None:
            await trio.sleep(5.0)
            await peer.respond_data(s.stream_id, b"y")

        async with trio.open_nursery() as nursery:
            assert await s.receive_by(t1 + 1.0) == b"x"
            s2 = await conn.request(b"GET", b"/b", [], None)  # another entry, 1 s from now
            del s2
            nursery.start_soon(late_data)
            got.append(await s.receive_by(trio.current_time() + 10.0))
        assert got == [b"y"]
        assert trio.current_time() - t1 >= 5.0


async def test_a_shielded_headers_wait_outlasts_cancellation(
    clock: trio.testing.MockClock,
) -> None:
    async with pair() as (conn, peer):
        s = await conn.request(b"POST", b"/process.Process/Start", [], b"x")
        await peer.until(h2.events.StreamEnded, s.stream_id)
        statuses: list[int] = []

        async def caller(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                statuses.append(await _await_headers(s, trio.current_time() + 30.0, shield=True))
                await trio.lowlevel.checkpoint()  # the cancellation lands here
                statuses.append(-1)

        async with trio.open_nursery() as nursery:
            scope = await nursery.start(caller)
            await trio.sleep(1.0)
            scope.cancel()  # the caller is cancelled while it waits: the wait goes on
            await trio.sleep(1.0)
            assert statuses == []
            await peer.respond(s.stream_id, b"", end=False)
        assert statuses == [200]


async def test_raw_socket_writes_keep_their_order_when_the_socket_is_full() -> None:
    a, b = trio.socket.socketpair()
    a.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 4096)
    b.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    tcp = trio.SocketStream(a)
    raw = RawSocketStream(tcp)
    reader = trio.SocketStream(b)
    chunks = [bytes([i]) * 1_000_000 for i in range(5)]
    assert not raw.try_send(chunks[0])  # far more than the socket takes at once
    for chunk in chunks[1:]:
        assert not raw.try_send(chunk)  # queued behind the rest, in order
    received = bytearray()

    async def read() -> None:
        while len(received) < 5_000_000:
            received.extend(await reader.receive_some(65536))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await raw.send_rest()
    assert bytes(received) == b"".join(chunks)
    assert raw.try_send(b"z")  # empty again: written at once
    assert await reader.receive_some(10) == b"z"
    await raw.aclose()
    await reader.aclose()


async def test_a_request_needs_no_wait_on_a_connected_connection() -> None:
    async with pair() as (conn, peer):
        assert not conn.connected
        s1 = await conn.request(b"GET", b"/a", [], None)  # connects
        assert conn.connected
        assert conn.fits(b"x" * 65535)
        assert not conn.fits(b"x" * 65536)
        s3, rest = conn.request_nowait(b"POST", b"/b", [], b"y" * 70_000)
        assert len(rest) == 70_000 - 65535  # the rest waits for the peer's credit
        await peer.until(h2.events.RequestReceived, s3.stream_id)
        s1.close()
        s3.close()


async def test_credit_for_data_read_is_sent_without_waiting_for_the_next_read() -> None:
    # A peer that fills the stream's window in one write and then waits for credit: the credit
    # for what the stream's reader took must go out then, not with the connection's next read.
    async with pair() as (conn, peer):
        s = await conn.request(b"GET", b"/files", [], None)
        await peer.until(h2.events.RequestReceived, s.stream_id)
        await peer.respond(s.stream_id, b"x" * 65000, end=False)  # one read of the client's
        await s.receive_headers()
        got = 0
        while got < 65000:
            got += len(await s.receive())
        with trio.fail_after(10):  # a hang guard: without the credit this never returns
            while peer.h2.local_flow_control_window(s.stream_id) < 32768:
                await peer.until(h2.events.WindowUpdated)
        await peer.respond_data(s.stream_id, b"y" * 16384)  # within the credit
        s.close()


async def test_tls_stream_reads_a_close_notify_while_the_transport_stays_open() -> None:
    # TLSStream (ours, over memory BIOs) against trio's SSLStream as the server: what the
    # server writes arrives whole, and its close_notify is EOF although the transport stays
    # open. OpenSSL reads records out of the BIO ahead of what it returns, so the close_notify
    # may sit in the SSL object with both BIO and pending() empty: a read must still be tried
    # before waiting on the socket (skipping it hung here).
    import os
    import ssl

    import trustme

    from trio_swe.sandbox.e2b._h2io import TLSStream

    ca = trustme.CA()
    cert = ca.issue_cert("envd.test")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    client_raw, server_raw = trio.testing.memory_stream_pair()
    server = trio.SSLStream(server_raw, server_ctx, server_side=True)
    client = TLSStream(client_raw, client_ctx, "envd.test")
    with trio.fail_after(30):  # a hang guard only
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.do_handshake)
            await client.do_handshake()
        payload = os.urandom(50_000)
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                for i in range(0, len(payload), 7_000):
                    await server.send_all(payload[i : i + 7_000])
                await server.unwrap()  # close_notify; the memory stream stays open

            nursery.start_soon(serve)
            got = bytearray()
            while chunk := await client.receive_some():
                got += chunk
            assert bytes(got) == payload
            nursery.cancel_scope.cancel()  # its unwrap waits for our close_notify: none comes
