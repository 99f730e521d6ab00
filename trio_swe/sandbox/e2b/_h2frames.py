"""The client side of HTTP/2 (RFC 9113) for envd's few routes, sans-IO: frames, flow control.

Why not h2's state machine: per short ``exec`` it built a frame object per frame, ran every frame
through two state machines, formatted ``repr(frame)`` eagerly for its logger and converted
headers on every request; that was a quarter of the client's CPU (``python -m bench e2b`` with
``TRIO_SWE_BENCH_PROFILE=1``). The client needs little of it: it opens streams, sends one header
block and a body, and reads responses. So this module parses frames straight out of the bytes
received and calls the :class:`Handler` with what they carry (no event objects), and keeps only
the state the protocol needs: windows both ways, the peer's settings, the HPACK decoder (the
peer's dynamic table), which streams are open and whether each side ended.

What it does not do: server push (refused in our SETTINGS; a PUSH_PROMISE is a protocol error),
priorities (ignored), outbound HPACK state (header blocks come encoded, see
:class:`~._h2conn.StatelessEncoder`), HTTP semantics (status, trailers, 1xx: the caller's).

Errors the peer makes on the connection raise :class:`H2ProtocolError` (the caller sends the
GOAWAY it carries and fails the connection). Frames for streams that are closed (reset by us,
ended) are dropped, their DATA still counted against and credited back to the connection window.
"""

from __future__ import annotations

import struct
from typing import Final, Protocol, cast

from hpack import Decoder
from hpack.exceptions import HPACKError

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 6).
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags.
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# Settings.
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

# Error codes (RFC 9113 7).
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9

DEFAULT_WINDOW: Final = 65535
DEFAULT_MAX_FRAME: Final = 16384
MAX_WINDOW: Final = 2**31 - 1
#: Header blocks larger than this (HEADERS + CONTINUATIONs) are refused.
MAX_HEADER_BLOCK: Final = 1 << 20
#: Our SETTINGS_MAX_HEADER_LIST_SIZE (and the decoder's bound).
MAX_HEADER_LIST: Final = 65536

_HEADER: Final = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, stream id
_U32: Final = struct.Struct(">L")
_U32X2: Final = struct.Struct(">LL")
_SETTING: Final = struct.Struct(">HL")
_SID_MASK: Final = 0x7FFFFFFF


class H2ProtocolError(Exception):
    """The peer broke HTTP/2 on the connection: send ``GOAWAY(code)`` and close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class TooManyStreams(Exception):
    """Opening a stream would exceed the peer's ``SETTINGS_MAX_CONCURRENT_STREAMS``."""


class Handler(Protocol):
    """What the connection learns from the peer, one call per frame (no event objects)."""

    def on_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        """A decoded header block (a response's, or trailers); ``end``: END_STREAM."""

    def on_data(self, stream_id: int, data: bytes, flow: int, end: bool) -> None:
        """DATA for an open stream: ``flow`` bytes count against the windows (padding
        included) until :meth:`ClientConnection.consumed` hands them back."""

    def on_reset(self, stream_id: int, code: int) -> None:
        """The peer reset an open stream."""

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        """The peer will take no stream above ``last_stream_id``."""

    def on_window(self) -> None:
        """Send windows may have grown (WINDOW_UPDATE, or new settings)."""

    def on_ping_ack(self, data: bytes) -> None:
        """The answer to a PING of ours."""


class _Stream:
    __slots__ = ("local_ended", "recv_window", "remote_ended", "send_window", "unacked")

    def __init__(self, send_window: int) -> None:
        self.send_window = send_window
        self.recv_window = DEFAULT_WINDOW  # what the peer may still send (our initial window)
        self.unacked = 0  # consumed, not yet credited back
        self.local_ended = False
        self.remote_ended = False


def frame(
    kind: int, flags: int, stream_id: int, payload: bytes | bytearray | memoryview = b""
) -> bytes:
    """One frame's bytes."""
    n = len(payload)
    return _HEADER.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


