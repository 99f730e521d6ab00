"""A loopback HTTP/2 fault proxy in front of hypercorn (trio + hpack, frame level).

hypercorn serves the behaviour but cannot emit a chosen ``RST_STREAM`` code, a ``GOAWAY`` with a
chosen last-stream-id, an abrupt TCP close, or a silent stream from inside an ASGI app. This
proxy terminates the client's connection (TLS or h2c), opens one h2c connection to hypercorn per
client connection and forwards frames both ways, so it can inject those faults on any stream.

Server-to-client frames are forwarded unchanged (batched per read). Client-to-server header
blocks are decoded and re-encoded with the proxy's own HPACK contexts, which lets the proxy drop
a request entirely (a refused stream provably never reached the server) and tag each request
with the id of the app-level fault it decided for it. DATA frames dropped on purpose are credited
back to the sender with connection-level ``WINDOW_UPDATE`` so flow control never stalls.

Connections that do not start with the HTTP/2 preface (HTTP/1.1) are relayed as raw bytes; the
app decides their faults itself.
"""

from __future__ import annotations

import logging
import struct
from collections import Counter
from typing import Any, Final

import hpack
import msgspec
import trio

from ._app import FAULT_HEADER, FaultHandoff
from ._faults import APP_KINDS, CANCEL, NO_ERROR, Fault, FaultPlan

_log = logging.getLogger("trio_swe.testing")

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x6, 0x7, 0x8, 0x9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
_SETTINGS_MAX_FRAME_SIZE: Final = 0x5
_HDR: Final = struct.Struct(">HBBBI")  # length (24 bits as H+B), type, flags, stream id
_READ: Final = 256 * 1024
#: A graceful GOAWAY (NO_ERROR) closes the connection at the latest this long after it was sent.
_GOAWAY_DRAIN_SEC: Final = 30.0


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """Serialise one HTTP/2 frame."""
    n = len(payload)
    return _HDR.pack(n >> 8, n & 0xFF, ftype, flags, stream_id & 0x7FFFFFFF) + payload


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def goaway(last_stream_id: int, code: int) -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last_stream_id & 0x7FFFFFFF, code))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


class FaultProxyStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The HTTP/2 fault proxy's counters.

    Attributes:
        connections: client connections accepted.
        h2_connections: of them, HTTP/2 ones (the rest are relayed as raw bytes).
        streams: HTTP/2 streams relayed.
        faults: frame-level faults injected, by kind.
    """

    connections: int
    h2_connections: int
    streams: int
    faults: dict[str, int]


class _Frames:
    """Incremental frame splitter over a byte buffer."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray) -> None:
        self._buf += data

    def pop(self) -> tuple[int, int, int, bytes, bytes] | None:
        buf = self._buf
        if len(buf) < 9:
            return None
        hi, lo, ftype, flags, sid = _HDR.unpack_from(buf, 0)
        length = (hi << 8) | lo
        if len(buf) < 9 + length:
            return None
        raw = bytes(buf[: 9 + length])
        del buf[: 9 + length]
        return ftype, flags, sid & 0x7FFFFFFF, raw[9:], raw


def _header_block(flags: int, payload: bytes) -> bytes:
    """The header block fragment of a HEADERS frame (padding and priority removed)."""
    start, end = 0, len(payload)
    if flags & PADDED:
        end -= payload[0]
        start = 1
    if flags & PRIORITY_FLAG:
        start += 5
    return payload[start:end]


class _Closing(Exception):
    """The proxy closes this connection (fault or graceful GOAWAY drained)."""


