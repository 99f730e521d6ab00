"""A lean HTTP/2 server for the envd ASGI app: one reader task per connection, coalesced writes.

hypercorn's HTTP/2 connection awaits on every frame event (a bounded memory-channel send per
request body, a lock per socket write, a drain per response end), and in trio each such await
is a trip through the scheduler. With a thousand open streams every trip waits for every other
runnable task, so a connection's unread requests pile up in its socket (tens of KB seen in
``ss``) and a reply ready in the app reached the client seconds later, while neither event loop
was late by more than ~0.2 s. The client under test then looked slow for the server's queueing.

Here the reader handles a whole read's events without awaiting (bodies are queued, the app's
``receive`` is woken), and a writer task per connection sends everything h2 has buffered in one
write, so replies of many streams ready in the same scheduling round leave in one TLS record
batch. Only HTTP/2 over TLS (ALPN ``h2``) is served this way; other connections go to hypercorn
(see :func:`._hypercorn.serve_connections`). No fault injection here: the fault proxy stays in
front of hypercorn. Used by the synthetic benchmark server (``lean=True``).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Final
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

_log = logging.getLogger("trio_swe.testing")

_READ: Final = 256 * 1024
#: Our receive windows (stream and connection): request bodies never wait for credit.
_WINDOW: Final = 16 * 1024 * 1024
_DISCONNECT: Final = {"type": "http.disconnect"}


class _Stream:
    """One request: its body queue and what the app may wait for."""

    __slots__ = ("body", "body_done", "closed", "delivered", "ended", "id", "started", "wake")

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.body: list[bytes] = []
        self.body_done = False
        self.delivered = False  # the last body message went to the app
        self.started = False  # response headers sent
        self.ended = False  # response ended (END_STREAM sent)
        self.closed = False  # reset by the peer, or the connection is gone
        self.wake: trio.Event | None = None

    def notify(self) -> None:
        if self.wake is not None:
            self.wake.set()
            self.wake = None


class _Connection:
    def __init__(
        self,
        stream: trio.SSLStream[Any],
        app: Any,
        max_streams: int,
        server: tuple[str, int],
        client: tuple[str, int],
    ) -> None:
        self._sock = stream
        self._app = app
        self._server = server
        self._client = client
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self._h2 = h2.connection.H2Connection(config=config)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 1 << 16,
            },
        )
        self._streams: dict[int, _Stream] = {}
        self._want_write = trio.Event()
        self._window = trio.Event()  # set (then replaced) when the peer grants credit
        self._closed = False
        self._nursery: trio.Nursery | None = None

    # --- the connection ------------------------------------------------------------------

    async def run(self) -> None:
        h = self._h2
        h.initiate_connection()
        h.increment_flow_control_window(_WINDOW)
        self._want_write.set()
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._writer)
            try:
                while not self._closed:
                    data = await self._sock.receive_some(_READ)
                    if not data:
                        break
                    try:
                        events = h.receive_data(data)
                    except h2.exceptions.ProtocolError as exc:
                        _log.debug("lean h2 server: protocol error %r", exc)
                        break
                    for ev in events:
                        self._on_event(ev)
                    self._want_write.set()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            finally:
                self._close()
                # Apps see http.disconnect and end on their own (as under hypercorn); the
                # writer has nothing left to say.
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(self._sock)

    def _close(self) -> None:
        self._closed = True
        for st in self._streams.values():
            st.closed = True
            st.notify()
        self._credit()
        self._want_write.set()

    def _credit(self) -> None:
        """Wake every app task waiting for flow-control credit (they re-check their window)."""
        self._window.set()
        self._window = trio.Event()

    async def _writer(self) -> None:
        h = self._h2
        while True:
            await self._want_write.wait()
            self._want_write = trio.Event()
            data = h.data_to_send()
            if data:
                try:
                    await self._sock.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    self._close()
                    return
            if self._closed:
                return

    def _on_event(self, ev: h2.events.Event) -> None:
        h = self._h2
        if isinstance(ev, h2.events.RequestReceived):
            st = _Stream(ev.stream_id)
            self._streams[ev.stream_id] = st
            assert self._nursery is not None
            self._nursery.start_soon(self._serve, st, self._scope(ev.headers or []))
        elif isinstance(ev, h2.events.DataReceived):
            st2 = self._streams.get(ev.stream_id)
            if ev.flow_controlled_length:
                try:
                    h.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                except h2.exceptions.ProtocolError:
                    pass  # the stream is closed: h2 credited the connection itself
            if st2 is not None and ev.data:
                st2.body.append(ev.data)
                st2.notify()
        elif isinstance(ev, h2.events.StreamEnded):
            st3 = self._streams.get(ev.stream_id)
            if st3 is not None:
                st3.body_done = True
                st3.notify()
        elif isinstance(ev, h2.events.StreamReset):
            st4 = self._streams.pop(ev.stream_id, None)
            if st4 is not None:
                st4.closed = True
                st4.notify()
            self._credit()
        elif isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._credit()
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self._closed = True  # the peer's GOAWAY: serve no more (it closes the socket)

    def _scope(self, raw: list[tuple[bytes, bytes]]) -> dict[str, Any]:
        headers: list[tuple[bytes, bytes]] = []
        method = b"GET"
        target = b"/"
        scheme = b"https"
        for name, value in raw:
            if name[:1] == b":":
                if name == b":method":
                    method = value
                elif name == b":path":
                    target = value
                elif name == b":scheme":
                    scheme = value
                elif name == b":authority":
                    headers.append((b"host", value))
            else:
                headers.append((name, value))
        raw_path, _, query = target.partition(b"?")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "method": method.decode("ascii").upper(),
            "scheme": scheme.decode("ascii"),
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": headers,
            "server": self._server,
            "client": self._client,
        }

    # --- one request -------------------------------------------------------------------

    async def _serve(self, st: _Stream, scope: dict[str, Any]) -> None:
        async def receive() -> dict[str, Any]:
            while True:
                if st.body or (st.body_done and not st.delivered):
                    chunk = b"".join(st.body) if len(st.body) != 1 else st.body[0]
                    st.body.clear()
                    more = not st.body_done
                    st.delivered = not more
                    return {"type": "http.request", "body": chunk, "more_body": more}
                if st.closed or st.ended or self._closed:
                    return _DISCONNECT
                st.wake = event = trio.Event()
                await event.wait()

        async def send(message: dict[str, Any]) -> None:
            await self._send(st, message)

        try:
            await self._app(scope, receive, send)
        except Exception as exc:
            _log.debug("lean h2 server: app failed on stream %d: %r", st.id, exc)
        finally:
            self._finish(st)

    async def _send(self, st: _Stream, message: dict[str, Any]) -> None:
        if st.closed or st.ended or self._closed:
            return  # the client is gone: nothing to say (hypercorn ignores it too)
        h = self._h2
        kind = message["type"]
        try:
            if kind == "http.response.start":
                block = [(b":status", str(message["status"]).encode())]
                block += [(k.lower(), v) for k, v in message.get("headers", ())]
                h.send_headers(st.id, block)
                st.started = True
            elif kind == "http.response.body":
                data = message.get("body", b"")
                more = message.get("more_body", False)
                view = memoryview(data)
                while len(view):
                    window = min(h.local_flow_control_window(st.id), h.max_outbound_frame_size)
                    if window <= 0:
                        self._want_write.set()
                        await self._window.wait()
                        if st.closed or self._closed:
                            return
                        continue
                    last = len(view) <= window
                    h.send_data(st.id, view[:window].tobytes(), end_stream=last and not more)
                    view = view[window:]
                if not more:
                    if not data:
                        h.end_stream(st.id)
                    st.ended = True
                    self._streams.pop(st.id, None)
                    st.notify()
            else:
                return
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError, KeyError):
            st.closed = True
            return
        self._want_write.set()

    def _finish(self, st: _Stream) -> None:
        """The app returned: whatever it left unsaid becomes a 500 or a reset."""
        self._streams.pop(st.id, None)
        if st.closed or st.ended or self._closed:
            return
        h = self._h2
        try:
            if not st.started:
                h.send_headers(st.id, [(b":status", b"500"), (b"content-length", b"0")], True)
            else:
                h.reset_stream(st.id, h2.errors.ErrorCodes.INTERNAL_ERROR)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass
        st.ended = True
        self._want_write.set()


async def serve_h2(
    stream: trio.SSLStream[Any], app: Any, *, max_streams: int, stats: Counter[str]
) -> None:
    """Serve ``app`` on one TLS connection whose ALPN chose ``h2`` (handshake done)."""
    sock = stream.transport_stream.socket
    server = sock.getsockname()[:2]
    client = sock.getpeername()[:2]
    stats["lean_connections"] += 1
    await _Connection(stream, app, max_streams, server, client).run()