class RepeatDecoder:
    """hpack's decoder, which skips decoding a header block it decoded before when the peer's
    dynamic table has not changed since.

    A server answers every request of a route with the same headers, which after the first
    answer are all references to its dynamic table: the same bytes, decoded to the same list,
    each costing more than the rest of a short response (hpack logs, checks and builds tuples
    per header). A block whose decoding left the table as it was (no insertion, no size change)
    is remembered; any change to the table forgets them all (a reference may now mean another
    header). The table is taken as unchanged when its length, its size limit and the identity
    of its newest entry are: every insertion puts a new entry first.
    """

    def __init__(self) -> None:
        self._hpack = Decoder(max_header_list_size=MAX_HEADER_LIST)
        self._hpack.max_allowed_table_size = 4096  # SETTINGS_HEADER_TABLE_SIZE, ours
        self._table = self._hpack.header_table
        self._seen: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._state = self._table_state()
        self.repeats = 0  # blocks not decoded again

    def _table_state(self) -> tuple[int, object, int]:
        entries = self._table.dynamic_entries
        return len(entries), entries[0] if entries else None, self._table.maxsize

    def _unchanged(self, state: tuple[int, object, int]) -> bool:
        now = self._table_state()
        return now[0] == state[0] and now[1] is state[1] and now[2] == state[2]

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """The headers of ``block`` (do not modify the list: it may be handed out again).

        Raises:
            HPACKError: a malformed block, or one the table cannot resolve.
        """
        if not self._unchanged(self._state):  # a failed decode may have changed it
            self._seen.clear()
            self._state = self._table_state()
        headers = self._seen.get(block)
        if headers is not None:
            self.repeats += 1
            return headers
        headers = cast(list[tuple[bytes, bytes]], self._hpack.decode(block, raw=True))
        if self._unchanged(self._state):
            if len(self._seen) >= 64:
                self._seen.clear()
            self._seen[block] = headers
        else:
            self._seen.clear()
            self._state = self._table_state()
        return headers


