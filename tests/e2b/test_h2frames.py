"""The sans-IO HTTP/2 frame layer (``_h2frames``) against hyperframe and h2 as references.

* What we write, hyperframe parses to the same frames; what hyperframe writes (padding,
  priority, CONTINUATION, unknown types), we read to the same content, however the bytes are
  split.
* Against h2's *server* state machine (which checks every rule of RFC 9113 a server sees): our
  preface, settings, header blocks and DATA within its windows are accepted, and its responses
  (dynamic-table HPACK, bodies of any size and split) arrive intact, with windows credited back.
* The peer's protocol errors raise H2ProtocolError with the code RFC 9113 names.
"""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
import hpack
import hyperframe.frame as hf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_swe.sandbox.e2b import _h2frames as fr
from trio_swe.sandbox.e2b._h2conn import StatelessEncoder

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Recorder:
    """A Handler that records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def on_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        self.calls.append(("headers", stream_id, list(headers), end))

    def on_data(self, stream_id: int, data: bytes, flow: int, end: bool) -> None:
        self.calls.append(("data", stream_id, data, flow, end))

    def on_reset(self, stream_id: int, code: int) -> None:
        self.calls.append(("reset", stream_id, code))

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        self.calls.append(("goaway", last_stream_id, code, debug))

    def on_window(self) -> None:
        self.calls.append(("window",))

    def on_ping_ack(self, data: bytes) -> None:
        self.calls.append(("ping_ack", data))


def parse_all(data: bytes) -> list[hf.Frame]:
    """Every frame in ``data`` as hyperframe reads it."""
    out = []
    view = memoryview(data)
    while view:
        f, length = hf.Frame.parse_frame_header(view[:9])
        f.parse_body(view[9 : 9 + length])
        out.append(f)
        view = view[9 + length :]
    return out


def client(window: int = fr.DEFAULT_WINDOW) -> tuple[fr.ClientConnection, Recorder]:
    rec = Recorder()
    conn = fr.ClientConnection(rec, connection_window=window)
    return conn, rec


def feed(conn: fr.ClientConnection, data: bytes, cuts: list[int]) -> None:
    """Feed ``data`` split at ``cuts``."""
    last = 0
    for cut in [*sorted({c % (len(data) + 1) for c in cuts}), len(data)]:
        conn.receive(data[last:cut])
        last = cut


# --- what we write, hyperframe reads ----------------------------------------------------------


@SETTINGS
@given(
    body=st.binary(max_size=40_000),
    max_frame=st.integers(min_value=16384, max_value=2**24 - 1),
    window=st.integers(min_value=0, max_value=70_000),
)
def test_our_data_frames_are_what_hyperframe_reads(
    body: bytes, max_frame: int, window: int
) -> None:
    conn, _ = client()
    conn.initiate()
    conn.data_to_send()
    conn.max_frame_size = max_frame
    conn.send_window = window
    sid = conn.open_stream(b"\x82", end_stream=False)
    sent = conn.send_data(sid, body, end_stream=True)
    assert sent == min(len(body), window)
    frames = parse_all(conn.data_to_send())
    assert isinstance(frames[0], hf.HeadersFrame)
    data = [f for f in frames[1:] if isinstance(f, hf.DataFrame)]
    assert len(data) == len(frames) - 1
    assert b"".join(f.data for f in data) == body[:sent]
    assert all(len(f.data) <= min(max_frame, 16384 * 1024) for f in data)
    # END_STREAM only on the last frame, and only when the whole body went out.
    ends = ["END_STREAM" in f.flags for f in data]
    assert ends == ([False] * (len(data) - 1) + [sent == len(body)] if data else [])
    assert conn.send_window_of(sid) == (0 if sent == len(body) else min(65535, window) - sent)


@SETTINGS
@given(size=st.integers(min_value=0, max_value=70_000), max_frame=st.sampled_from([16384, 20000]))
def test_a_large_header_block_goes_out_as_headers_and_continuations(
    size: int, max_frame: int
) -> None:
    conn, _ = client()
    conn.max_frame_size = max_frame
    block = bytes(range(256)) * (size // 256) + b"\x00" * (size % 256)
    sid = conn.open_stream(block, end_stream=True)
    frames = parse_all(conn.data_to_send())
    assert isinstance(frames[0], hf.HeadersFrame)
    assert all(isinstance(f, hf.ContinuationFrame) for f in frames[1:])
    assert all(f.stream_id == sid for f in frames)
    assert "END_STREAM" in frames[0].flags
    assert ["END_HEADERS" in f.flags for f in frames] == [False] * (len(frames) - 1) + [True]
    assert b"".join(f.data for f in frames) == block
    assert all(len(f.data) <= max_frame for f in frames)


def test_control_frames_are_what_hyperframe_reads() -> None:
    conn, _ = client(window=16 * 1024 * 1024)
    conn.initiate()
    out = conn.data_to_send()
    assert out.startswith(fr.PREFACE)
    settings_frame, window = parse_all(out[len(fr.PREFACE) :])
    assert isinstance(settings_frame, hf.SettingsFrame)
    assert settings_frame.settings == {
        hf.SettingsFrame.ENABLE_PUSH: 0,
        hf.SettingsFrame.MAX_CONCURRENT_STREAMS: 100,
        hf.SettingsFrame.MAX_HEADER_LIST_SIZE: 65536,
    }
    assert isinstance(window, hf.WindowUpdateFrame)
    assert (window.stream_id, window.window_increment) == (0, 16 * 1024 * 1024 - 65535)
    sid = conn.open_stream(b"\x82", end_stream=False)
    conn.reset_stream(sid, fr.CANCEL)
    conn.reset_stream(sid, fr.CANCEL)  # closed already: nothing more
    conn.ping(b"12345678")
    conn.close(fr.PROTOCOL_ERROR)
    _, rst, ping, goaway = parse_all(conn.data_to_send())
    assert isinstance(rst, hf.RstStreamFrame)
    assert (rst.stream_id, rst.error_code) == (sid, fr.CANCEL)
    assert isinstance(ping, hf.PingFrame)
    assert (ping.opaque_data, ping.flags) == (b"12345678", set())
    assert isinstance(goaway, hf.GoAwayFrame)
    assert (goaway.last_stream_id, goaway.error_code) == (0, fr.PROTOCOL_ERROR)


# --- what hyperframe writes, we read ----------------------------------------------------------

_HEADERS = st.lists(
    st.tuples(
        st.binary(min_size=1, max_size=20).map(lambda b: b.lower().replace(b":", b"x")),
        st.binary(max_size=200),
    ),
    max_size=12,
)


@SETTINGS
@given(
    bodies=st.lists(
        st.tuples(st.binary(max_size=3000), st.integers(min_value=0, max_value=255)),
        min_size=1,
        max_size=6,
    ),
    headers=_HEADERS,
    trailers=st.booleans(),
    split=st.integers(min_value=1, max_value=400),
    priority=st.booleans(),
    cuts=st.lists(st.integers(min_value=0), max_size=8),
)
def test_frames_from_hyperframe_are_read_whole_however_split(
    bodies: list[tuple[bytes, int]],
    headers: list[tuple[bytes, bytes]],
    trailers: bool,
    split: int,
    priority: bool,
    cuts: list[int],
) -> None:
    conn, rec = client()
    sid = conn.open_stream(b"\x82", end_stream=True)
    encoder = hpack.Encoder()  # with the dynamic table, as a server's
    block = encoder.encode([(b":status", b"200"), *headers])
    pieces = [block[i : i + split] for i in range(0, len(block), split)] or [b""]
    wire = bytearray()
    first = hf.HeadersFrame(sid, pieces[0])
    if priority:
        first.flags.add("PRIORITY")
        first.depends_on, first.stream_weight = 0, 15
    if len(pieces) == 1:
        first.flags.add("END_HEADERS")
    wire += first.serialize()
    for i, piece in enumerate(pieces[1:], start=2):
        cont = hf.ContinuationFrame(sid, piece)
        if i == len(pieces):
            cont.flags.add("END_HEADERS")
        wire += cont.serialize()
    wire += hf.PriorityFrame(sid).serialize()  # ignored
    wire += b"\x00\x00\x03\xfa\x00\x00\x00\x00\x01abc"  # an unknown frame type: ignored
    flow = 0
    for i, (body, pad) in enumerate(bodies):
        f = hf.DataFrame(sid, body)
        if pad:
            f.flags.add("PADDED")
            f.pad_length = pad - 1
        if i == len(bodies) - 1 and not trailers:
            f.flags.add("END_STREAM")
        flow += len(f.serialize()) - 9
        wire += f.serialize()
    if trailers:
        t = hf.HeadersFrame(sid, encoder.encode([(b"x-trailer", b"1")]))
        t.flags |= {"END_HEADERS", "END_STREAM"}
        wire += t.serialize()
    feed(conn, bytes(wire), cuts)
    got_headers = [c for c in rec.calls if c[0] == "headers"]
    assert got_headers[0] == ("headers", sid, [(b":status", b"200"), *headers], False)
    data = [c for c in rec.calls if c[0] == "data"]
    assert b"".join(c[2] for c in data) == b"".join(b for b, _ in bodies)  # type: ignore[misc]
    assert sum(c[3] for c in data) == flow  # type: ignore[misc]
    assert any(c[-1] for c in rec.calls if c[0] in ("headers", "data"))  # END_STREAM seen
    assert conn.open_streams == 0  # both sides ended: forgotten


@SETTINGS
@given(
    increments=st.lists(st.integers(min_value=1, max_value=2**20), max_size=5),
    initial=st.integers(min_value=0, max_value=2**20),
)
def test_window_updates_and_settings_from_hyperframe(increments: list[int], initial: int) -> None:
    conn, rec = client()
    sid = conn.open_stream(b"\x82", end_stream=False)
    wire = hf.SettingsFrame(0, {hf.SettingsFrame.INITIAL_WINDOW_SIZE: initial}).serialize()
    for inc in increments:
        wire += hf.WindowUpdateFrame(0, inc).serialize()
        wire += hf.WindowUpdateFrame(sid, inc).serialize()
    conn.receive(wire)
    total = sum(increments)
    assert conn.send_window_of(sid) == min(65535 + total, initial + total)
    # The SETTINGS were acknowledged.
    acks = [f for f in parse_all(conn.data_to_send()) if isinstance(f, hf.SettingsFrame)]
    assert len(acks) == 1
    assert acks[0].flags == {"ACK"}
    assert ("window",) in rec.calls


def test_ping_rst_goaway_from_hyperframe() -> None:
    conn, rec = client()
    s1 = conn.open_stream(b"\x82", end_stream=True)
    s3 = conn.open_stream(b"\x82", end_stream=True)
    conn.data_to_send()
    ack = hf.PingFrame(0, b"abcdefgh")
    ack.flags.add("ACK")
    conn.receive(
        hf.PingFrame(0, b"12345678").serialize()
        + ack.serialize()
        + hf.RstStreamFrame(s1, error_code=fr.REFUSED_STREAM).serialize()
        + hf.GoAwayFrame(0, last_stream_id=s1, error_code=0, additional_data=b"bye").serialize()
    )
    assert rec.calls == [
        ("ping_ack", b"abcdefgh"),
        ("reset", s1, fr.REFUSED_STREAM),
        ("goaway", s1, 0, b"bye"),
    ]
    (pong,) = parse_all(conn.data_to_send())
    assert isinstance(pong, hf.PingFrame)
    assert (pong.flags, pong.opaque_data) == ({"ACK"}, b"12345678")
    assert conn.goaway_received
    assert conn.open_streams == 1  # s3 still open: the GOAWAY's consequences are the caller's
    del s3


# --- against h2's server state machine --------------------------------------------------------


class Server:
    """h2's server side: it checks what we send against RFC 9113."""

    def __init__(self) -> None:
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.h2.initiate_connection()
        self.bodies: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        self.headers: dict[int, list[tuple[bytes, bytes]]] = {}

    def receive(self, data: bytes) -> None:
        for ev in self.h2.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                self.headers[ev.stream_id] = list(ev.headers or [])
                self.bodies[ev.stream_id] = bytearray()
            elif isinstance(ev, h2.events.DataReceived):
                self.bodies[ev.stream_id] += ev.data or b""
                self.h2.acknowledge_received_data(ev.flow_controlled_length or 0, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                self.ended.add(ev.stream_id)


@SETTINGS
@given(
    request_bodies=st.lists(st.binary(max_size=150_000), min_size=1, max_size=3),
    response_sizes=st.lists(st.integers(min_value=0, max_value=200_000), min_size=3, max_size=3),
    cuts=st.lists(st.integers(min_value=0), max_size=6),
    read_late=st.booleans(),
)
def test_exchanges_with_h2s_server_keep_every_rule(
    request_bodies: list[bytes], response_sizes: list[int], cuts: list[int], read_late: bool
) -> None:
    conn, rec = client(window=16 * 1024 * 1024)
    server = Server()
    conn.initiate()
    encoder = StatelessEncoder()

    def pump() -> None:
        for _ in range(1000):
            out = conn.data_to_send()
            if out:
                server.receive(out)
            back = server.h2.data_to_send()
            if back:
                feed(conn, back, cuts)
                consume()
            if not out and not back:
                return
        raise AssertionError("no quiescence")

    received: dict[int, bytearray] = {}
    owed: list[tuple[int, int]] = []

    def consume() -> None:
        for call in rec.calls:
            if call[0] == "data":
                _, sid, data, flow, _end = call
                received.setdefault(sid, bytearray()).extend(data)  # type: ignore[arg-type]
                owed.append((sid, flow))  # type: ignore[arg-type]
        rec.calls.clear()
        if not read_late:
            for sid, flow in owed:
                conn.consumed(sid, flow)
            owed.clear()

    sids = []
    pending: dict[int, memoryview] = {}
    for body in request_bodies:
        block = encoder.encode(
            [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"e"), (b":path", b"/")]
        )
        sid = conn.open_stream(block, end_stream=not body)
        sids.append(sid)
        if body:
            pending[sid] = memoryview(body)
    for _ in range(1000):  # send within the server's windows, pumping for its credit
        for sid, view in list(pending.items()):
            if conn.send_window_of(sid):
                pending[sid] = view = view[conn.send_data(sid, view, end_stream=True) :]
                if not view:
                    del pending[sid]
        pump()
        if not pending:
            break
    assert not pending
    for sid, body in zip(sids, request_bodies, strict=True):
        assert server.bodies[sid] == body
        assert sid in server.ended
        assert dict(server.headers[sid])[b":path"] == b"/"
    # Responses of any size: the server sends within our windows only as we credit them.
    for sid, size in zip(sids, response_sizes, strict=False):
        server.h2.send_headers(sid, [(b":status", b"200"), (b"x-n", str(size).encode())])
    expect = {
        sid: bytes([sid % 251]) * size for sid, size in zip(sids, response_sizes, strict=False)
    }
    left = {sid: memoryview(b) for sid, b in expect.items()}
    for _ in range(2000):
        for sid, view in list(left.items()):
            n = min(len(view), server.h2.local_flow_control_window(sid), 16384)
            if n or not view:
                server.h2.send_data(sid, view[:n].tobytes(), end_stream=n == len(view))
                left[sid] = view = view[n:]
                if not view:
                    del left[sid]
        pump()
        if read_late:  # the reader catches up now and then
            for sid, flow in owed:
                conn.consumed(sid, flow)
            owed.clear()
        if not left:
            break
    assert not left
    for sid, body in expect.items():
        assert bytes(received.get(sid, b"")) == body
    assert conn.open_streams == 0


