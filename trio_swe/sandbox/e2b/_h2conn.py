"""A purpose-built HTTP/2 client for envd's few routes: connections and streams over trio, on
the sans-IO frame layer of :mod:`._h2frames`.

Why not httpx here: per short ``exec`` its client layers, httpcore's pool and the cancel scopes
of httpcore's trio backend cost more client CPU than the whole HTTP/2 work (see
``python -m bench e2b`` with ``TRIO_SWE_BENCH_PROFILE=1``), and httpcore never resets a stream
it stops reading, nor lets earlier streams finish after a graceful GOAWAY. This module keeps
the HTTP/2 rules and drops the rest:

* :class:`H2Connection`: one system task per connection reads the socket, feeds the bytes to
  :class:`~._h2frames.ClientConnection` and wakes the streams its calls name (no lock dance);
* writes go straight to the socket; only what it does not take at once is finished by a system
  task, in order, bounded by ``WRITE_BOUND_SEC`` of no progress, so a begun write completes
  whoever is cancelled (the guarantee of :class:`~._httpxpool.WholeWrites`);
* :class:`H2Stream`: one request and its response; waits take a deadline (no cancel scope per
  wait), served by one timer task per trio run (:class:`_Timers`); a stream closed before its
  end sends ``RST_STREAM(CANCEL)`` and its unread DATA is credited back to the connection window;
* a GOAWAY stops new streams on the connection; streams at or below its last-stream-id run to
  their end, the others fail as never processed (retry-safe);
* liveness: a connection silent for ``ping_interval`` gets a PING, and one that hears nothing
  for ``ping_timeout`` after it is failed with all its streams; :meth:`H2Connection.sync` (a
  PING answered after every frame sent before it) lets a silent stream tell a slow peer from a
  dead one;
* request headers are HPACK-encoded without the dynamic table (:class:`StatelessEncoder`), so
  each header's bytes are computed once and reused (a sandbox's routing headers repeat on every
  request);
* the socket is read and written directly, and TLS runs through ``ssl.SSLObject`` and memory
  BIOs, waiting only when a call would block (the byte streams of :mod:`._h2io`).

Failures are raised as httpx's exception types (:class:`H2StreamReset` and
:class:`H2ConnectionTerminated` carry an h2 event, as httpcore's do), so the one retry table
(:mod:`._retry`) classifies both transports alike.
"""

from __future__ import annotations

import heapq
import math
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

import h2.errors
import h2.events
import httpx
import outcome
import trio
from hpack.hpack import encode_integer
from hpack.table import HeaderTable

from . import _h2frames
from ._h2frames import ClientConnection, H2ProtocolError, TooManyStreams
from ._h2io import RAW_SOCKETS, READ_SIZE, RawSocketStream, TLSStream, readable

#: Bound on one socket write that must not be interrupted (as ``_httpxpool.WRITE_BOUND_SEC``).
WRITE_BOUND_SEC: Final = 30.0
#: Connection-level receive window (per-stream windows stay at the default 65,535).
_CONNECTION_WINDOW: Final = 16 * 1024 * 1024
#: Stream ids are 31 bits; a connection this far along takes no new streams.
_MAX_STREAM_ID: Final = 2**31 - 1 - 2 * 1024


class H2StreamReset(httpx.RemoteProtocolError):
    """The peer reset our stream (``args[0]`` is h2's ``StreamReset`` event)."""

    def __init__(self, event: h2.events.StreamReset) -> None:
        super().__init__(event)  # type: ignore[arg-type]  # httpcore passes h2 events too
        self.event = event

    def __str__(self) -> str:
        return f"<StreamReset stream_id:{self.event.stream_id}, error_code:{self.event.error_code}>"


class H2ConnectionTerminated(httpx.RemoteProtocolError):
    """A GOAWAY ended the connection for this stream (``args[0]``: h2's event)."""

    def __init__(self, event: h2.events.ConnectionTerminated) -> None:
        super().__init__(event)  # type: ignore[arg-type]  # httpcore passes h2 events too
        self.event = event

    def __str__(self) -> str:
        return (
            f"<ConnectionTerminated error_code:{self.event.error_code}, "
            f"last_stream_id:{self.event.last_stream_id}>"
        )