class FaultProxy:
    """Accepts client connections and relays them to hypercorn, injecting frame-level faults.

    Args:
        upstream: hypercorn's plaintext ``(host, port)``.
        plan: the fault plan deciding HTTP/2 requests.
        handoff: where app-level faults decided here are parked for the app.
        ssl_context: terminate TLS with this context, or ``None`` for plaintext.
    """

    def __init__(
        self,
        *,
        upstream: tuple[str, int],
        plan: FaultPlan,
        handoff: FaultHandoff,
        ssl_context: Any | None,
    ) -> None:
        self._upstream = upstream
        self.plan = plan
        self.handoff = handoff
        self._ssl = ssl_context
        self.stats: Counter[str] = Counter()

    def statistics(self) -> FaultProxyStatistics:
        prefix = "fault_"
        return FaultProxyStatistics(
            connections=self.stats["connections"],
            h2_connections=self.stats["h2_connections"],
            streams=self.stats["streams"],
            faults={k[len(prefix) :]: v for k, v in self.stats.items() if k.startswith(prefix)},
        )

    async def serve(
        self, host: str, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host=host)
        port: int = listeners[0].socket.getsockname()[1]
        task_status.started(port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, sock: trio.SocketStream) -> None:
        self.stats["connections"] += 1
        stream: trio.abc.Stream = sock
        try:
            if self._ssl is not None:
                stream = trio.SSLStream(sock, self._ssl, server_side=True)
                await stream.do_handshake()
            head = b""
            while len(head) < len(PREFACE) and PREFACE.startswith(head):
                chunk = await stream.receive_some(len(PREFACE) - len(head))
                if not chunk:
                    return
                head += chunk
            upstream = await trio.open_tcp_stream(*self._upstream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            await trio.aclose_forcefully(stream)
            return
        try:
            if head == PREFACE:
                self.stats["h2_connections"] += 1
                await _H2Relay(self, stream, upstream).run()
            else:
                await _raw_relay(stream, upstream, head)
        except Exception:
            # One broken connection must not take the server down.
            _log.exception("fault proxy: connection failed")
        finally:
            await trio.aclose_forcefully(upstream)
            await trio.aclose_forcefully(stream)


async def _raw_relay(client: trio.abc.Stream, upstream: trio.abc.Stream, head: bytes) -> None:
    async def pump(src: trio.abc.Stream, dst: trio.abc.Stream, cancel: trio.CancelScope) -> None:
        try:
            while True:
                data = await src.receive_some(_READ)
                if not data:
                    break
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        cancel.cancel()

    try:
        await upstream.send_all(head)
    except (trio.BrokenResourceError, OSError):
        return
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, client, upstream, nursery.cancel_scope)
        nursery.start_soon(pump, upstream, client, nursery.cancel_scope)


