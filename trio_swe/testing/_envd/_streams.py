"""envd's streaming process RPCs: ``Start``, ``Connect`` (server streams) and ``StreamInput``.

Keepalives every ``Keepalive-Ping-Interval``, the ``Connect-Timeout-Ms`` kill, stream faults
applied by the app (``no_end``; HTTP/1.1 stand-ins) or handed to the proxy.
"""

from __future__ import annotations

import base64
import binascii

import msgspec
import trio

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxNotRunningError,
)
from ...sandbox.e2b import _connect as connect
from ...sandbox.e2b import _wire as wire
from ._asgi import Request
from ._base import (
    GONE_MESSAGE,
    STREAM_JSON,
    AbortConnection,
    AppBase,
    RpcError,
    keepalive_of,
)
from ._faults import FRAME_KINDS, Fault
from ._processes import ProcessRecord, send_signal
from ._registry import SandboxEntry


class StreamRoutes(AppBase):
    """Server- and client-streaming RPCs of ``process.Process``."""

    def _select(self, entry: SandboxEntry, sel: wire.ProcessSelector | None) -> ProcessRecord:
        if sel is None or (sel.pid is None and sel.tag is None):
            raise RpcError("invalid_argument", "a process selector (pid or tag) is required")
        record = entry.processes.find(pid=sel.pid, tag=sel.tag)
        if record is None:
            what = f"pid {sel.pid}" if sel.pid is not None else f"tag {sel.tag!r}"
            raise RpcError("not_found", f"process with {what} not found")
        return record

    async def _stream_rpc(
        self, req: Request, entry: SandboxEntry, method: str, fault: Fault | None
    ) -> None:
        body = await req.body()
        ctype = req.headers.get("content-type", "")
        if not ctype.startswith(STREAM_JSON):
            await req.respond(415, b"", [("accept-post", STREAM_JSON)])
            return
        try:
            timeout_sec = connect.parse_timeout_ms(req.headers.get("connect-timeout-ms"))
            keepalive = keepalive_of(req.headers.get("keepalive-ping-interval"))
            envelopes = connect.EnvelopeDecoder().feed(body)
            if len(envelopes) != 1:
                raise connect.ProtocolError("a server-streaming call needs exactly one message")
            payload = envelopes[0].payload
            user = self._user(req)
        except (connect.ProtocolError, InvalidArgumentError) as exc:
            await self._stream_fail(req, RpcError("invalid_argument", str(exc)))
            return
        try:
            if method == "Start":
                start = wire.decode(payload, wire.StartRequest)
                if start.process is None or not start.process.cmd:
                    raise RpcError("invalid_argument", "process.cmd is required")
                if start.pty is not None:
                    raise RpcError("unimplemented", "pty is not supported by the test server")
                env = {**entry.env, **start.process.envs}
                try:
                    record, sub = await entry.processes.start(
                        entry.host,
                        start.process,
                        user=user,
                        env=env,
                        # envd: no cwd is the user's home, and so is a relative one's base.
                        cwd=self._abs_path(start.process.cwd or "", user),
                        stdin=True if start.stdin is None else start.stdin,
                        tag=start.tag,
                        timeout_sec=timeout_sec,
                    )
                except (InvalidArgumentError, ValueError) as exc:
                    raise RpcError("invalid_argument", str(exc)) from None
                except SandboxNotRunningError:
                    await self._died(entry)
                    raise RpcError("unavailable", GONE_MESSAGE) from None
                except (SandboxError, OSError) as exc:
                    raise RpcError("internal", f"cannot start process: {exc}") from None
            else:
                conn = wire.decode(payload, wire.ConnectRequest)
                record = self._select(entry, conn.process)
                sub = record.subscribe()
        except RpcError as err:
            await self._stream_fail(req, err)
            return
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._stream_fail(req, RpcError("invalid_argument", str(exc)))
            return
        try:
            await self._serve_events(
                req,
                record,
                sub,
                deadline=None if timeout_sec is None else trio.current_time() + timeout_sec,
                is_start=method == "Start",
                keepalive_sec=keepalive,
                fault=fault,
            )
        finally:
            record.unsubscribe(sub)

    async def _stream_input(self, req: Request, entry: SandboxEntry) -> None:
        """Client stream: ``start{process}``, then ``data{input}``/``keepalive`` messages."""
        if not req.headers.get("content-type", "").startswith(STREAM_JSON):
            await req.body()
            await req.respond(415, b"", [("accept-post", STREAM_JSON)])
            return
        decoder = connect.EnvelopeDecoder()
        record: ProcessRecord | None = None
        try:
            while True:
                msg = await req.receive()
                if msg["type"] == "http.disconnect":
                    return
                for env in decoder.feed(msg.get("body", b"")):
                    if env.end_stream:
                        continue
                    event = msgspec.json.decode(env.payload)
                    if not isinstance(event, dict):
                        raise RpcError("invalid_argument", "bad StreamInput message")
                    if "start" in event:
                        sel = msgspec.convert(
                            (event["start"] or {}).get("process") or {}, wire.ProcessSelector
                        )
                        record = self._select(entry, sel)
                    elif "data" in event:
                        if record is None:
                            raise RpcError("failed_precondition", "data before start")
                        raw = ((event["data"] or {}).get("input") or {}).get("stdin")
                        stdin = record.proc.stdin
                        if stdin is None or record.end is not None:
                            raise RpcError("failed_precondition", "process has no open stdin")
                        if raw:
                            await stdin.send_all(base64.b64decode(raw))
                if not msg.get("more_body", False):
                    break
            decoder.check_complete()
        except RpcError as err:
            await self._stream_fail(req, err)
            return
        except (
            connect.ProtocolError,
            msgspec.DecodeError,
            msgspec.ValidationError,
            binascii.Error,
        ) as exc:
            await self._stream_fail(req, RpcError("invalid_argument", str(exc)))
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await self._stream_fail(req, RpcError("failed_precondition", f"stdin closed: {exc}"))
            return
        body = connect.encode_envelope(wire.encode(wire.SendInputResponse()))
        await req.respond(200, body + connect.encode_end_stream(), [("content-type", STREAM_JSON)])

    async def _stream_fail(self, req: Request, err: RpcError) -> None:
        end = connect.encode_end_stream(connect.ConnectError(err.code, err.message))
        await req.respond(200, end, [("content-type", STREAM_JSON)])

    async def _serve_events(
        self,
        req: Request,
        record: ProcessRecord,
        sub: trio.MemoryReceiveChannel[wire.ProcessEvent],
        *,
        deadline: float | None,
        is_start: bool,
        keepalive_sec: float,
        fault: Fault | None,
    ) -> None:
        self.stats.streams_open += 1
        self.stats.streams_total += 1
        try:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    await req.wait_disconnect()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                await self._event_loop(req, record, sub, deadline, is_start, keepalive_sec, fault)
                nursery.cancel_scope.cancel()
        finally:
            self.stats.streams_open -= 1

    async def _event_loop(
        self,
        req: Request,
        record: ProcessRecord,
        sub: trio.MemoryReceiveChannel[wire.ProcessEvent],
        deadline: float | None,
        is_start: bool,
        keepalive_sec: float,
        fault: Fault | None,
    ) -> None:
        # Stream faults applied here: no_end, and frame kinds over HTTP/1.1. Over HTTP/2 the
        # proxy applies frame kinds; the app only tells it when the process ended first.
        trigger = req.fault_trigger
        if fault is not None and fault.kind not in ("no_end", *FRAME_KINDS):
            fault = None
        if fault is not None and fault.kind in FRAME_KINDS and req.http_version == "2":
            if trigger is None:
                fault = None  # HTTP/2 without the proxy: cannot be injected
            else:
                await self._proxy_stream_fault(req, record, sub, fault, trigger, keepalive_sec)
                return
        fault_at = trio.current_time() + fault.after_sec if fault is not None else None
        inf = float("inf")

        async def emit(event: wire.ProcessEvent) -> None:
            msg = wire.StartResponse(event=event)
            await req.write(connect.encode_envelope(wire.encode(msg)))

        await req.start(200, [("content-type", STREAM_JSON)])
        await emit(wire.ProcessEvent(start=wire.StartEvent(pid=record.pid)))
        while True:
            now = trio.current_time()
            wake = min(now + keepalive_sec, deadline or inf, fault_at or inf)
            event: wire.ProcessEvent | None = None
            closed = False
            with trio.move_on_at(wake):
                try:
                    event = await sub.receive()
                except trio.EndOfChannel:
                    closed = True
            now = trio.current_time()
            if closed:
                if record.gone:
                    err = connect.ConnectError("unavailable", GONE_MESSAGE)
                    await req.write(connect.encode_end_stream(err), more=False)
                else:
                    await req.write(connect.encode_end_stream(), more=False)
                return
            due = fault is not None and (
                (event is None and fault_at is not None and now >= fault_at)
                # The process ended first: the fault takes the place of the end event, so a
                # decided fault always happens.
                or (event is not None and event.end is not None)
            )
            if fault is not None and due:
                self.plan.record(fault)
                if fault.kind == "no_end":
                    await req.write(b"", more=False)
                    return
                if fault.kind == "hang":
                    await trio.sleep_forever()
                raise AbortConnection(fault.kind)
            if event is None:
                if deadline is not None and now >= deadline:
                    await self._deadline_exceeded(req, record, is_start)
                    return
                await emit(wire.ProcessEvent(keepalive=wire.KeepAlive()))
                continue
            if event.end is not None and record.deadline_hit and is_start:
                await self._deadline_exceeded(req, record, is_start)
                return
            await emit(event)

    async def _proxy_stream_fault(
        self,
        req: Request,
        record: ProcessRecord,
        sub: trio.MemoryReceiveChannel[wire.ProcessEvent],
        fault: Fault,
        trigger: trio.Event,
        keepalive_sec: float,
    ) -> None:
        """Serve a stream whose frame fault the proxy fires; hold the end back for it."""

        async def emit(event: wire.ProcessEvent) -> None:
            await req.write(connect.encode_envelope(wire.encode(wire.StartResponse(event=event))))

        await req.start(200, [("content-type", STREAM_JSON)])
        await emit(wire.ProcessEvent(start=wire.StartEvent(pid=record.pid)))
        graceful = fault.kind == "goaway" and fault.code == 0
        # A hung stream ends normally on the server side (the proxy swallows what follows):
        # the client never resets it (httpcore sends no RST_STREAM), so a handler that slept
        # forever would hold one of hypercorn's streams of that connection for good, and after
        # enough hangs the whole connection stopped answering.
        finish = graceful or fault.kind == "hang"
        while not trigger.is_set():
            event: wire.ProcessEvent | None = None
            with trio.move_on_after(keepalive_sec):
                try:
                    event = await sub.receive()
                except trio.EndOfChannel:
                    break
            if event is None:
                await emit(wire.ProcessEvent(keepalive=wire.KeepAlive()))
            elif event.end is not None:
                trigger.set()  # the fault takes the place of the end event
                if finish:
                    await emit(event)
                    break
            else:
                await emit(event)
        if record.gone:
            err = connect.ConnectError("unavailable", GONE_MESSAGE)
            await req.write(connect.encode_end_stream(err), more=False)
            return
        if finish:
            await req.write(connect.encode_end_stream(), more=False)
            return
        await trio.sleep_forever()  # until the proxy's fault disconnects us

    async def _deadline_exceeded(self, req: Request, record: ProcessRecord, is_start: bool) -> None:
        # envd ties a Start's process to the request deadline: it kills the process.
        if is_start and record.end is None:
            record.deadline_hit = True
            send_signal(record, "SIGNAL_SIGKILL")
        err = connect.ConnectError("deadline_exceeded", "the operation timed out")
        await req.write(connect.encode_end_stream(err), more=False)