class H2NotNegotiated(Exception):
    """TLS ALPN did not select ``h2``: envd on ``https://`` is spoken to in HTTP/2 only (E2B's
    edge offers it; HTTP/1.1 goes over httpx on a plain ``http://`` origin)."""


# --- HPACK without the dynamic table -------------------------------------------------------

_STATIC_FULL: dict[tuple[bytes, bytes], int] = {}
_STATIC_NAME: dict[bytes, int] = {}
for _i, (_n, _v) in enumerate(HeaderTable.STATIC_TABLE, start=1):
    _STATIC_FULL.setdefault((_n, _v), _i)
    _STATIC_NAME.setdefault(_n, _i)


def _literal(name: bytes, value: bytes) -> bytes:
    """One header as a stateless representation: static index, or a literal not indexed."""
    full = _STATIC_FULL.get((name, value))
    if full is not None:
        out = encode_integer(full, 7)
        out[0] |= 0x80
        return bytes(out)
    idx = _STATIC_NAME.get(name)
    if idx is not None:
        head = encode_integer(idx, 4)  # 0000xxxx: literal without indexing, indexed name
    else:
        head = bytearray(b"\x00") + encode_integer(len(name), 7) + name
    return bytes(head + encode_integer(len(value), 7) + value)


class StatelessEncoder:
    """HPACK encoder that never uses the dynamic table, with a cache per header.

    The first block starts with a table size update to 0, so whatever the peer's
    ``SETTINGS_HEADER_TABLE_SIZE`` the table we use is within it. h2 calls :meth:`encode`
    and sets :attr:`header_table_size`; nothing else of ``hpack.Encoder`` is used.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[bytes, bytes], bytes] = {}
        self._first = True
        self.header_table_size = 4096

    def encode(self, headers: Iterable[Any], huffman: bool = True, *, first: bool = True) -> bytes:
        """A header block; the very first one (unless ``first=False``) starts with the size
        update to 0 (the caller of ``first=False`` sends that itself)."""
        cache = self._cache
        parts = [b"\x20"] if self._first and first else []
        if first:
            self._first = False
        for header in headers:
            key = (header[0], header[1])
            enc = cache.get(key)
            if enc is None:
                if len(cache) > 4096:
                    cache.clear()
                enc = cache[key] = _literal(*key)
            parts.append(enc)
        return b"".join(parts)

    def encode_one(self, name: bytes, value: bytes) -> bytes:
        """One header's representation (cached)."""
        key = (name, value)
        enc = self._cache.get(key)
        if enc is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            enc = self._cache[key] = _literal(name, value)
        return enc


# --- deadlines of stream waits, without a cancel scope per wait -----------------------------

#: Deadlines are kept in buckets of this many seconds (rounded up: a wait never ends early).
_TIMER_TICK: Final = 1 / 16


class _Timers:
    """Ends stream waits at their deadlines: one system task per trio run.

    A trio cancel scope per wait (enter, register, exit) cost more than the HTTP/2 work of a
    short exec. Here a wait with a deadline appends itself to the deadline's bucket; the task
    sleeps until the earliest bucket and expires the waits in it that are still on (a wait that
    ended meanwhile is skipped: its serial no longer matches).
    """

    def __init__(self) -> None:
        self._buckets: dict[int, list[tuple[int, H2Stream]]] = {}
        self._heap: list[int] = []
        self._target = math.inf
        self._scope: trio.CancelScope | None = None
        self._running = False
        self.serial = 0

    def add(self, deadline: float, stream: H2Stream) -> int:
        self.serial += 1
        key = math.ceil(deadline / _TIMER_TICK)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = []
            heapq.heappush(self._heap, key)
            at = key * _TIMER_TICK
            if at < self._target:
                self._target = at
                if not self._running:
                    self._running = True
                    trio.lowlevel.spawn_system_task(self._run, name="h2 stream deadlines")
                elif self._scope is not None:
                    self._scope.deadline = at
        bucket.append((self.serial, stream))
        return self.serial

    async def _run(self) -> None:
        heap, buckets = self._heap, self._buckets
        while True:
            now = trio.current_time()
            while heap and heap[0] * _TIMER_TICK <= now:
                for serial, stream in buckets.pop(heapq.heappop(heap)):
                    stream._expire(serial)
            self._target = heap[0] * _TIMER_TICK if heap else math.inf
            with trio.CancelScope(deadline=self._target) as self._scope:
                await trio.sleep_forever()
            self._scope = None