class _H2Relay:
    """One client HTTP/2 connection and its upstream connection."""

    def __init__(self, proxy: FaultProxy, client: trio.abc.Stream, upstream: trio.abc.Stream):
        self.proxy = proxy
        self.client = client
        self.upstream = upstream
        self.c_lock = trio.Lock()
        self.u_lock = trio.Lock()
        self.decoder = hpack.Decoder()
        self.encoder = hpack.Encoder()
        self.upstream_max_frame = 16384
        self.max_forwarded = 0
        self.open: set[int] = set()  # forwarded streams the server has not finished
        self.dropped: set[int] = set()  # client streams never forwarded
        self.silenced: set[int] = set()  # reset or hung: the server's DATA is swallowed
        self.pending: dict[int, Fault] = {}  # stream faults scheduled and not yet fired
        # Set once a pending fault's response has started (its headers went to the client):
        # ``after_sec`` counts from there.
        self.answered: dict[int, trio.Event] = {}
        self.goaway_sent = False
        self.drained = trio.Event()
        self._nursery: trio.Nursery | None = None

    async def to_client(self, data: bytes) -> None:
        async with self.c_lock:
            await self.client.send_all(data)

    async def to_upstream(self, data: bytes) -> None:
        async with self.u_lock:
            await self.upstream.send_all(data)

    async def run(self) -> None:
        try:
            await self.to_upstream(PREFACE)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._c2s)
                nursery.start_soon(self._s2c)
        except* (_Closing, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass

    def _answered(self, sid: int) -> None:
        if (event := self.answered.get(sid)) is not None:
            event.set()

    def _stream_done(self, sid: int) -> None:
        self.open.discard(sid)
        self._answered(sid)  # no headers will come now: its fault stops waiting for them
        if self.goaway_sent and not self.open:
            self.drained.set()

    # --- client -> server ---------------------------------------------------------------

    async def _c2s(self) -> None:
        frames = _Frames()
        pending: tuple[int, int, bytearray] | None = (
            None  # (sid, flags, block) awaiting CONTINUATION
        )
        while True:
            data = await self.client.receive_some(_READ)
            if not data:
                raise _Closing("client closed")
            frames.feed(data)
            out = bytearray()
            while (f := frames.pop()) is not None:
                ftype, flags, sid, payload, raw = f
                if pending is not None:
                    if ftype != CONTINUATION or sid != pending[0]:
                        raise _Closing("protocol error: expected CONTINUATION")
                    pending[2].extend(payload)
                    if flags & END_HEADERS:
                        psid, pflags, pblock = pending
                        pending = None
                        out += await self._on_headers(psid, pflags, bytes(pblock), out)
                    continue
                if ftype == HEADERS:
                    block = _header_block(flags, payload)
                    if flags & END_HEADERS:
                        out += await self._on_headers(sid, flags, block, out)
                    else:
                        pending = (sid, flags, bytearray(block))
                    continue
                if sid in self.dropped:
                    if ftype == DATA and payload:
                        await self.to_client(window_update(0, len(payload)))
                    continue
                if ftype == RST_STREAM:
                    self._stream_done(sid)
                    self.pending.pop(sid, None)
                out += raw
            if out:
                await self.to_upstream(bytes(out))

    async def _on_headers(self, sid: int, flags: int, block: bytes, out: bytearray) -> bytes:
        """Decide and re-encode one complete request header block; returns frames to forward."""
        headers = [
            (bytes(k), bytes(v))
            for k, v in self.decoder.decode(block, raw=True)
            if bytes(k) != FAULT_HEADER.encode()
        ]
        if sid in self.dropped:
            return b""  # decoded (HPACK state) but never forwarded
        new = sid > self.max_forwarded
        if new:
            if self.goaway_sent:
                self.dropped.add(sid)
                await self.to_client(rst_stream(sid, 0x7))  # REFUSED_STREAM
                return b""
            pseudo = {k: v for k, v in headers if k.startswith(b":")}
            method = pseudo.get(b":method", b"GET").decode("latin-1")
            path = pseudo.get(b":path", b"/").decode("latin-1").split("?", 1)[0]
            fault = self.proxy.plan.decide(method, path)
            marker = "-"
            trigger: trio.Event | None = None
            if fault is not None and fault.kind in APP_KINDS:
                marker = self.proxy.handoff.put(fault)
            elif fault is not None and not fault.before_request:
                trigger = trio.Event()
                marker = self.proxy.handoff.put(fault, trigger)
            elif fault is not None and fault.before_request:
                self.proxy.plan.record(fault)
                self.dropped.add(sid)
                if out:  # what precedes this request reaches the server first
                    await self.to_upstream(bytes(out))
                    del out[:]
                await self._fire_now(sid, fault)
                return b""
            headers.append((FAULT_HEADER.encode(), marker.encode()))
            self.max_forwarded = sid
            self.open.add(sid)
            self.proxy.stats["streams"] += 1
            if fault is not None and trigger is not None:
                assert self._nursery is not None
                self.pending[sid] = fault
                self.answered[sid] = trio.Event()  # dropped by _fire_later
                self._nursery.start_soon(self._fire_later, sid, fault, trigger)
        encoded = self.encoder.encode(headers)
        end = flags & END_STREAM
        limit = self.upstream_max_frame
        chunks = [encoded[i : i + limit] for i in range(0, len(encoded), limit)] or [b""]
        result = bytearray()
        for i, chunk in enumerate(chunks):
            last = END_HEADERS if i == len(chunks) - 1 else 0
            if i == 0:
                result += frame(HEADERS, end | last, sid, chunk)
            else:
                result += frame(CONTINUATION, last, sid, chunk)
        return bytes(result)

    async def _fire_now(self, sid: int, fault: Fault) -> None:
        """A ``before_request`` fault: the request is not forwarded."""
        self.proxy.stats[f"fault_{fault.kind}"] += 1
        if fault.kind == "rst":
            await self.to_client(rst_stream(sid, fault.code))
        elif fault.kind == "goaway":
            await self._goaway(fault.code)
        elif fault.kind == "tcp_close":
            raise _Closing("tcp_close")
        # "hang": the request silently goes nowhere.

    async def _fire_later(self, sid: int, fault: Fault, trigger: trio.Event) -> None:
        # Due ``after_sec`` into the response, counted from its headers (on a loaded machine
        # the server can take longer than that to answer at all), or earlier when the app
        # says the process ended first; ``0``: at once, before any of the response.
        try:
            if fault.after_sec > 0:
                async with trio.open_nursery() as nursery:

                    async def ended() -> None:
                        await trigger.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(ended)
                    await self.answered[sid].wait()
                    await trio.sleep(fault.after_sec)
                    nursery.cancel_scope.cancel()
        finally:
            del self.answered[sid]
        if self.pending.pop(sid, None) is None:
            return  # already fired when the response ended, or the client reset the stream
        await self._fire(sid, fault, server_done=False)

    async def _fire(self, sid: int, fault: Fault, *, server_done: bool) -> None:
        self.proxy.plan.record(fault)
        self.proxy.stats[f"fault_{fault.kind}"] += 1
        if fault.kind == "rst":
            self.silenced.add(sid)
            self._stream_done(sid)
            await self.to_client(rst_stream(sid, fault.code))
            if not server_done:
                await self.to_upstream(rst_stream(sid, CANCEL))
        elif fault.kind == "hang":
            self.silenced.add(sid)
        elif fault.kind == "goaway":
            await self._goaway(fault.code)
        elif fault.kind == "tcp_close":
            raise _Closing("tcp_close")

    async def _goaway(self, code: int) -> None:
        self.goaway_sent = True
        await self.to_client(goaway(self.max_forwarded, code))
        if code != NO_ERROR or not self.open:
            raise _Closing("goaway")
        assert self._nursery is not None
        self._nursery.start_soon(self._close_when_drained)

    async def _close_when_drained(self) -> None:
        with trio.move_on_after(_GOAWAY_DRAIN_SEC):
            await self.drained.wait()
        raise _Closing("goaway drained")

    # --- server -> client ---------------------------------------------------------------

    async def _s2c(self) -> None:
        frames = _Frames()
        while True:
            data = await self.upstream.receive_some(_READ)
            if not data:
                raise _Closing("upstream closed")
            frames.feed(data)
            out = bytearray()
            credit = 0
            answered: list[int] = []  # pending faults' streams whose headers are in ``out``
            while (f := frames.pop()) is not None:
                ftype, flags, sid, payload, raw = f
                if flags & END_STREAM and ftype in (DATA, HEADERS) and sid in self.pending:
                    # The response is complete before its fault fired: the fault takes the place
                    # of its end, so a decided fault always happens ("the reply was lost").
                    fault = self.pending.pop(sid)
                    if fault.kind == "goaway" and fault.code == NO_ERROR:
                        out += raw  # graceful: this response completes, then GOAWAY
                    elif ftype == DATA:
                        credit += len(payload)
                    else:
                        out += frame(HEADERS, flags & ~END_STREAM, sid, payload)
                    self._stream_done(sid)
                    await self._flush_s2c(out, credit)
                    out, credit = bytearray(), 0
                    self._answered(sid)
                    await self._fire(sid, fault, server_done=True)
                    continue
                if ftype == DATA and sid in self.silenced:
                    credit += len(payload)
                    if flags & END_STREAM:
                        self._stream_done(sid)
                    continue
                if (ftype in (DATA, HEADERS) and flags & END_STREAM) or ftype == RST_STREAM:
                    self._stream_done(sid)
                elif ftype == SETTINGS and not flags & ACK:
                    for i in range(0, len(payload) - 5, 6):
                        ident, value = struct.unpack_from(">HI", payload, i)
                        if ident == _SETTINGS_MAX_FRAME_SIZE:
                            self.upstream_max_frame = value
                if ftype == HEADERS and sid in self.answered:
                    answered.append(sid)
                out += raw
            await self._flush_s2c(out, credit)
            for sid in answered:
                self._answered(sid)

    async def _flush_s2c(self, out: bytearray, credit: int) -> None:
        if credit:
            await self.to_upstream(window_update(0, credit))
        if out:
            await self.to_client(bytes(out))
