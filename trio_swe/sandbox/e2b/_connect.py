"""The Connect protocol (connectrpc.com/docs/protocol), sans-IO: framing, requests, errors.

envd speaks Connect over HTTP. Unary calls send one bare JSON message and get one back (or a
non-200 with a JSON error). Server-streaming calls send one *envelope* and get a sequence of
envelopes; the last one has flag ``0x02`` (end of stream) and carries JSON
``{"error": {...}?, "metadata": {...}?}`` whatever the message codec is.

Envelope: 1 byte of flags (``0x01`` compressed, ``0x02`` end of stream), a 4-byte big-endian
payload length, then the payload.

This module only turns bytes into values and back; the client (``_envd.py``) and the local server
(:mod:`trio_swe.testing`) do the I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any, Final

import msgspec

FLAG_COMPRESSED: Final = 0x01
FLAG_END_STREAM: Final = 0x02
_HEADER: Final = struct.Struct(">BI")
HEADER_SIZE: Final = _HEADER.size  # 5

#: Refuse envelopes larger than this; a corrupted length must not make us buffer gigabytes.
DEFAULT_MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024

PROTOCOL_VERSION: Final = "1"
CONTENT_TYPE_UNARY_JSON: Final = "application/json"
CONTENT_TYPE_STREAM_JSON: Final = "application/connect+json"

#: Connect error codes and the HTTP status a server answers a unary call with.
CODE_TO_HTTP: Final[Mapping[str, int]] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}

#: A non-Connect HTTP error (from a gateway in front of envd) read as a Connect code. The same
#: table the e2b SDK applies to plain HTTP errors from its edge.
_HTTP_TO_CODE: Final[Mapping[int, str]] = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "aborted",
    413: "resource_exhausted",
    429: "resource_exhausted",
    499: "canceled",
    500: "internal",
    501: "unimplemented",
    502: "unavailable",
    503: "unavailable",
    504: "deadline_exceeded",
    505: "unimplemented",
}


class ProtocolError(Exception):
    """The peer broke the Connect framing (truncated or oversized envelope, bad trailer)."""


class ConnectError(Exception):
    """A Connect error: from an end-of-stream trailer, a unary error body, or an HTTP status.

    Attributes:
        code: the Connect code (``"not_found"``, ``"unavailable"``...).
        message: the server's message.
        http_status: the HTTP status it came with (200 for errors in a stream trailer).
        details: the raw ``details`` list, if any.
        retry_after: seconds from a ``Retry-After`` header, when one came with it.
    """

    def __init__(
        self,
        code: str,
        message: str = "",
        *,
        http_status: int | None = None,
        details: list[Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.http_status = http_status
        self.details = details or []
        self.retry_after = retry_after


class Envelope(msgspec.Struct, frozen=True):
    """One Connect envelope."""

    flags: int
    payload: bytes

    @property
    def end_stream(self) -> bool:
        return bool(self.flags & FLAG_END_STREAM)


def encode_envelope(payload: bytes, *, flags: int = 0) -> bytes:
    """Frame ``payload`` as one envelope."""
    if not 0 <= flags <= 0xFF:
        raise ValueError(f"envelope flags out of range: {flags}")
    return _HEADER.pack(flags, len(payload)) + payload


class EnvelopeDecoder:
    """Incremental envelope parser: feed it chunks as they arrive, get whole envelopes back.

    Example::

        dec = EnvelopeDecoder()
        for chunk in body_chunks:
            for env in dec.feed(chunk):
                ...
        dec.check_complete()  # raises if the stream ended mid-envelope
    """

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_message_bytes

    def feed(self, data: bytes | bytearray | memoryview) -> list[Envelope]:
        """Add bytes; return every envelope now complete, in order."""
        buf = self._buf
        if buf:
            buf += data
            envelopes, pos = self._split(buf)
            del buf[:pos]
        else:
            # The usual case: nothing held back, so parse the chunk where it is (no copy into
            # the buffer) and keep only an incomplete tail.
            envelopes, pos = self._split(data)
            if pos < len(data):
                buf += memoryview(data)[pos:]
        return envelopes

    def _split(self, buf: bytes | bytearray | memoryview) -> tuple[list[Envelope], int]:
        """The complete envelopes at the start of ``buf`` and where the rest begins."""
        out: list[Envelope] = []
        pos = 0
        size = len(buf)
        while size - pos >= HEADER_SIZE:
            flags, length = _HEADER.unpack_from(buf, pos)
            if length > self._max:
                raise ProtocolError(f"envelope of {length} bytes exceeds {self._max}")
            if flags & FLAG_COMPRESSED:
                # We never advertise an encoding, so a compressed envelope is a protocol error.
                raise ProtocolError("compressed envelope without negotiated encoding")
            end = pos + HEADER_SIZE + length
            if size < end:
                break
            out.append(Envelope(flags, bytes(buf[pos + HEADER_SIZE : end])))
            pos = end
        return out, pos

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete envelope."""
        return len(self._buf)

    def check_complete(self) -> None:
        """Raise :class:`ProtocolError` if the body ended inside an envelope."""
        if self._buf:
            raise ProtocolError(f"stream ended inside an envelope ({len(self._buf)} bytes left)")