_timers_var: trio.lowlevel.RunVar[_Timers] = trio.lowlevel.RunVar("trio_swe_h2_timers")


def _timers() -> _Timers:
    try:
        return _timers_var.get()
    except LookupError:
        timers = _Timers()
        _timers_var.set(timers)
        return timers


# --- one stream ----------------------------------------------------------------------------


class H2Stream:
    """One request/response exchange. Read with :meth:`receive`; always :meth:`aclose` it."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_ended",
        "_error",
        "_headers",
        "_news",
        "_sent_all",
        "_wait_serial",
        "_waiter",
        "status",
        "stream_id",
    )

    def __init__(self, conn: H2Connection, stream_id: int) -> None:
        self._conn = conn
        self.stream_id = stream_id
        self.status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[tuple[bytes, int]] = deque()
        self._ended = False
        self._sent_all = False  # our END_STREAM went into h2's buffer
        self._error: BaseException | None = None
        self._waiter: trio.lowlevel.Task | None = None
        self._wait_serial = 0  # the deadline entry (_Timers) of the wait on now, 0 for none
        self._news = 0  # frames (or the connection's failure) seen for this stream

    #: :meth:`silent_since` proves a silence (the :class:`~._fetch.Exchange` flag).
    confirms_silence: Final = True

    @property
    def news(self) -> int:
        """A count that grows with every frame received for this stream, and on failure."""
        return self._news

    async def silent_since(self, news: int, sent_after: float = -math.inf) -> bool:
        """True when nothing arrived for this stream since :attr:`news` was ``news``, although
        the connection has read everything the peer sent before a PING sent at or after
        ``sent_after`` (see :meth:`H2Connection.sync`); False when something did (read again).
        """
        if self._news == news:
            await self._conn.sync(sent_after)
        return self._news == news

    def header(self, name: str) -> str | None:
        """The first response header called ``name`` (lowercase), decoded as latin-1."""
        key = name.encode()
        for k, v in self._headers:
            if k == key:
                return v.decode("latin-1")
        return None

    def _wake(self) -> None:
        self._news += 1
        task = self._waiter
        if task is not None:
            self._waiter = None
            trio.lowlevel.reschedule(task)

    def _expire(self, serial: int) -> None:
        task = self._waiter
        if task is not None and serial == self._wait_serial:
            self._waiter = None
            trio.lowlevel.reschedule(task, outcome.Value(False))

    async def _wait(self, deadline: float = math.inf, shield: bool = False) -> bool:
        """Wait for news (True) or ``deadline`` (False). ``shield``: cancellation does not end
        the wait (it takes effect at the caller's next checkpoint), as a shielded scope."""
        self._waiter = trio.lowlevel.current_task()
        self._wait_serial = _timers().add(deadline, self) if deadline < math.inf else 0

        def abort(_: Any) -> trio.lowlevel.Abort:
            if shield:
                return trio.lowlevel.Abort.FAILED
            self._waiter = None
            return trio.lowlevel.Abort.SUCCEEDED

        woken: bool | None = await trio.lowlevel.wait_task_rescheduled(abort)
        return woken is not False

    async def receive_headers(self, deadline: float = math.inf, *, shield: bool = False) -> bool:
        """Wait for the response headers (``status`` is set then); False when ``deadline``
        passed first. ``shield``: cancellation does not interrupt the wait."""
        while not self.status:
            if self._error is not None:
                raise self._error
            if deadline < math.inf and trio.current_time() >= deadline:
                return False
            await self._wait(deadline, shield)
        if not shield:
            await trio.lowlevel.checkpoint_if_cancelled()
        return True

    async def receive_by(self, deadline: float, *, shield: bool = False) -> bytes | None:
        """The next chunk of the response body, ``b""`` at its end; None when ``deadline``
        passed first. ``shield``: cancellation does not interrupt the wait."""
        while True:
            if self._chunks:
                data, flow = self._chunks.popleft()
                self._conn._consumed(self.stream_id, flow)
                if not shield:
                    await trio.lowlevel.checkpoint_if_cancelled()
                return data
            if self._ended:
                if not shield:
                    await trio.lowlevel.checkpoint_if_cancelled()
                return b""
            if self._error is not None:
                raise self._error
            if deadline < math.inf and trio.current_time() >= deadline:
                return None
            await self._wait(deadline, shield)

    async def receive(self) -> bytes:
        """The next chunk of the response body; ``b""`` at its end."""
        chunk = await self.receive_by(math.inf)
        assert chunk is not None
        return chunk

    def receive_nowait(self) -> bytes | None:
        """A chunk already received (``b""`` at the end), or None when one must be awaited."""
        if self._chunks:
            data, flow = self._chunks.popleft()
            self._conn._consumed(self.stream_id, flow)
            return data
        if self._ended:
            return b""
        return None

    async def read_all(self) -> bytes:
        parts = []
        while chunk := await self.receive():
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        """Forget the stream; reset it if the response did not end (no await, no checkpoint)."""
        self._conn._close_stream(self)

    async def aclose(self) -> None:
        self.close()
        await self._conn.flush_soon()


# --- one connection ------------------------------------------------------------------------


class H2Connection:
    """One HTTP/2 connection to ``host:port`` (TLS with ALPN ``h2``, or h2c).

    ``connect`` replaces opening the TCP (and TLS) stream, e.g. with a memory stream in tests;
    ``connection_window`` is the connection-level receive window we grant. Liveness: a
    connection that heard nothing for ``ping_interval`` gets a PING; one that hears nothing at
    all for ``ping_timeout`` (default: ``ping_interval``) after a PING is failed.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        authority: str,
        base_headers: Sequence[tuple[bytes, bytes]] = (),
        connect_timeout: float = 10.0,
        ping_interval: float = 30.0,
        ping_timeout: float | None = None,
        connection_window: int = _CONNECTION_WINDOW,
        connect: Callable[[], Awaitable[trio.abc.Stream]] | None = None,
    ) -> None:
        self._host = host
        self._window = connection_window
        self._connect = connect
        self._port = port
        self._tls = tls
        self._connect_timeout = connect_timeout
        self._ping_interval = ping_interval
        # Request header blocks: the size update to 0 (first block only), then :method, the
        # fixed pseudo-headers, :path, the fixed headers, the request's own; all but the
        # request's own encoded once.
        self._encoder = StatelessEncoder()
        self._first_block = True
        self._prefix_block = self._encoder.encode(
            [
                (b":scheme", b"https" if tls is not None else b"http"),
                (b":authority", authority.encode()),
            ],
            first=False,
        )
        self._base_block = self._encoder.encode(list(base_headers), first=False)
        self._h2 = ClientConnection(self, connection_window=connection_window)
        self._stream: trio.abc.Stream | None = None
        self._streams: dict[int, H2Stream] = {}
        self._connecting: trio.Event | None = None
        self._writing = False
        self._error: BaseException | None = None  # the connection failed: every op raises it
        self._goaway: h2.events.ConnectionTerminated | None = None
        self._window_waiters = trio.lowlevel.ParkingLot()
        self._ping_timeout = ping_interval if ping_timeout is None else ping_timeout
        #: When the reader last got bytes from the peer (``trio.current_time()``).
        self.heard_at = -math.inf
        #: When the oldest PING not followed by any frame was sent (None: none is).
        self._ping_sent_at: float | None = None
        #: Sync PINGs in flight: opaque data -> (sent at, set on its ack or on failure).
        self._syncs: dict[bytes, tuple[float, trio.Event]] = {}
        self._sync_serial = 0
        self._reader_scope: trio.CancelScope | None = None
        self._written: trio.Event | None = None  # set when the writer (if any) is done
        self._reader_task: trio.lowlevel.Task | None = None
        self._closed = False
        self._idle_event: trio.Event | None = None

    # --- state seen by the pool --------------------------------------------------------

    @property
    def usable(self) -> bool:
        """True while new streams may go on this connection."""
        return (
            self._error is None
            and self._goaway is None
            and not self._closed
            and self._h2.highest_stream_id < _MAX_STREAM_ID
        )

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # --- connecting ----------------------------------------------------------------------

    async def _ensure_connected(self) -> None:
        if self._stream is not None:
            return
        if self._error is not None:
            raise self._error
        if self._connecting is not None:
            await self._connecting.wait()
            if self._error is not None:
                raise self._error
            return
        self._connecting = trio.Event()
        try:
            self._stream = await (self._connect or self._open)()
            self._h2.initiate()
            self._reader_task = trio.lowlevel.spawn_system_task(
                self._read_loop, name=f"h2 reader {self._host}"
            )
            self._flush()
        except BaseException as exc:
            if self._error is None:
                self._error = exc if isinstance(exc, Exception) else httpx.ConnectError(repr(exc))
            if self._stream is not None:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(self._stream)
            raise
        finally:
            self._connecting.set()

    async def _open(self) -> trio.abc.Stream:
        try:
            with trio.fail_after(self._connect_timeout):
                tcp = await trio.open_tcp_stream(self._host, self._port)
                sock: trio.abc.Stream = RawSocketStream(tcp) if RAW_SOCKETS else tcp
                if self._tls is None:
                    return sock
                stream = TLSStream(sock, self._tls, self._host)
                try:
                    await stream.do_handshake()
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
        except trio.TooSlowError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self._host}:{self._port}") from exc
        except (OSError, trio.BrokenResourceError) as exc:
            raise httpx.ConnectError(f"connecting to {self._host}:{self._port}: {exc!r}") from exc
        if stream.selected_alpn_protocol() != "h2":
            await trio.aclose_forcefully(stream)
            raise H2NotNegotiated(
                f"{self._host}:{self._port} did not negotiate HTTP/2 over TLS (ALPN "
                f"{stream.selected_alpn_protocol()!r}): envd on https:// must speak HTTP/2"
            )
        return stream

    # --- requests ----------------------------------------------------------------------

    async def request(
        self,
        method: bytes,
        path: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes | None,
    ) -> H2Stream:
        """Send one request; returns its stream once the request is handed to the socket.

        The body is sent within the peer's flow-control windows (waiting for credit when it
        is larger). Wait for the response with :meth:`H2Stream.receive_headers`.
        """
        await self._ensure_connected()
        stream, rest = self.request_nowait(method, path, headers, body)
        if rest:
            h = self._h2
            sid = stream.stream_id
            try:
                while rest:
                    if h.send_window_of(sid) <= 0:
                        self._flush()
                        await self._wait_window(stream)
                        continue
                    rest = rest[h.send_data(sid, rest, end_stream=True) :]
                stream._sent_all = True
            except BaseException:
                self._close_stream(stream)
                raise
            self._flush()
        return stream

    @property
    def connected(self) -> bool:
        return self._stream is not None

    def fits(self, body: bytes | None) -> bool:
        """True when a new stream's ``body`` fits in the send windows now."""
        return not body or len(body) <= min(self._h2.send_window, self._h2.initial_send_window)

    def request_nowait(
        self,
        method: bytes,
        path: bytes,
        headers: Iterable[tuple[bytes, bytes]],
        body: bytes | None,
    ) -> tuple[H2Stream, memoryview]:
        """Send one request on a connected connection, as much of its body as the windows
        allow, without waiting; returns the stream and the rest of the body (to send as the
        windows open: :meth:`request` does)."""
        if self._error is not None:
            raise self._error
        if self._stream is None:
            raise RuntimeError("request_nowait on a connection not connected")
        if not self.usable:
            # A GOAWAY arrived since the pool picked us: provably never sent.
            raise httpx.ConnectError("the connection is closing (GOAWAY); not sent")
        h = self._h2
        enc = self._encoder.encode_one
        block = b"".join(
            (
                b"\x20" if self._first_block else b"",
                enc(b":method", method),
                self._prefix_block,
                enc(b":path", path),
                self._base_block,
                self._encoder.encode(headers, first=False),
            )
        )
        try:
            sid = h.open_stream(block, end_stream=not body)
        except TooManyStreams as exc:
            raise httpx.LocalProtocolError(str(exc)) from exc
        self._first_block = False
        stream = H2Stream(self, sid)
        self._streams[sid] = stream
        rest = memoryview(body or b"")
        if rest and h.send_window_of(sid) > 0:
            rest = rest[h.send_data(sid, rest, end_stream=True) :]
        stream._sent_all = not rest
        self._flush()
        return stream, rest

    async def _wait_window(self, stream: H2Stream) -> None:
        if stream._error is not None:
            raise stream._error
        if self._error is not None:
            raise self._error
        await self._window_waiters.park()

    def _consumed(self, stream_id: int, flow: int) -> None:
        """A reader took (or we dropped) ``flow`` bytes: credit them, and send the credit now
        (a peer that filled the window waits for it; the reader task sends its own after a
        read)."""
        if flow and self._error is None:
            self._h2.consumed(stream_id, flow)
            # A WINDOW_UPDATE it queued goes out now: a peer that filled the window waits for
            # it, and nothing else may be written on this connection for a long time.
            if trio.lowlevel.current_task() is not self._reader_task:
                self._flush()

    def _close_stream(self, stream: H2Stream) -> None:
        sid = stream.stream_id
        if self._streams.pop(sid, None) is None:
            return
        # Unread DATA still counts against the connection window: credit it back.
        unread = sum(flow for _, flow in stream._chunks)
        stream._chunks.clear()
        if self._error is None:
            if (not stream._ended or not stream._sent_all) and stream._error is None:
                self._h2.reset_stream(sid, _h2frames.CANCEL)  # a no-op if it is closed already
            if unread:
                self._h2.consumed(sid, unread)
        if not self._streams and self._idle_event is not None:
            self._idle_event.set()

    # --- writing -------------------------------------------------------------------------

    async def flush_soon(self) -> None:
        """Write pending frames (RST_STREAM, WINDOW_UPDATE); quiet if the connection failed."""
        self._flush()

    def _flush(self) -> None:
        """Hand the frame layer's bytes to the socket without waiting.

        What the socket does not take at once is written by a system task (the writer), so a
        begun write always completes, whoever asked for it is cancelled (the guarantee of
        :class:`~._httpxpool.WholeWrites`), bounded by ``WRITE_BOUND_SEC`` of no progress; while it
        runs, later frames queue behind it in order. A failed write fails the connection.
        """
        if self._writing or self._error is not None:
            return  # the writer loops until the buffer is empty, these bytes included
        stream = self._stream
        if stream is None:
            return
        data = self._h2.data_to_send()
        if not data:
            return
        first: bytes | None = data
        try_send = getattr(stream, "try_send", None)
        if try_send is not None:
            try:
                if try_send(data):
                    return
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._write_failed(exc)
                return
            first = None  # the stream kept the rest
        self._writing = True
        trio.lowlevel.spawn_system_task(self._write_behind, stream, first)

    async def _write_behind(self, stream: trio.abc.Stream, first: bytes | None) -> None:
        try:
            with trio.CancelScope(deadline=trio.current_time() + WRITE_BOUND_SEC) as scope:
                if first is None:
                    await stream.send_rest()  # type: ignore[attr-defined]
                else:
                    await stream.send_all(first)
                while data := self._h2.data_to_send():
                    scope.deadline = trio.current_time() + WRITE_BOUND_SEC
                    await stream.send_all(data)
            if scope.cancelled_caught:
                self._fail(
                    httpx.WriteTimeout(f"a socket write did not complete in {WRITE_BOUND_SEC:g} s")
                )
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._write_failed(exc)
        except Exception as exc:  # a bug must not kill the run from a system task
            self._fail(httpx.WriteError(f"HTTP/2 writer failed: {exc!r}"))
        finally:
            self._writing = False
            if self._written is not None:
                self._written.set()

    def _write_failed(self, exc: BaseException) -> None:
        if not self._closed:
            err = httpx.WriteError(f"writing to {self._host}: {exc!r}")
            err.__cause__ = exc
            self._fail(err)

    # --- reading -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        stream = self._stream
        assert stream is not None
        self.heard_at = trio.current_time()
        grace = -math.inf
        try:
            while not self._closed:
                deadline = max(self._liveness_deadline(), grace)
                with trio.CancelScope(deadline=deadline) as scope:
                    self._reader_scope = scope
                    while True:
                        data = await stream.receive_some(READ_SIZE)
                        if not data:
                            raise httpx.RemoteProtocolError("Server disconnected")
                        self.heard_at = trio.current_time()
                        self._ping_sent_at = None  # any frame proves the peer alive
                        self._h2.receive(bytes(data))
                        self._flush()
                        if self._closed:
                            return
                self._reader_scope = None
                if not scope.cancelled_caught or trio.current_time() < self._liveness_deadline():
                    continue  # (the scope's deadline is not moved per read: when it fires
                    # after the peer was heard from, the loop starts a new one)
                if readable(stream):
                    # The timer won a race with the peer's bytes (a late-running loop): read
                    # them before judging the peer.
                    grace = trio.current_time() + 1.0
                    continue
                grace = -math.inf
                if self._ping_sent_at is None:
                    self._send_ping(b"trio-swe")
                    self._flush()
                elif trio.current_time() >= self._ping_sent_at + self._ping_timeout:
                    raise httpx.ReadError(
                        f"no answer to a PING in {self._ping_timeout:g} s: connection dead"
                    )
        except H2ProtocolError as exc:
            err = httpx.RemoteProtocolError(f"HTTP/2 protocol error from the peer: {exc}")
            err.__cause__ = exc
            self._h2.close(exc.code)
            self._flush()  # tell the peer why (best effort)
            self._fail(err)
        except httpx.HTTPError as exc:
            self._fail(exc)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if not self._closed:
                err2 = httpx.ReadError(f"reading from {self._host}: {exc!r}")
                err2.__cause__ = exc
                self._fail(err2)
        except Exception as exc:  # a bug must not kill the run from a system task
            self._fail(httpx.RemoteProtocolError(f"HTTP/2 reader failed: {exc!r}"))
        finally:
            self._reader_scope = None
            if self._error is None:
                self._fail(httpx.RemoteProtocolError("Server disconnected"))
            with trio.CancelScope(shield=True):
                await _close_quietly(stream)

    def _liveness_deadline(self) -> float:
        if self._ping_sent_at is not None:
            return self._ping_sent_at + self._ping_timeout
        return self.heard_at + self._ping_interval

    def _send_ping(self, opaque: bytes) -> None:
        self._h2.ping(opaque)
        if self._ping_sent_at is None:
            self._ping_sent_at = trio.current_time()
            if self._reader_scope is not None:
                self._reader_scope.deadline = self._liveness_deadline()

    async def sync(self, sent_after: float = -math.inf) -> None:
        """Return once everything the peer sent before now has been read.

        A PING's answer comes after every frame the peer sent before it, so this waits for the
        answer to a PING sent now (or to one in flight that was sent at or after
        ``sent_after``). Streams that are silent for long use it to tell "the stream is silent"
        from "the connection (or we, on a starved event loop) are behind": silence is then
        measured per connection, whose own liveness (:attr:`heard_at`, PING) decides whether it
        is dead. Returns at once if the connection failed (or never connected); never raises
        but for cancellation.
        """
        if self._error is not None or self._stream is None or self._closed:
            return
        waiter: trio.Event | None = None
        for at, event in self._syncs.values():
            if at >= sent_after:
                waiter = event  # a PING in flight that was sent late enough: share its answer
                break
        if waiter is None:
            self._sync_serial += 1
            opaque = b"sync" + self._sync_serial.to_bytes(4, "big")
            waiter = trio.Event()
            self._syncs[opaque] = (trio.current_time(), waiter)
            self._send_ping(opaque)
            self._flush()
        await waiter.wait()

    # --- what the frame layer reports (the _h2frames.Handler) ----------------------------

    def on_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        s = self._streams.get(stream_id)
        if s is None:
            return
        if not s.status:
            status = 0
            for k, v in headers:
                if k == b":status":
                    status = int(v) if v.isdigit() else 0
                    break
            if not status:
                s._error = httpx.RemoteProtocolError("a response without a valid :status")
            elif status < 200 and not end:
                return  # informational (1xx): the response follows
            else:
                s._headers = headers
                s.status = status
        # Later header blocks are trailers: Connect puts its trailer in the body.
        if end:
            s._ended = True
            if not s.status and s._error is None:
                s._error = httpx.RemoteProtocolError("stream ended without headers")
        s._wake()

    def on_data(self, stream_id: int, data: bytes, flow: int, end: bool) -> None:
        s = self._streams.get(stream_id)
        if s is None:
            self._consumed(stream_id, flow)  # closed by us before its end: hand it back
            return
        if data:
            s._chunks.append((data, flow))
        elif flow:  # an empty (padding) DATA frame: b"" means the body's end to readers
            self._consumed(stream_id, flow)
        if end:
            s._ended = True
            if not s.status:
                s._error = httpx.RemoteProtocolError("stream ended without headers")
        if data or end:
            s._wake()

    def on_reset(self, stream_id: int, code: int) -> None:
        s = self._streams.get(stream_id)
        if s is not None:
            event = h2.events.StreamReset(stream_id=stream_id, error_code=_error_code(code))
            s._error = H2StreamReset(event)
            s._wake()
        self._window_waiters.unpark_all()

    def on_goaway(self, last_stream_id: int, code: int, debug: bytes) -> None:
        event = h2.events.ConnectionTerminated()
        event.error_code = _error_code(code)
        event.last_stream_id = last_stream_id
        event.additional_data = debug
        self._on_goaway(event)

    def on_window(self) -> None:
        self._window_waiters.unpark_all()

    def on_ping_ack(self, data: bytes) -> None:
        done = self._syncs.pop(data, None)
        if done is not None:
            done[1].set()

    def _on_goaway(self, ev: h2.events.ConnectionTerminated) -> None:
        self._goaway = ev
        last = ev.last_stream_id or 0
        for sid, s in list(self._streams.items()):
            if sid > last or ev.error_code:
                # Above last-stream-id: never processed (retry-safe). With an error code the
                # peer closes at once: those below fail too (the table says "maybe reached").
                s._error = H2ConnectionTerminated(ev)
                s._wake()
        if ev.error_code or not self._streams:
            return

    def _fail(self, exc: BaseException) -> None:
        if self._error is not None:
            return
        self._error = exc
        goaway = self._goaway
        for s in self._streams.values():
            if s._error is None and not s._ended:
                # After a GOAWAY the connection's end is the GOAWAY's (its last-stream-id rule).
                s._error = H2ConnectionTerminated(goaway) if goaway is not None else exc
                s._wake()
        self._window_waiters.unpark_all()
        for _, event in self._syncs.values():
            event.set()
        self._syncs.clear()
        if self._idle_event is not None:
            self._idle_event.set()

    # --- closing -------------------------------------------------------------------------

    async def aclose(self, *, wait_idle: float = 0.0) -> None:
        """Close: after its streams ended (up to ``wait_idle`` s), then GOAWAY and EOF."""
        if self._closed:
            return
        if wait_idle > 0 and self._streams and self._error is None:
            self._idle_event = trio.Event()
            with trio.move_on_after(wait_idle):
                await self._idle_event.wait()
        self._closed = True
        stream = self._stream
        if stream is None:
            return
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 5.0):
            if self._error is None:
                self._h2.close()
                self._flush()
                if self._writing:
                    self._written = trio.Event()
                    await self._written.wait()
            self._fail(httpx.RemoteProtocolError("connection closed by the client"))
            await _close_quietly(stream)


