"""envd's unary Connect RPCs: ``process.Process`` and ``filesystem.Filesystem``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial

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
    RpcError,
)
from ._faults import Fault
from ._fs import PATH_FIELDS, FsError, fs_call
from ._processes import send_signal
from ._registry import SandboxEntry
from ._streams import StreamRoutes


class RpcRoutes(StreamRoutes):
    """Connect routing, unary process RPCs and filesystem RPCs."""

    async def _rpc(self, req: Request, fault: Fault | None) -> None:
        entry = await self._sandbox_for(req)
        if entry is None:
            await self._gone(req)
            return
        if not self._token_ok(req, entry):
            await req.body()
            await self._rpc_error(req, RpcError("unauthenticated", "invalid access token"))
            return
        method = req.path.rsplit("/", 1)[-1]
        service = req.path[1:].split("/", 1)[0]
        if service == "process.Process" and method in ("Start", "Connect"):
            await self._stream_rpc(req, entry, method, fault)
            return
        if service == "process.Process" and method == "StreamInput":
            await self._stream_input(req, entry)
            return
        handlers: dict[str, Callable[[SandboxEntry, bytes], Awaitable[msgspec.Struct | bytes]]] = {
            "List": self._list,
            "SendSignal": self._send_signal,
            "SendInput": self._send_input,
            "CloseStdin": self._close_stdin,
        }
        handler = handlers.get(method) if service == "process.Process" else None
        if service == "filesystem.Filesystem" and method in PATH_FIELDS:
            handler = partial(self._filesystem, method, self._user(req))

        async def unary(r: Request) -> None:
            body = await r.body()
            if handler is None:
                await self._rpc_error(r, RpcError("unimplemented", f"{req.path} unimplemented"))
                return
            if not req.headers.get("content-type", "").startswith("application/json"):
                await r.respond(415, b"", [("accept-post", "application/json")])
                return
            try:
                result = await handler(entry, body)
            except FsError as err:
                await self._rpc_error(r, RpcError(err.code, err.message))
                return
            except RpcError as err:
                await self._rpc_error(r, err)
                return
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await self._rpc_error(r, RpcError("invalid_argument", str(exc)))
                return
            payload = result if isinstance(result, bytes) else wire.encode(result)
            await r.respond(200, payload, [("content-type", "application/json")])

        await self._unary_with_fault(req, fault, unary)

    async def _rpc_error(self, req: Request, err: RpcError) -> None:
        status = connect.CODE_TO_HTTP.get(err.code, 500)
        body = connect.encode_error(connect.ConnectError(err.code, err.message))
        await req.respond(status, body, [("content-type", "application/json")])

    async def _filesystem(
        self, method: str, user: str, entry: SandboxEntry, body: bytes
    ) -> msgspec.Struct | bytes:
        args = msgspec.json.decode(body or b"{}")
        if not isinstance(args, dict):
            raise RpcError("invalid_argument", "the request must be a JSON object")
        for field in PATH_FIELDS[method]:
            value = args.get(field)
            if not isinstance(value, str) or not value:
                raise RpcError("invalid_argument", f"{field} is required")
            args[field] = self._abs_path(value, user)
        try:
            result = await fs_call(entry.host, method, args, user=user, env=entry.env)
        except SandboxNotRunningError:
            await self._died(entry)
            raise RpcError("unavailable", GONE_MESSAGE) from None
        except InvalidArgumentError as exc:  # e.g. an unknown user, as envd refuses it
            raise RpcError("invalid_argument", str(exc)) from None
        except (SandboxError, OSError) as exc:
            raise RpcError("internal", str(exc)) from None
        return msgspec.json.encode(result)

    async def _list(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        return wire.ListResponse(processes=[r.info() for r in entry.processes.running()])

    async def _send_signal(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        msg = wire.decode(body, wire.SendSignalRequest)
        record = self._select(entry, msg.process)
        try:
            send_signal(record, msg.signal)
        except ValueError as exc:
            raise RpcError("invalid_argument", str(exc)) from None
        return wire.SendSignalResponse()

    async def _send_input(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        msg = wire.decode(body, wire.SendInputRequest)
        record = self._select(entry, msg.process)
        stdin = record.proc.stdin
        data = msg.input.stdin if msg.input is not None else None
        if stdin is None or record.end is not None:
            raise RpcError("failed_precondition", "process has no open stdin")
        if data:
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise RpcError("failed_precondition", f"stdin closed: {exc}") from None
        return wire.SendInputResponse()

    async def _close_stdin(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        msg = wire.decode(body, wire.CloseStdinRequest)
        record = self._select(entry, msg.process)
        if record.proc.stdin is not None:
            await record.proc.stdin.aclose()
        return wire.CloseStdinResponse()
