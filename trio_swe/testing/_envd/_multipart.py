"""A small ``multipart/form-data`` parser for envd's ``POST /files`` (sans-IO)."""

from __future__ import annotations

from email.message import Message

import msgspec


class Part(msgspec.Struct, frozen=True):
    """One form part: its field name, its filename (if any) and its bytes."""

    name: str
    filename: str | None
    data: bytes


class MultipartError(ValueError):
    """The body is not well-formed ``multipart/form-data``."""


def boundary_of(content_type: str) -> str:
    """The ``boundary`` parameter of a ``multipart/form-data`` content type.

    Raises:
        MultipartError: it has none.
    """
    msg = Message()
    msg["content-type"] = content_type
    boundary = msg.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise MultipartError("multipart content type without a boundary")
    return boundary


def _disposition(raw_headers: bytes) -> tuple[str, str | None]:
    msg = Message()
    for line in raw_headers.split(b"\r\n"):
        if b":" in line:
            key, _, value = line.partition(b":")
            msg[key.decode("latin-1").strip()] = value.decode("utf-8", "replace").strip()
    if msg.get("content-disposition") is None:
        raise MultipartError("part without Content-Disposition")
    name = msg.get_param("name", header="content-disposition")
    filename = msg.get_param("filename", header="content-disposition")
    return (
        name if isinstance(name, str) else "",
        filename if isinstance(filename, str) else None,
    )


def parse_multipart(body: bytes, boundary: str) -> list[Part]:
    """Split a whole ``multipart/form-data`` body into parts.

    Raises:
        MultipartError: the body does not follow RFC 7578 framing.
    """
    delim = b"--" + boundary.encode("latin-1")
    start = body.find(delim)
    if start < 0:
        raise MultipartError("boundary not found in body")
    parts: list[Part] = []
    pos = start + len(delim)
    while True:
        if body.startswith(b"--", pos):
            return parts  # closing delimiter
        if not body.startswith(b"\r\n", pos):
            raise MultipartError("malformed delimiter line")
        pos += 2
        head_end = body.find(b"\r\n\r\n", pos)
        if head_end < 0:
            raise MultipartError("part headers not terminated")
        name, filename = _disposition(body[pos:head_end])
        data_start = head_end + 4
        nxt = body.find(b"\r\n" + delim, data_start)
        if nxt < 0:
            raise MultipartError("part not terminated by a boundary")
        parts.append(Part(name, filename, body[data_start:nxt]))
        pos = nxt + 2 + len(delim)
