"""The sans-IO Connect codec: envelopes, end-of-stream, requests, errors. No I/O."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_swe.sandbox.e2b import _connect as c


def test_envelope_layout() -> None:
    assert c.encode_envelope(b"{}") == b"\x00\x00\x00\x00\x02{}"
    assert c.encode_envelope(b"", flags=c.FLAG_END_STREAM) == b"\x02\x00\x00\x00\x00"


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=40),
)
def test_decoder_reassembles_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    wire = b"".join(c.encode_envelope(p) for p in payloads) + c.encode_end_stream()
    dec = c.EnvelopeDecoder()
    got: list[c.Envelope] = []
    pos = 0
    for n in cuts:
        got += dec.feed(wire[pos : pos + n])
        pos += n
    got += dec.feed(wire[pos:])
    dec.check_complete()
    assert [e.payload for e in got[:-1]] == payloads
    assert not any(e.end_stream for e in got[:-1])
    assert got[-1].end_stream
    assert c.parse_end_stream(got[-1].payload) == c.EndStream()


def test_truncated_stream_is_detected() -> None:
    dec = c.EnvelopeDecoder()
    assert dec.feed(c.encode_envelope(b"hello")[:-1]) == []
    assert dec.buffered == 9
    with pytest.raises(c.ProtocolError, match="inside an envelope"):
        dec.check_complete()


def test_oversized_and_compressed_envelopes_are_refused() -> None:
    with pytest.raises(c.ProtocolError, match="exceeds"):
        c.EnvelopeDecoder(max_message_bytes=10).feed(b"\x00\x00\x00\x00\x0b")
    with pytest.raises(c.ProtocolError, match="compressed"):
        c.EnvelopeDecoder().feed(c.encode_envelope(b"x", flags=c.FLAG_COMPRESSED))


def test_end_stream_with_error_roundtrips() -> None:
    err = c.ConnectError("not_found", "process with pid 7 not found")
    env = c.EnvelopeDecoder().feed(c.encode_end_stream(err, {"x-a": ["1"]}))[0]
    assert env.end_stream
    end = c.parse_end_stream(env.payload)
    assert end.metadata == {"x-a": ["1"]}
    parsed = c.end_stream_error(end)
    assert parsed is not None
    assert (parsed.code, parsed.message, parsed.http_status) == ("not_found", err.message, 200)
    assert c.end_stream_error(c.parse_end_stream(b"{}")) is None
    assert c.end_stream_error(c.parse_end_stream(b"")) is None
    with pytest.raises(c.ProtocolError):
        c.parse_end_stream(b"not json")


def test_stream_request_is_one_envelope_with_connect_headers() -> None:
    req = c.stream_request(
        "/process.Process/Start", b'{"a":1}', timeout_ms=1500, headers={"x-access-token": "t"}
    )
    assert req.path == "/process.Process/Start"
    assert req.headers["content-type"] == "application/connect+json"
    assert req.headers["connect-protocol-version"] == "1"
    assert req.headers["connect-timeout-ms"] == "1500"
    assert req.headers["x-access-token"] == "t"
    (env,) = c.EnvelopeDecoder().feed(req.body)
    assert env.payload == b'{"a":1}'


def test_unary_request_is_bare_json_without_deadline_by_default() -> None:
    req = c.unary_request(c.procedure_path("process.Process", "SendSignal"), b"{}")
    assert req.path == "/process.Process/SendSignal"
    assert req.body == b"{}"
    assert req.headers["content-type"] == "application/json"
    assert "connect-timeout-ms" not in req.headers
    with pytest.raises(ValueError):
        c.unary_request("/x", b"{}", timeout_ms=0)


def test_byte_headers_are_the_requests_headers() -> None:
    # The client sends the byte forms; the server and tests read the str forms: one set.
    def as_str(headers: tuple[tuple[bytes, bytes], ...]) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in headers}

    stream = c.stream_request("/p", b"{}", timeout_ms=1500)
    assert {**as_str(c.STREAM_HEADERS), **as_str((c.timeout_header(1500),))} == stream.headers
    assert as_str(c.UNARY_HEADERS) == c.unary_request("/p", b"{}").headers
    with pytest.raises(ValueError):
        c.timeout_header(0)


def test_a_peer_nesting_too_deeply_is_a_protocol_error() -> None:
    deep = b"[" * 100_000  # msgspec raised RecursionError past the interpreter's limit
    with pytest.raises(c.ProtocolError, match="nested too deeply"):
        c.parse_end_stream(b'{"error": {"code": "internal", "details": ' + deep)
    err = c.error_from_response(502, b'{"message": "x", "details": ' + deep, content_type="json")
    assert err.http_status == 502
    assert err.code == c.code_for_http_status(502)  # by its status, as for any junk


def test_decoder_keeps_an_incomplete_tail_of_a_chunk() -> None:
    a, b = c.encode_envelope(b"one"), c.encode_envelope(b"two", flags=c.FLAG_END_STREAM)
    dec = c.EnvelopeDecoder()
    assert [e.payload for e in dec.feed(a + b[:3])] == [b"one"]
    assert dec.buffered == 3
    assert [(e.payload, e.end_stream) for e in dec.feed(memoryview(b[3:]))] == [(b"two", True)]
    dec.check_complete()


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, None), ("1", 0.001), ("60000", 60.0), ("9999999999", 9999999.999)],
)
def test_parse_timeout_ms(value: str | None, expected: float | None) -> None:
    assert c.parse_timeout_ms(value) == expected


@pytest.mark.parametrize("value", ["", "-1", "1.5", "12345678901", "\uff11"])
def test_parse_timeout_ms_rejects(value: str) -> None:
    with pytest.raises(c.ProtocolError):
        c.parse_timeout_ms(value)


def test_connect_error_body_wins_over_status() -> None:
    err = c.error_from_response(
        404,
        b'{"code":"not_found","message":"process not found"}',
        content_type="application/json",
    )
    assert (err.code, err.message, err.http_status) == ("not_found", "process not found", 404)
    roundtrip = c.error_from_response(500, c.encode_error(c.ConnectError("internal", "boom")))
    assert (roundtrip.code, roundtrip.message) == ("internal", "boom")


def test_gateway_errors_map_by_status() -> None:
    edge = msgspec.json.encode(
        {"sandboxId": "abc", "message": "The sandbox was not found", "code": 502}
    )
    err = c.error_from_response(502, edge, content_type="application/json")
    assert (err.code, err.message) == ("unavailable", "The sandbox was not found")
    limited = c.error_from_response(429, b"slow down", retry_after="3")
    assert (limited.code, limited.retry_after, limited.message) == (
        "resource_exhausted",
        3.0,
        "slow down",
    )
    assert c.error_from_response(418, b"<html>").code == "unknown"
    assert c.error_from_response(503, b"", retry_after="Wed, 21 Oct 2015").retry_after is None