# --- end of stream ---------------------------------------------------------------------------


class WireError(msgspec.Struct, omit_defaults=True):
    """The JSON error object of Connect (unary body or end-of-stream ``error``)."""

    code: str = "unknown"
    message: str = ""
    details: list[Any] = msgspec.field(default_factory=list)


class EndStream(msgspec.Struct, omit_defaults=True):
    """The end-of-stream message: an optional error and trailing metadata."""

    error: WireError | None = None
    metadata: dict[str, list[str]] = msgspec.field(default_factory=dict)


_end_decoder: Final = msgspec.json.Decoder(EndStream)
_error_decoder: Final = msgspec.json.Decoder(WireError)
_encoder: Final = msgspec.json.Encoder()


def encode_end_stream(
    error: ConnectError | None = None, metadata: Mapping[str, list[str]] | None = None
) -> bytes:
    """The final envelope of a stream (flags ``0x02``): ``{}`` on success."""
    body = EndStream(
        error=None
        if error is None
        else WireError(code=error.code, message=error.message, details=error.details),
        metadata=dict(metadata or {}),
    )
    return encode_envelope(_encoder.encode(body), flags=FLAG_END_STREAM)


def parse_end_stream(payload: bytes) -> EndStream:
    """Parse an end-of-stream payload.

    Raises:
        ProtocolError: the payload is not the JSON Connect requires.
    """
    try:
        return _end_decoder.decode(payload) if payload.strip() else EndStream()
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"bad end-of-stream message: {exc}") from exc
    except RecursionError:  # msgspec: nested past the interpreter's limit
        raise ProtocolError("bad end-of-stream message: JSON nested too deeply") from None


def end_stream_error(end: EndStream) -> ConnectError | None:
    """The :class:`ConnectError` an end-of-stream message carries, if any."""
    if end.error is None:
        return None
    return ConnectError(
        end.error.code or "unknown", end.error.message, http_status=200, details=end.error.details
    )


# --- requests --------------------------------------------------------------------------------


class Request(msgspec.Struct, frozen=True):
    """An HTTP request to send: ``POST path`` with these headers and body."""

    path: str
    headers: dict[str, str]
    body: bytes


#: The fixed headers of a server-streaming call (:func:`stream_request`'s), as HTTP/2 wants
#: them: lowercase names and values in bytes, built once (a client adds its own and, with a
#: deadline, :func:`timeout_header`).
STREAM_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"connect-protocol-version", PROTOCOL_VERSION.encode()),
    (b"content-type", CONTENT_TYPE_STREAM_JSON.encode()),
    (b"connect-accept-encoding", b"identity"),
    (b"connect-content-encoding", b"identity"),
)
#: The fixed headers of a unary call (:func:`unary_request`'s), in bytes.
UNARY_HEADERS: Final[tuple[tuple[bytes, bytes], ...]] = (
    (b"connect-protocol-version", PROTOCOL_VERSION.encode()),
    (b"content-type", CONTENT_TYPE_UNARY_JSON.encode()),
)