# --- the peer's errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (fr.frame(fr.DATA, 0, 0, b"x"), fr.PROTOCOL_ERROR),  # DATA on stream 0
        (fr.frame(fr.DATA, 0, 2, b"x"), fr.PROTOCOL_ERROR),  # a stream the server would open
        (fr.frame(fr.DATA, 0, 99, b"x"), fr.PROTOCOL_ERROR),  # a stream never opened
        (fr.frame(fr.HEADERS, 0, 1, b"\x82") + fr.frame(fr.DATA, 0, 1), fr.PROTOCOL_ERROR),
        (fr.frame(fr.CONTINUATION, fr.END_HEADERS, 1, b"\x82"), fr.PROTOCOL_ERROR),
        (fr.frame(fr.PUSH_PROMISE, fr.END_HEADERS, 1, b"\x00\x00\x00\x02\x82"), fr.PROTOCOL_ERROR),
        (fr.frame(fr.PING, 0, 0, b"short"), fr.PROTOCOL_ERROR),
        (fr.frame(fr.SETTINGS, 0, 0, b"\x00\x04\x80\x00\x00\x00"), fr.FLOW_CONTROL_ERROR),
        (fr.frame(fr.SETTINGS, 0, 0, b"\x00\x05\x00\x00\x00\x01"), fr.PROTOCOL_ERROR),
        (fr.frame(fr.SETTINGS, 0, 0, b"\x00\x04\x00"), fr.FRAME_SIZE_ERROR),
        (fr.frame(fr.SETTINGS, fr.ACK, 0, b"\x00\x04\x00\x00\x00\x00"), fr.FRAME_SIZE_ERROR),
        (fr.frame(fr.WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00"), fr.PROTOCOL_ERROR),
        (fr.frame(fr.WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"), fr.FLOW_CONTROL_ERROR),
        (fr.frame(fr.HEADERS, fr.END_HEADERS, 1, b"\xff\xff\xff\xff"), fr.COMPRESSION_ERROR),
        (fr.frame(fr.DATA, fr.PADDED, 1, b"\x05ab"), fr.PROTOCOL_ERROR),  # padding too long
        (b"\x00\x40\x01\x00\x00\x00\x00\x00\x01" + b"x" * 16385, fr.FRAME_SIZE_ERROR),
    ],
)
def test_the_peers_errors_raise_with_their_code(wire: bytes, code: int) -> None:
    conn, _ = client()
    conn.open_stream(b"\x82", end_stream=False)
    with pytest.raises(fr.H2ProtocolError) as info:
        conn.receive(wire)
    assert info.value.code == code


def test_data_beyond_the_windows_is_a_flow_control_error() -> None:
    conn, _ = client()
    sid = conn.open_stream(b"\x82", end_stream=True)
    conn.receive(fr.frame(fr.HEADERS, fr.END_HEADERS, sid, b"\x88"))
    for _ in range(3):
        conn.receive(fr.frame(fr.DATA, 0, sid, b"x" * 16384))
    with pytest.raises(fr.H2ProtocolError) as info:
        conn.receive(fr.frame(fr.DATA, 0, sid, b"x" * 16384))  # 65,536 > 65,535
    assert info.value.code == fr.FLOW_CONTROL_ERROR


def test_credit_is_sent_once_half_a_window_is_owed_and_closed_streams_credit_the_connection() -> (
    None
):
    conn, rec = client()
    s1 = conn.open_stream(b"\x82", end_stream=True)
    s3 = conn.open_stream(b"\x82", end_stream=True)
    conn.receive(fr.frame(fr.HEADERS, fr.END_HEADERS, s1, b"\x88"))
    conn.receive(fr.frame(fr.HEADERS, fr.END_HEADERS, s3, b"\x88"))
    conn.data_to_send()
    conn.receive(fr.frame(fr.DATA, 0, s1, b"x" * 16384))
    conn.consumed(s1, 16384)
    assert conn.data_to_send() == b""  # below half a window: no WINDOW_UPDATE yet
    conn.receive(fr.frame(fr.DATA, 0, s1, b"x" * 16384))
    conn.consumed(s1, 16384)
    updates = {(f.stream_id, f.window_increment) for f in parse_all(conn.data_to_send())}
    assert updates == {(0, 32768), (s1, 32768)}
    conn.reset_stream(s3)
    conn.data_to_send()
    conn.receive(fr.frame(fr.DATA, 0, s3, b"y" * 16384))  # after our reset: dropped, credited
    conn.receive(fr.frame(fr.DATA, 0, s3, b"y" * 16384))
    assert not [c for c in rec.calls if c[0] == "data" and c[1] == s3]
    updates = {(f.stream_id, f.window_increment) for f in parse_all(conn.data_to_send())}
    assert updates == {(0, 32768)}


def test_too_many_streams_is_refused_locally() -> None:
    conn, _ = client()
    conn.receive(fr.frame(fr.SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00\x01"))
    conn.open_stream(b"\x82", end_stream=True)
    with pytest.raises(fr.TooManyStreams, match="Max outbound streams"):
        conn.open_stream(b"\x82", end_stream=True)


def test_a_repeated_block_is_decoded_once_while_the_table_stays() -> None:
    enc = hpack.Encoder()
    ours = fr.RepeatDecoder()
    answer = [(b":status", b"200"), (b"content-type", b"application/connect+json")]
    first, again = enc.encode(answer), enc.encode(answer)
    assert first != again  # the first inserts into the table, the next only refers to it
    assert [ours.decode(b) for b in (first, again, again, again)] == [answer] * 4
    assert ours.repeats == 2
    dated = enc.encode([*answer, (b"date", b"now")])  # an insertion: what was seen is forgotten
    assert ours.decode(dated) == [*answer, (b"date", b"now")]
    # The old bytes now name other entries (the insertion shifted the indices): decoded anew.
    assert ours.decode(again) == [(b":status", b"200"), (b"date", b"now")]
    assert ours.repeats == 2


_HEADER = st.sampled_from(
    [
        (b":status", b"200"),
        (b":status", b"404"),
        (b"content-type", b"application/connect+json"),
        (b"server", b"envd"),
        (b"date", b"Tue, 01 Dec 2026 16:00:00 GMT"),
        (b"date", b"Tue, 01 Dec 2026 16:00:01 GMT"),
        (b"x-long", b"v" * 1500),  # evicts entries from a 4,096-byte table
    ]
)


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.lists(_HEADER, min_size=1, max_size=5),
            st.sampled_from([None, None, None, 256, 4096]),  # a table size update first
            st.booleans(),  # indexed (the usual) or never indexed
        ),
        min_size=1,
        max_size=30,
    )
)
def test_repeated_blocks_decode_as_hpack_does(
    blocks: list[tuple[list[tuple[bytes, bytes]], int | None, bool]],
) -> None:
    # A peer's encoder with its dynamic table: our decoder (which skips a block it decoded
    # before while the table is unchanged) gives what a fresh hpack decoder gives, every time.
    enc = hpack.Encoder()
    ours = fr.RepeatDecoder()
    reference = hpack.Decoder(max_header_list_size=fr.MAX_HEADER_LIST)
    for headers, size, indexed in blocks:
        if size is not None:
            enc.header_table_size = size
        if indexed:
            block = enc.encode(headers)
        else:
            block = enc.encode([hpack.NeverIndexedHeaderTuple(k, v) for k, v in headers])
        assert ours.decode(block) == reference.decode(block, raw=True) == headers
        for _ in range(2):  # the server answers the same again: now references, same bytes
            again = enc.encode(headers)
            assert ours.decode(again) == reference.decode(again, raw=True) == headers
