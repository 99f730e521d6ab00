"""A tiny raw HTTP/2 client over trio (h2 library) that reports frame-level events exactly.

httpx hides which RST_STREAM code or GOAWAY last-stream-id arrived; the fault tests need them.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import trio


class StreamResult:
    """What one stream saw."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.ended = False
        self.reset_code: int | None = None
        self.done = trio.Event()
        self.first_data = trio.Event()


class H2Client:
    """One HTTP/2 connection (h2c prior knowledge, or TLS with ALPN h2)."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self._stream = stream
        self._conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self._results: dict[int, StreamResult] = {}
        self.goaway: h2.events.ConnectionTerminated | None = None
        self.closed = trio.Event()
        #: python-h2 treats any GOAWAY as the end of the connection and refuses later frames.
        self.broken = False
        self._lock = trio.Lock()

    @classmethod
    async def connect(
        cls, host: str, port: int, ssl_context: ssl.SSLContext | None = None
    ) -> H2Client:
        sock: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
            sock = trio.SSLStream(sock, ssl_context, server_hostname=host)
            await sock.do_handshake()
        client = cls(sock)
        client._conn.initiate_connection()
        await client._flush()
        return client

    async def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and not self.closed.is_set():
            async with self._lock:
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the server closed the connection; run() will see it

    async def request(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes = b""
    ) -> tuple[int, StreamResult]:
        sid = self._conn.get_next_available_stream_id()
        result = self._results[sid] = StreamResult()
        hdrs = [(":method", method), (":path", path), (":scheme", "http"), (":authority", "x")]
        hdrs += [(k.lower(), v) for k, v in headers.items()]
        self._conn.send_headers(sid, hdrs, end_stream=not body)
        if body:
            self._conn.send_data(sid, body, end_stream=True)
        await self._flush()
        return sid, result

    async def reset(self, sid: int, code: int = 8) -> None:
        self._conn.reset_stream(sid, code)
        await self._flush()

    async def run(self) -> None:
        """Read frames until the connection closes (run it in a nursery)."""
        try:
            while True:
                try:
                    data = await self._stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                if not data:
                    break
                if self.broken:
                    continue  # h2 closed its state machine (e.g. after GOAWAY): just drain
                try:
                    events = self._conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    self.broken = True
                    continue
                for event in events:
                    self._on_event(event)
                await self._flush()
        finally:
            self.closed.set()
            for r in self._results.values():
                r.done.set()

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            r = self._results[event.stream_id]
            for k, v in event.headers:
                r.headers[k.decode()] = v.decode()
            r.status = int(r.headers[":status"])
        elif isinstance(event, h2.events.DataReceived):
            r = self._results[event.stream_id]
            r.body += event.data
            r.first_data.set()
            self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            r = self._results[event.stream_id]
            r.ended = True
            r.done.set()
        elif isinstance(event, h2.events.StreamReset):
            r = self._results[event.stream_id]
            r.reset_code = int(event.error_code)
            r.done.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = event

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self._stream)