async def _close_quietly(stream: trio.abc.AsyncResource) -> None:
    """Close without waiting for the peer; a socket already broken is closed all the same."""
    try:
        await trio.aclose_forcefully(stream)
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


def _error_code(code: int) -> h2.errors.ErrorCodes | int:
    try:
        return h2.errors.ErrorCodes(code)
    except ValueError:
        return code  # an unknown code is kept as its number


def split_origin(origin: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``scheme://host[:port]``."""
    url = httpx.URL(origin)
    scheme = url.scheme
    port = url.port or (443 if scheme == "https" else 80)
    return scheme, url.host, port


def ping_interval_for(keepalive: float) -> float:
    """PING a silent connection after envd's own keepalives would have arrived, but within
    30 s whatever the keepalive interval: the PING, not the keepalives, finds a dead
    connection (one PING per silent connection, where keepalives are one event per stream)."""
    return min(30.0, max(10.0, 3 * keepalive)) if math.isfinite(keepalive) else 30.0


def ping_timeout_for(keepalive: float) -> float:
    """A connection that carries envd streams hears a keepalive every ``keepalive`` s: one
    silent for twice that after a PING is dead (never less than 5 s, for a loaded peer; never
    more than 30 s: a PING's answer does not wait for a keepalive)."""
    return min(30.0, max(5.0, 2 * keepalive)) if math.isfinite(keepalive) else 30.0