def _check_timeout_ms(timeout_ms: int) -> str:
    if timeout_ms <= 0 or timeout_ms >= 10**10:
        raise ValueError(f"Connect-Timeout-Ms must be 1..9999999999, got {timeout_ms}")
    return str(int(timeout_ms))


def timeout_header(timeout_ms: int) -> tuple[bytes, bytes]:
    """``Connect-Timeout-Ms`` in bytes (the server ends the call when it elapses).

    Raises:
        ValueError: not 1 to 9,999,999,999 ms.
    """
    return (b"connect-timeout-ms", _check_timeout_ms(timeout_ms).encode())


def _base_headers(timeout_ms: int | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    headers = {"connect-protocol-version": PROTOCOL_VERSION}
    if timeout_ms is not None:
        headers["connect-timeout-ms"] = _check_timeout_ms(timeout_ms)
    if extra:
        headers.update(extra)
    return headers


def procedure_path(service: str, method: str) -> str:
    """``/process.Process/Start`` from ``("process.Process", "Start")``."""
    return f"/{service}/{method}"


def unary_request(
    path: str,
    message: bytes,
    *,
    timeout_ms: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Request:
    """A unary call: the body is the bare JSON message."""
    h = _base_headers(timeout_ms, headers)
    h["content-type"] = CONTENT_TYPE_UNARY_JSON
    return Request(path, h, message)


def stream_request(
    path: str,
    message: bytes,
    *,
    timeout_ms: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> Request:
    """A server-streaming call: the body is exactly one envelope."""
    h = _base_headers(timeout_ms, headers)
    h["content-type"] = CONTENT_TYPE_STREAM_JSON
    h["connect-accept-encoding"] = "identity"
    h["connect-content-encoding"] = "identity"
    return Request(path, h, encode_envelope(message))


def parse_timeout_ms(value: str | None) -> float | None:
    """Seconds from a ``Connect-Timeout-Ms`` header (None when absent).

    Raises:
        ProtocolError: not 1 to 10 ASCII digits.
    """
    if value is None:
        return None
    if not (1 <= len(value) <= 10 and value.isascii() and value.isdigit()):
        raise ProtocolError(f"bad Connect-Timeout-Ms: {value!r}")
    return int(value) / 1000.0


# --- errors ----------------------------------------------------------------------------------


def code_for_http_status(status: int) -> str:
    """The Connect code for a non-Connect HTTP error status."""
    return _HTTP_TO_CODE.get(status, "unknown")


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header given in seconds (HTTP dates are ignored)."""
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def error_from_response(
    status: int,
    body: bytes,
    *,
    content_type: str | None = None,
    retry_after: str | None = None,
) -> ConnectError:
    """Turn a non-200 answer into a :class:`ConnectError`.

    A Connect server answers with JSON ``{"code", "message", "details"}``; a gateway in front of
    it (E2B's edge) answers with its own JSON (``{"sandboxId", "message", "code": 502}``) or HTML.
    The status picks the code unless the body carries a valid Connect code.
    """
    code = code_for_http_status(status)
    message = ""
    details: list[Any] = []
    ctype = (content_type or "").split(";")[0].strip().lower()
    if body and (ctype.endswith("json") or body[:1] == b"{"):
        try:
            raw = msgspec.json.decode(body)
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested too deeply
            raw = None
        if isinstance(raw, dict):
            if isinstance(raw.get("code"), str) and raw["code"] in CODE_TO_HTTP:
                code = raw["code"]
            if isinstance(raw.get("message"), str):
                message = raw["message"]
            if isinstance(raw.get("details"), list):
                details = raw["details"]
    if not message and body:
        message = body[:200].decode("utf-8", "replace").strip()
    return ConnectError(
        code,
        message,
        http_status=status,
        details=details,
        retry_after=parse_retry_after(retry_after),
    )


def encode_error(error: ConnectError) -> bytes:
    """A unary error body (a server answers it with :data:`CODE_TO_HTTP` ``[code]``)."""
    return _encoder.encode(WireError(code=error.code, message=error.message, details=error.details))
