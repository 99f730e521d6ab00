"""The byte streams under the HTTP/2 client (:mod:`._h2conn`): a TCP socket read and written
directly, and TLS over memory BIOs, each waiting only when a call would block.

trio's ``SocketStream`` and ``SSLStream`` yield to the scheduler on every call and go through
several context managers per call; for a connection whose reader task waits on the socket
anyway that doubled the task switches per response. These know nothing of HTTP/2: they are
``trio.abc.Stream`` objects for one sending and one receiving task at a time.
"""

from __future__ import annotations

import select
import socket
import ssl
import sys
from typing import Final

import trio

#: What one read asks the socket for.
READ_SIZE: Final = 65536
#: A raw socket read that did not have to wait yields to the scheduler every this many reads.
_YIELD_EVERY: Final = 8
#: Raw socket I/O (:class:`RawSocketStream`) where file descriptors are sockets' handles.
RAW_SOCKETS: Final = sys.platform != "win32"


# --- the socket, without trio's per-call scheduling -----------------------------------------


class RawSocketStream(trio.abc.Stream):
    """A connected TCP socket read and written directly, waiting only when it would block.

    ``trio.SocketStream`` yields to the scheduler on every successful call (its checkpoint
    rule) and goes through a few context managers per call: for an HTTP/2 connection whose
    reader task waits on the socket anyway, that doubled the task switches per response. Here
    a call that can complete does so at once; :meth:`receive_some` yields every
    ``_YIELD_EVERY`` reads that did not wait, so a busy connection cannot starve other tasks.
    One task sends and one receives at a time (the connection's writer flag, its reader task).
    """

    def __init__(self, stream: trio.SocketStream) -> None:
        # Take the file descriptor over from trio's socket (which is left closed and inert).
        self._sock = socket.socket(fileno=stream.socket.detach())
        self._sock.setblocking(False)
        self._unwaited = 0
        self._pending = bytearray()  # accepted by try_send, not yet written

    def fileno(self) -> int:
        return self._sock.fileno()

    def try_send(self, data: bytes | bytearray | memoryview) -> bool:
        """Write what the socket takes now; True when all of it (and any earlier rest) went.

        The rest is kept, in order, for :meth:`send_rest`.
        """
        if self._pending:
            self._pending += data
            return False
        try:
            sent = self._sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket write failed: {exc!r}") from exc
        if sent < len(data):
            self._pending += memoryview(data)[sent:]
            return False
        return True

    async def send_rest(self) -> None:
        """Write what :meth:`try_send` kept, waiting for the socket as needed."""
        pending = self._pending
        try:
            while pending:
                try:
                    sent = self._sock.send(pending)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(self._sock)
                    continue
                del pending[:sent]
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket write failed: {exc!r}") from exc

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self.try_send(data):
            await self.send_rest()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self._sock)

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = max_bytes or READ_SIZE
        try:
            while True:
                try:
                    data = self._sock.recv(size)
                except BlockingIOError:
                    self._unwaited = 0
                    await trio.lowlevel.wait_readable(self._sock)
                    continue
                self._unwaited += 1
                if self._unwaited >= _YIELD_EVERY:
                    self._unwaited = 0
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return data
        except OSError as exc:
            raise trio.BrokenResourceError(f"socket read failed: {exc!r}") from exc

    async def aclose(self) -> None:
        if self._sock.fileno() != -1:
            trio.lowlevel.notify_closing(self._sock)
            self._sock.close()
        await trio.lowlevel.checkpoint()


# --- TLS over a socket stream, without trio.SSLStream's per-record machinery ----------------


class TLSStream(trio.abc.Stream):
    """TLS on a socket stream through ``ssl.SSLObject`` and memory BIOs.

    One task sends and one receives at a time (the connection's writer flag and its reader
    task), which is all an HTTP/2 connection needs; in exchange a read decrypts every record
    that arrived in one go. TLS output produced by a read (a key update) is sent by the reader
    unless a send is under way, which then sends it in order.
    """

    def __init__(self, sock: trio.abc.Stream, ctx: ssl.SSLContext, host: str) -> None:
        self._sock = sock
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = ctx.wrap_bio(self._in, self._out, server_side=False, server_hostname=host)
        self._sending = False
        self._send_done = trio.lowlevel.ParkingLot()

    def selected_alpn_protocol(self) -> str | None:
        return self._obj.selected_alpn_protocol()

    async def do_handshake(self) -> None:
        while True:
            try:
                self._obj.do_handshake()
                break
            except ssl.SSLWantReadError:
                await self._push()
                data = await self._sock.receive_some(READ_SIZE)
                if not data:
                    raise trio.BrokenResourceError("EOF during the TLS handshake") from None
                self._in.write(data)
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS handshake failed: {exc}") from exc
        await self._push()

    async def _push(self) -> None:
        while self._sending:  # another task is writing: ours go after its bytes
            await self._send_done.park()
        self._sending = True
        try:
            sock = self._sock
            if isinstance(sock, RawSocketStream):
                await sock.send_rest()
            while self._out.pending:
                await sock.send_all(self._out.read())
        finally:
            self._sending = False
            self._send_done.unpark_all()

    def try_send(self, data: bytes | bytearray | memoryview) -> bool:
        """Encrypt ``data`` and write what the socket takes now; True when all of it went
        (else :meth:`send_rest` writes the rest, in order)."""
        try:
            self._obj.write(data)
        except ssl.SSLError as exc:
            raise trio.BrokenResourceError(f"TLS write failed: {exc}") from exc
        sock = self._sock
        if self._sending or not isinstance(sock, RawSocketStream):
            return False
        return sock.try_send(self._out.read())

    async def send_rest(self) -> None:
        await self._push()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self.try_send(data):
            await self._push()

    async def wait_send_all_might_not_block(self) -> None:
        await self._sock.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        size = max_bytes or READ_SIZE
        while True:
            parts = []
            try:
                # Every whole record in the BIO, without a failed read per call when possible.
                parts.append(self._obj.read(size))
                while self._obj.pending() or self._in.pending:
                    parts.append(self._obj.read(size))
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLZeroReturnError:
                if not parts:
                    return b""  # close_notify
            except ssl.SSLError as exc:
                raise trio.BrokenResourceError(f"TLS read failed: {exc}") from exc
            if self._out.pending and not self._sending:
                await self._push()  # TLS's own answer to what was read (a key update)
            if parts:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            data = await self._sock.receive_some(READ_SIZE)
            if not data:
                return b""  # EOF without close_notify: HTTP/2 framing tells a cut stream
            self._in.write(data)

    async def aclose(self) -> None:
        await self._sock.aclose()


def readable(stream: trio.abc.Stream) -> bool:
    """True when the socket under ``stream`` has bytes (or EOF) waiting; False if unknown."""
    inner = stream._sock if isinstance(stream, TLSStream) else stream
    if isinstance(inner, RawSocketStream):
        fd = inner.fileno()
    elif isinstance(inner, trio.SocketStream):
        fd = inner.socket.fileno()
    else:
        return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, AttributeError):  # closed, or no poll() on this platform
        return False