class ClientConnection:
    """A client HTTP/2 connection's protocol state; bytes in, calls out, bytes to send.

    Feed received bytes to :meth:`receive`; it calls ``handler``. Whatever is to be sent
    accumulates and is taken with :meth:`data_to_send`.

    Args:
        handler: told what arrives.
        connection_window: the connection-level receive window we grant (per-stream windows
            stay at the default 65,535, which bounds what an unread stream can buffer).
    """

    def __init__(self, handler: Handler, *, connection_window: int = DEFAULT_WINDOW) -> None:
        if not DEFAULT_WINDOW <= connection_window <= MAX_WINDOW:
            raise ValueError(f"connection_window out of range: {connection_window}")
        self._handler = handler
        self._out = bytearray()
        self._buf = b""
        self._decoder = RepeatDecoder()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1
        # The header block being received: stream id, END_STREAM of its HEADERS, fragments.
        self._block_sid = 0
        self._block_end = False
        self._block: list[bytes] = []
        self._block_size = 0
        # Windows. Receive: what the peer may still send on the connection, consumed not
        # credited; send: the peer's grant, and its initial window for new streams.
        self._window = connection_window
        self._recv_window = DEFAULT_WINDOW
        self._unacked = 0
        self.send_window = DEFAULT_WINDOW
        self.initial_send_window = DEFAULT_WINDOW
        #: The peer's settings we obey.
        self.max_frame_size = DEFAULT_MAX_FRAME
        self.max_concurrent_streams = 2**31 - 1
        self.goaway_received = False

    # --- state ---------------------------------------------------------------------------

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def highest_stream_id(self) -> int:
        """The highest stream id we opened (0 before any)."""
        return self._next_id - 2 if self._next_id > 1 else 0

    def send_window_of(self, stream_id: int) -> int:
        """How many DATA bytes may be sent on the stream now (0 if it is closed)."""
        s = self._streams.get(stream_id)
        if s is None or s.local_ended:
            return 0
        return min(s.send_window, self.send_window)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        out = bytes(self._out)
        self._out.clear()
        return out

    # --- sending -------------------------------------------------------------------------

    def initiate(self) -> None:
        """The preface, our SETTINGS, and the connection window we grant."""
        settings = b"".join(
            _SETTING.pack(k, v)
            for k, v in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_MAX_CONCURRENT_STREAMS, 100),
                (SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            )
        )
        self._out += PREFACE + frame(SETTINGS, 0, 0, settings)
        if self._window > DEFAULT_WINDOW:
            grant = self._window - DEFAULT_WINDOW
            self._recv_window += grant
            self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(grant))

    def open_stream(self, block: bytes, *, end_stream: bool) -> int:
        """Open a stream with the (HPACK-encoded) request header block; returns its id."""
        if len(self._streams) >= self.max_concurrent_streams:
            raise TooManyStreams(
                f"Max outbound streams is {self.max_concurrent_streams}, {len(self._streams)} open"
            )
        sid = self._next_id
        if sid > _SID_MASK:
            raise TooManyStreams("stream ids exhausted on this connection")
        self._next_id += 2
        s = _Stream(self.initial_send_window)
        s.local_ended = end_stream
        self._streams[sid] = s
        size = self.max_frame_size
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            self._out += frame(HEADERS, flags | END_HEADERS, sid, block)
        else:
            view = memoryview(block)
            self._out += frame(HEADERS, flags, sid, view[:size].tobytes())
            view = view[size:]
            while view:
                last = len(view) <= size
                self._out += frame(
                    CONTINUATION, END_HEADERS if last else 0, sid, view[:size].tobytes()
                )
                view = view[size:]
        return sid

    def send_data(self, stream_id: int, data: bytes | memoryview, *, end_stream: bool) -> int:
        """Send as much of ``data`` as the windows allow; returns the bytes sent.

        ``end_stream`` is sent with the last byte (or alone, for empty ``data``) only once all
        of ``data`` went out.
        """
        s = self._streams.get(stream_id)
        if s is None or s.local_ended:
            raise ValueError(f"stream {stream_id} is not open for sending")
        view = memoryview(data)
        total = len(view)
        allowed = min(total, s.send_window, self.send_window)
        size = self.max_frame_size
        sent = 0
        while sent < allowed:
            n = min(size, allowed - sent)
            last = end_stream and sent + n == total
            self._out += frame(DATA, END_STREAM if last else 0, stream_id, view[sent : sent + n])
            sent += n
        if total == 0 and end_stream:
            self._out += frame(DATA, END_STREAM, stream_id)
        s.send_window -= sent
        self.send_window -= sent
        if end_stream and sent == total:
            s.local_ended = True
            self._maybe_forget(stream_id, s)
        return sent

    def reset_stream(self, stream_id: int, code: int = CANCEL) -> None:
        """Send ``RST_STREAM(code)`` on an open stream and forget it (no-op if closed)."""
        if self._streams.pop(stream_id, None) is not None:
            self._out += frame(RST_STREAM, 0, stream_id, _U32.pack(code))

    def consumed(self, stream_id: int, flow: int) -> None:
        """``flow`` bytes of DATA were read (or dropped): hand the window back to the peer.

        Credit is sent once half a window is owed, so small bodies cost no WINDOW_UPDATE.
        """
        if flow <= 0:
            return
        self._unacked += flow
        if self._unacked >= self._window // 2:
            self._recv_window += self._unacked
            self._out += frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._unacked))
            self._unacked = 0
        s = self._streams.get(stream_id)
        if s is not None and not s.remote_ended:
            s.unacked += flow
            if s.unacked >= DEFAULT_WINDOW // 2:
                s.recv_window += s.unacked
                self._out += frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(s.unacked))
                s.unacked = 0

    def ping(self, data: bytes) -> None:
        if len(data) != 8:
            raise ValueError("PING data is 8 bytes")
        self._out += frame(PING, 0, 0, data)

    def close(self, code: int = NO_ERROR, last_stream_id: int = 0) -> None:
        """Send GOAWAY (we accept no stream from the peer: last-stream-id 0)."""
        self._out += frame(GOAWAY, 0, 0, _U32X2.pack(last_stream_id, code))

    def _maybe_forget(self, stream_id: int, s: _Stream) -> None:
        if s.local_ended and s.remote_ended:
            self._streams.pop(stream_id, None)

    # --- receiving -----------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Process received bytes; calls the handler per frame.

        Raises:
            H2ProtocolError: the peer broke the protocol (the connection is over).
        """
        buf = self._buf + data if self._buf else data
        end = len(buf)
        pos = 0
        unpack = _HEADER.unpack_from
        while end - pos >= 9:
            hi, lo, kind, flags, sid = unpack(buf, pos)
            length = (hi << 8) | lo
            if length > DEFAULT_MAX_FRAME:  # our SETTINGS_MAX_FRAME_SIZE (the default)
                raise H2ProtocolError(FRAME_SIZE_ERROR, f"frame of {length} bytes")
            stop = pos + 9 + length
            if stop > end:
                break
            payload = buf[pos + 9 : stop]
            pos = stop
            sid &= _SID_MASK
            if self._block_sid and kind != CONTINUATION:
                raise H2ProtocolError(PROTOCOL_ERROR, "a header block was interrupted")
            if kind == DATA:
                self._on_data(sid, flags, payload, length)
            elif kind == HEADERS:
                self._on_headers(sid, flags, payload)
            elif kind == CONTINUATION:
                self._on_continuation(sid, flags, payload)
            elif kind == WINDOW_UPDATE:
                self._on_window_update(sid, payload)
            elif kind == SETTINGS:
                self._on_settings(sid, flags, payload)
            elif kind == PING:
                if sid or length != 8:
                    raise H2ProtocolError(PROTOCOL_ERROR, "bad PING frame")
                if flags & ACK:
                    self._handler.on_ping_ack(payload)
                else:
                    self._out += frame(PING, ACK, 0, payload)
            elif kind == RST_STREAM:
                if not sid or length != 4:
                    raise H2ProtocolError(PROTOCOL_ERROR, "bad RST_STREAM frame")
                self._check_known(sid)
                if self._streams.pop(sid, None) is not None:
                    self._handler.on_reset(sid, _U32.unpack(payload)[0])
            elif kind == GOAWAY:
                if sid or length < 8:
                    raise H2ProtocolError(PROTOCOL_ERROR, "bad GOAWAY frame")
                last, code = _U32X2.unpack_from(payload)
                self.goaway_received = True
                self._handler.on_goaway(last & _SID_MASK, code, payload[8:])
            elif kind == PUSH_PROMISE:
                raise H2ProtocolError(PROTOCOL_ERROR, "PUSH_PROMISE although push is disabled")
            elif kind == PRIORITY and (not sid or length != 5):
                raise H2ProtocolError(PROTOCOL_ERROR, "bad PRIORITY frame")
            # Unknown frame types are ignored (RFC 9113 4.1).
        self._buf = buf[pos:] if pos < end else b""

    def _check_known(self, sid: int) -> None:
        """A frame on a stream we never opened (a server-initiated or future id) is an error."""
        if sid % 2 == 0 or sid >= self._next_id:
            raise H2ProtocolError(PROTOCOL_ERROR, f"frame on stream {sid}, never opened")

    @staticmethod
    def _unpad(flags: int, payload: bytes) -> bytes:
        if not flags & PADDED:
            return payload
        if not payload:
            raise H2ProtocolError(PROTOCOL_ERROR, "padded frame without a pad length")
        pad = payload[0]
        if pad >= len(payload):
            raise H2ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
        return payload[1 : len(payload) - pad]

    def _on_data(self, sid: int, flags: int, payload: bytes, flow: int) -> None:
        if not sid:
            raise H2ProtocolError(PROTOCOL_ERROR, "DATA on stream 0")
        self._check_known(sid)
        if flow > self._recv_window:
            raise H2ProtocolError(FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= flow
        s = self._streams.get(sid)
        if s is None or s.remote_ended:
            self.consumed(sid, flow)  # a stream we closed: credit the connection at once
            return
        if flow > s.recv_window:
            raise H2ProtocolError(FLOW_CONTROL_ERROR, f"DATA beyond stream {sid}'s window")
        s.recv_window -= flow
        data = self._unpad(flags, payload)
        end = bool(flags & END_STREAM)
        if end:
            s.remote_ended = True
            self._maybe_forget(sid, s)
        self._handler.on_data(sid, data, flow, end)

    def _on_headers(self, sid: int, flags: int, payload: bytes) -> None:
        if not sid:
            raise H2ProtocolError(PROTOCOL_ERROR, "HEADERS on stream 0")
        self._check_known(sid)
        fragment = self._unpad(flags, payload)
        if flags & PRIORITY_FLAG:
            if len(fragment) < 5:
                raise H2ProtocolError(PROTOCOL_ERROR, "HEADERS too short for its priority")
            fragment = fragment[5:]
        end = bool(flags & END_STREAM)
        if flags & END_HEADERS:
            self._on_block(sid, end, fragment)
        else:
            self._block_sid, self._block_end = sid, end
            self._block = [fragment]
            self._block_size = len(fragment)

    def _on_continuation(self, sid: int, flags: int, payload: bytes) -> None:
        if not self._block_sid or sid != self._block_sid:
            raise H2ProtocolError(PROTOCOL_ERROR, "CONTINUATION without its HEADERS")
        self._block.append(payload)
        self._block_size += len(payload)
        if self._block_size > MAX_HEADER_BLOCK:
            raise H2ProtocolError(PROTOCOL_ERROR, "header block too large")
        if flags & END_HEADERS:
            block = b"".join(self._block)
            self._block_sid, self._block = 0, []
            self._on_block(sid, self._block_end, block)

    def _on_block(self, sid: int, end: bool, block: bytes) -> None:
        # Decoded even for a closed stream: the peer's dynamic table changes either way.
        try:
            headers = self._decoder.decode(block)
        except HPACKError as exc:
            raise H2ProtocolError(COMPRESSION_ERROR, f"bad header block: {exc}") from exc
        s = self._streams.get(sid)
        if s is None or s.remote_ended:
            return
        if end:
            s.remote_ended = True
            self._maybe_forget(sid, s)
        self._handler.on_headers(sid, headers, end)

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2ProtocolError(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        inc = _U32.unpack(payload)[0] & _SID_MASK
        if not sid:
            if not inc:
                raise H2ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise H2ProtocolError(FLOW_CONTROL_ERROR, "connection window overflow")
        else:
            self._check_known(sid)
            s = self._streams.get(sid)
            if s is None:
                return
            if not inc or s.send_window + inc > MAX_WINDOW:
                # A stream error: that stream alone is over.
                del self._streams[sid]
                code = PROTOCOL_ERROR if not inc else FLOW_CONTROL_ERROR
                self._out += frame(RST_STREAM, 0, sid, _U32.pack(code))
                self._handler.on_reset(sid, code)
                return
            s.send_window += inc
        self._handler.on_window()

    def _on_settings(self, sid: int, flags: int, payload: bytes) -> None:
        if sid:
            raise H2ProtocolError(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2ProtocolError(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise H2ProtocolError(FRAME_SIZE_ERROR, "SETTINGS of a bad size")
        for i in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, i)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2ProtocolError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.initial_send_window
                self.initial_send_window = value
                for s in self._streams.values():
                    s.send_window += delta
                    if s.send_window > MAX_WINDOW:
                        raise H2ProtocolError(FLOW_CONTROL_ERROR, "stream window overflow")
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise H2ProtocolError(PROTOCOL_ERROR, f"bad SETTINGS_MAX_FRAME_SIZE {value}")
                self.max_frame_size = value
            elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.max_concurrent_streams = value
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise H2ProtocolError(PROTOCOL_ERROR, f"bad SETTINGS_ENABLE_PUSH {value}")
            # HEADER_TABLE_SIZE: our header blocks never use the dynamic table (the encoder
            # starts with a size update to 0); MAX_HEADER_LIST_SIZE: ours are small.
        self._out += frame(SETTINGS, ACK, 0)
        self._handler.on_window()
