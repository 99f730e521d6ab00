"""Minimal raw-ASGI request/response helpers (no framework: the server must stay lean)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

import msgspec

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_json = msgspec.json.Encoder()


class ClientGone(Exception):
    """The client disconnected before the request body was read."""


class Request:
    """One HTTP request as the app sees it."""

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self.receive = receive
        self._send = send
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.http_version: str = scope.get("http_version", "1.1")
        self.headers: dict[str, str] = {}
        for k, v in scope.get("headers", ()):
            self.headers[k.decode("latin-1").lower()] = v.decode("latin-1")
        self.query: dict[str, list[str]] = parse_qs(
            scope.get("query_string", b"").decode("latin-1")
        )
        self.started = False
        self.finished = False
        #: Set by the app when a proxy-applied fault should fire now (see FaultHandoff).
        self.fault_trigger: Any = None

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None

    async def body(self, limit: int = 1 << 30) -> bytes:
        """The whole request body.

        Raises:
            ClientGone: the client disconnected first.
        """
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                raise ClientGone
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ValueError("request body too large")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    async def wait_disconnect(self) -> None:
        """Return when the client goes away (call after the body was read)."""
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                return

    async def start(self, status: int, headers: Iterable[tuple[str, str]] = ()) -> None:
        self.started = True
        await self._send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
            }
        )

    async def write(self, data: bytes, *, more: bool = True) -> None:
        if not more:
            self.finished = True
        await self._send({"type": "http.response.body", "body": data, "more_body": more})

    async def respond(
        self, status: int, body: bytes = b"", headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        hdrs = list(headers)
        hdrs.append(("content-length", str(len(body))))
        await self.start(status, hdrs)
        await self.write(body, more=False)

    async def respond_json(
        self, status: int, value: Any, headers: Iterable[tuple[str, str]] = ()
    ) -> None:
        await self.respond(
            status, _json.encode(value), [("content-type", "application/json"), *headers]
        )
