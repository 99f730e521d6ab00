"""The ASGI app: E2B's REST lifecycle API and envd's process and file APIs, with app-level faults.

Routes (one origin serves both, like ``api_url`` and ``sandbox_url`` pointing at one server):

* REST (``X-API-Key``): ``POST /sandboxes``, ``POST /v2/sandboxes``, ``GET /sandboxes/{id}``,
  ``DELETE /sandboxes/{id}``, ``POST /sandboxes/{id}/timeout``,
  ``POST /sandboxes/{id}/connect`` and ``POST /v2/sandboxes/{id}/connect``.
* envd (routed by the ``E2b-Sandbox-Id`` header, or a ``49983-<id>.<domain>`` Host; checked
  against ``X-Access-Token``): ``GET /health``, ``GET``/``POST /files``, and Connect RPCs
  ``/process.Process/{Start,Connect,List,SendSignal,SendInput,CloseStdin}`` (JSON codec).
"""

from __future__ import annotations

import base64
import binascii
import logging
import posixpath
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any, Final

import msgspec
import trio

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotRunningError,
)
from ...sandbox.e2b import _connect as connect
from ...sandbox.e2b import _wire as wire
from ._asgi import ClientGone, Receive, Request, Scope, Send
from ._faults import APP_KINDS, FRAME_KINDS, Fault, FaultPlan
from ._fs import PATH_FIELDS, FsError, fs_call
from ._multipart import MultipartError, boundary_of, parse_multipart
from ._processes import ProcessRecord, send_signal
from ._registry import SandboxEntry, SandboxRegistry

_log = logging.getLogger("trio_swe.testing")

#: Header the fault proxy puts on every HTTP/2 request it forwards: the id of the app-level fault
#: it decided for it, or ``-`` for none. Clients' own copies are stripped by the proxy.
FAULT_HEADER: Final = "trio-swe-fault"
#: The SDK's sandbox id in debug mode.
DEBUG_SANDBOX_ID: Final = "debug_sandbox_id"
_DEFAULT_KEEPALIVE_SEC: Final = 90.0
_MAX_TTL_SEC: Final = 24 * 3600.0
_HOST_RE: Final = re.compile(r"^(\d+)-([A-Za-z0-9_-]+)\.")
_ALL_KINDS: Final = APP_KINDS | FRAME_KINDS
_STREAM_JSON: Final = "application/connect+json"
_GONE_MESSAGE: Final = "The sandbox was not found"


class AbortConnection(Exception):
    """Raised inside a handler after the response started: hypercorn drops an HTTP/1.1
    connection when the app fails mid-response (the HTTP/1.1 stand-in for frame faults)."""


class _RpcError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class FaultHandoff:
    """Faults the HTTP/2 proxy decided for a request, by id (header ``trio-swe-fault``).

    App-level faults are applied by the app. Frame-level stream faults are applied by the proxy,
    but come with a trigger: when the process ends before the fault is due, the app sets it and
    holds the end event back, so the proxy fires the fault in its place.
    """

    def __init__(self) -> None:
        self._next = 0
        self._pending: dict[str, tuple[Fault, trio.Event | None]] = {}

    def put(self, fault: Fault, trigger: trio.Event | None = None) -> str:
        self._next += 1
        key = str(self._next)
        self._pending[key] = (fault, trigger)
        return key

    def take(self, key: str) -> tuple[Fault, trio.Event | None] | None:
        return self._pending.pop(key, None)


class Stats:
    """Counters reported by ``EnvdServer.statistics()``."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.streams_open = 0
        self.streams_total = 0


class EnvdApp:
    """The ASGI application. Built by :func:`trio_swe.testing.open_envd_server`."""

    def __init__(
        self,
        *,
        registry: SandboxRegistry,
        plan: FaultPlan,
        handoff: FaultHandoff,
        api_key: str | None,
        templates: Mapping[str, str] | None,
        default_image: str,
        default_ttl_sec: float,
        default_user: str,
        domain: str,
        debug_template: str | None,
        user_aliases: Mapping[str, str],
    ) -> None:
        self.registry = registry
        self.plan = plan
        self.handoff = handoff
        self.api_key = api_key
        self.templates = dict(templates) if templates is not None else None
        self.default_image = default_image
        self.default_ttl_sec = default_ttl_sec
        self.default_user = default_user
        self.domain = domain
        self.debug_template = debug_template
        self.user_aliases = dict(user_aliases)
        self._idempotent: dict[str, str] = {}
        self._create_locks: dict[str, trio.Lock] = {}
        self.stats = Stats()
        self._debug_lock = trio.Lock()

    # --- ASGI entry -----------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        req = Request(scope, receive, send)
        try:
            await self._handle(req)
        except ClientGone:
            return
        except Exception as exc:
            if is_abort(exc):
                raise  # hypercorn drops the HTTP/1.1 connection mid-response
            _log.exception("envd test server: %s %s failed", req.method, req.path)
            try:
                if not req.started:
                    body = {"code": 500, "message": f"internal error: {exc}"}
                    await req.respond_json(500, body)
                elif not req.finished:
                    await req.write(b"", more=False)
            except Exception:
                pass  # the client is gone too; hypercorn cleans up

    def _decide(self, req: Request) -> Fault | None:
        marker = req.headers.get(FAULT_HEADER)
        if marker is not None and req.http_version == "2":
            handed = None if marker == "-" else self.handoff.take(marker)
            if handed is None:
                return None
            req.fault_trigger = handed[1]
            return handed[0]
        # Not seen by the proxy: HTTP/1.1 approximates frame faults, HTTP/2 without a proxy cannot.
        kinds = _ALL_KINDS if req.http_version.startswith("1") else APP_KINDS
        return self.plan.decide(req.method, req.path, kinds=kinds)

    async def _handle(self, req: Request) -> None:
        self.stats.requests[req.path if not req.path.startswith("/sandboxes/") else "rest"] += 1
        fault = self._decide(req)
        if fault is not None:
            if fault.kind == "status":
                self.plan.record(fault)
                await self._fault_status(req, fault)
                return
            if fault.kind == "latency":
                self.plan.record(fault)
                await trio.sleep(fault.delay_sec)
                fault = None
            elif fault.kind in FRAME_KINDS and fault.before_request:
                self.plan.record(fault)
                await self._abort(req, fault)
                return
        path = req.path
        if path.startswith("/process.Process/") or path.startswith("/filesystem.Filesystem/"):
            await self._rpc(req, fault)
        elif path in ("/files", "/health"):
            await self._envd_http(req, fault)
        elif path.startswith("/sandboxes") or path.startswith("/v2/sandboxes"):
            await self._unary_with_fault(req, fault, self._rest)
        else:
            await req.respond_json(404, {"code": 404, "message": f"no route {path}"})

    async def _fault_status(self, req: Request, fault: Fault) -> None:
        headers = []
        if fault.retry_after is not None:
            headers.append(("retry-after", f"{fault.retry_after:g}"))
        body = {
            "sandboxId": req.headers.get("e2b-sandbox-id", ""),
            "message": fault.message,
            "code": fault.status,
        }
        await req.body()
        await req.respond_json(fault.status, body, headers)

    async def _abort(self, req: Request, fault: Fault) -> None:
        """HTTP/1.1 stand-in for a frame fault: drop (or silence) the connection."""
        if fault.kind == "hang":
            await req.wait_disconnect()
            return
        await req.start(200, [("content-type", "application/octet-stream")])
        raise AbortConnection(fault.kind)

    async def _unary_with_fault(
        self, req: Request, fault: Fault | None, handler: Callable[[Request], Awaitable[None]]
    ) -> None:
        """Run a non-streaming handler; an HTTP/1.1 frame fault loses its response."""
        if fault is None or fault.kind not in FRAME_KINDS or req.http_version == "2":
            await handler(req)
            return
        # Process the request, then lose the answer: it reached the server, the reply did not.
        lost = _LostResponse(req)
        await handler(lost)  # type: ignore[arg-type]
        self.plan.record(fault)
        await self._abort(req, fault)

    # --- REST -------------------------------------------------------------------------------

    async def _rest(self, req: Request) -> None:
        if self.api_key is not None and req.headers.get("x-api-key") != self.api_key:
            await req.body()
            await req.respond_json(401, {"code": 401, "message": "Invalid API key"})
            return
        parts = [p for p in req.path.split("/") if p]
        if parts and parts[0] == "v2":
            parts = parts[1:]
        body = await req.body()
        m = req.method
        if parts == ["sandboxes"] and m == "POST":
            await self._rest_create(req, body)
        elif parts == ["sandboxes"] and m == "GET":
            await req.respond_json(
                200,
                [self.registry.get(i).detail(self.domain) for i in self.registry.live_ids()],  # type: ignore[union-attr]
            )
        elif len(parts) >= 2 and parts[0] == "sandboxes":
            entry = self.registry.get(parts[1])
            if entry is None:
                await req.respond_json(
                    404, {"code": 404, "message": f"sandbox {parts[1]} not found"}
                )
                return
            action = parts[2] if len(parts) > 2 else None
            if action is None and m == "GET":
                await req.respond_json(200, entry.detail(self.domain))
            elif action is None and m == "DELETE":
                await self.registry.kill(entry.id)
                await req.respond(204)
            elif action == "timeout" and m == "POST":
                timeout = self._timeout_of(body)
                entry.set_timeout(timeout)
                await req.respond(204)
            elif action == "connect" and m == "POST":
                entry.extend_to_at_least(self._timeout_of(body))
                await req.respond_json(200, self._info(entry))
            else:
                await req.respond_json(404, {"code": 404, "message": f"no route {req.path}"})
        else:
            await req.respond_json(404, {"code": 404, "message": f"no route {req.path}"})

    def _timeout_of(self, body: bytes) -> float:
        try:
            t = msgspec.json.decode(body, type=wire.TimeoutRequest).timeout
        except msgspec.DecodeError:
            t = int(self.default_ttl_sec)
        return float(min(max(t, 0), _MAX_TTL_SEC))

    def _info(self, entry: SandboxEntry) -> wire.SandboxInfo:
        return wire.SandboxInfo(
            template_id=entry.template_id,
            sandbox_id=entry.id,
            client_id="local",
            envd_version=_envd_version(),
            envd_access_token=entry.token,
            domain=self.domain,
        )

    def image_for(self, template: str) -> str | None:
        """The image (directory or ``path@commit``) of a template, or None when unknown."""
        if self.templates is None:
            return self.default_image
        return self.templates.get(template)

    async def _rest_create(self, req: Request, body: bytes) -> None:
        try:
            new = msgspec.json.decode(body, type=wire.NewSandbox)
        except msgspec.DecodeError as exc:
            await req.respond_json(400, {"code": 400, "message": f"bad request body: {exc}"})
            return
        image = self.image_for(new.template_id)
        if image is None:
            await req.respond_json(
                404, {"code": 404, "message": f"template '{new.template_id}' not found"}
            )
            return
        ttl = float(new.timeout) if new.timeout is not None else self.default_ttl_sec
        key = req.headers.get("idempotency-key")
        if key is not None:
            # A retried create with the same key gets the same sandbox, as on E2B.
            async with self._create_lock(key):
                known = self.registry.get(self._idempotent.get(key, ""))
                if known is not None:
                    await req.respond_json(201, self._info(known))
                    return
                await self._create(req, new, image, ttl, key)
            return
        await self._create(req, new, image, ttl, None)

    def _create_lock(self, key: str) -> trio.Lock:
        lock = self._create_locks.get(key)
        if lock is None:
            lock = self._create_locks[key] = trio.Lock()
        return lock

    async def _create(
        self, req: Request, new: wire.NewSandbox, image: str, ttl: float, key: str | None
    ) -> None:
        try:
            entry = await self.registry.create(
                template_id=new.template_id,
                image=image,
                ttl_sec=min(max(ttl, 0.0), _MAX_TTL_SEC),
                metadata=new.metadata or {},
                env=new.env_vars or {},
            )
        except (SandboxError, InvalidArgumentError, OSError) as exc:
            await req.respond_json(500, {"code": 500, "message": f"cannot create sandbox: {exc}"})
            return
        if key is not None:
            self._idempotent[key] = entry.id
        await req.respond_json(201, self._info(entry))

    # --- envd: routing and auth -----------------------------------------------------------

    async def _sandbox_for(self, req: Request) -> SandboxEntry | None:
        sid = req.headers.get("e2b-sandbox-id")
        if sid is None:
            m = _HOST_RE.match(req.headers.get("host", ""))
            sid = m.group(2) if m else None
        if sid is None:
            return None
        entry = self.registry.get(sid)
        if entry is None and sid == DEBUG_SANDBOX_ID and self.debug_template is not None:
            async with self._debug_lock:
                entry = self.registry.get(sid)
                if entry is None:
                    image = self.image_for(self.debug_template) or self.default_image
                    entry = await self.registry.create(
                        template_id=self.debug_template,
                        image=image,
                        ttl_sec=_MAX_TTL_SEC,
                        metadata={},
                        env={},
                        sandbox_id=DEBUG_SANDBOX_ID,
                        secure=False,
                    )
        return entry

    async def _died(self, entry: SandboxEntry) -> None:
        """The sandbox died under us (not through the API): it is gone, as on E2B."""
        _log.warning("sandbox %s died on its own; reclaiming it", entry.id)
        self.registry.died += 1
        await self.registry.kill(entry.id)

    async def _gone(self, req: Request, *, read_body: bool = True) -> None:
        if read_body:
            await req.body()
        await req.respond_json(
            502,
            {
                "sandboxId": req.headers.get("e2b-sandbox-id", ""),
                "message": _GONE_MESSAGE,
                "code": 502,
            },
        )

    def _user(self, req: Request) -> str:
        """User from ``Authorization: Basic base64("user:")`` or ``?username=``."""
        auth = req.headers.get("authorization", "")
        if auth[:6].lower() == "basic ":
            try:
                raw = base64.b64decode(auth[6:].strip(), validate=True).decode()
            except (binascii.Error, UnicodeDecodeError):
                raise InvalidArgumentError("malformed Basic authorization") from None
            name = raw.partition(":")[0]
            if name:
                return self.user_aliases.get(name, name)
        name = req.param("username") or self.default_user
        return self.user_aliases.get(name, name)

    def _token_ok(self, req: Request, entry: SandboxEntry) -> bool:
        return entry.token is None or req.headers.get("x-access-token") == entry.token

    # --- envd HTTP: /health, /files -------------------------------------------------------

    async def _envd_http(self, req: Request, fault: Fault | None) -> None:
        entry = await self._sandbox_for(req)
        if entry is None:
            await self._gone(req)
            return
        if req.path == "/health":
            await req.body()
            await req.respond(204)
            return
        if not self._token_ok(req, entry):
            await req.body()
            await req.respond_json(401, {"code": 401, "message": "invalid access token"})
            return
        await self._unary_with_fault(req, fault, lambda r: self._files(r, entry))

    def _abs_path(self, path: str, user: str) -> str:
        if path.startswith("/"):
            return posixpath.normpath(path)
        home = "/root" if user == "root" else f"/home/{user}"
        return posixpath.normpath(posixpath.join(home, path))

    async def _files(self, req: Request, entry: SandboxEntry) -> None:
        try:
            user = self._user(req)
        except InvalidArgumentError as exc:
            await req.respond_json(400, {"code": 400, "message": str(exc)})
            return
        if req.method == "GET":
            await req.body()
            path = req.param("path")
            if not path:
                await req.respond_json(400, {"code": 400, "message": "missing path"})
                return
            full = self._abs_path(path, user)
            try:
                data = await entry.sandbox.read_file(full, user=user)
            except SandboxFileNotFoundError:
                await req.respond_json(404, {"code": 404, "message": f"path '{full}' not found"})
                return
            except SandboxNotRunningError:
                await self._died(entry)
                await self._gone(req, read_body=False)
                return
            except (InvalidArgumentError, SandboxError) as exc:
                await req.respond_json(400, {"code": 400, "message": str(exc)})
                return
            await req.respond(200, data, [("content-type", "application/octet-stream")])
            return
        if req.method != "POST":
            await req.body()
            await req.respond_json(405, {"code": 405, "message": "method not allowed"})
            return
        body = await req.body()
        ctype = req.headers.get("content-type", "")
        uploads: list[tuple[str, bytes]] = []
        if ctype.startswith("multipart/form-data"):
            try:
                parts = parse_multipart(body, boundary_of(ctype))
            except MultipartError as exc:
                await req.respond_json(400, {"code": 400, "message": str(exc)})
                return
            qpath = req.param("path")
            for part in parts:
                target = qpath if (qpath and len(parts) == 1) else (part.filename or qpath)
                if not target:
                    await req.respond_json(400, {"code": 400, "message": "part without path"})
                    return
                uploads.append((target, part.data))
        else:
            qpath = req.param("path")
            if not qpath:
                await req.respond_json(400, {"code": 400, "message": "missing path"})
                return
            if req.headers.get("content-encoding", "").lower() == "gzip":
                import gzip

                body = gzip.decompress(body)
            uploads.append((qpath, body))
        written: list[dict[str, str]] = []
        for target, data in uploads:
            full = self._abs_path(target, user)
            try:
                await entry.sandbox.write_file(full, data, user=user)
            except SandboxNotRunningError:
                await self._died(entry)
                await self._gone(req, read_body=False)
                return
            except (InvalidArgumentError, SandboxError) as exc:
                await req.respond_json(400, {"code": 400, "message": str(exc)})
                return
            # envd always writes "type" (WrittenFile omits its default when encoding).
            written.append({"path": full, "name": posixpath.basename(full), "type": "file"})
        await req.respond_json(200, written)

    # --- envd Connect RPC -----------------------------------------------------------------

    async def _rpc(self, req: Request, fault: Fault | None) -> None:
        entry = await self._sandbox_for(req)
        if entry is None:
            await self._gone(req)
            return
        if not self._token_ok(req, entry):
            await req.body()
            await self._rpc_error(req, _RpcError("unauthenticated", "invalid access token"))
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
                await self._rpc_error(r, _RpcError("unimplemented", f"{req.path} unimplemented"))
                return
            if not req.headers.get("content-type", "").startswith("application/json"):
                await r.respond(415, b"", [("accept-post", "application/json")])
                return
            try:
                result = await handler(entry, body)
            except FsError as err:
                await self._rpc_error(r, _RpcError(err.code, err.message))
                return
            except _RpcError as err:
                await self._rpc_error(r, err)
                return
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                await self._rpc_error(r, _RpcError("invalid_argument", str(exc)))
                return
            payload = result if isinstance(result, bytes) else wire.encode(result)
            await r.respond(200, payload, [("content-type", "application/json")])

        await self._unary_with_fault(req, fault, unary)

    async def _rpc_error(self, req: Request, err: _RpcError) -> None:
        status = connect.CODE_TO_HTTP.get(err.code, 500)
        body = connect.encode_error(connect.ConnectError(err.code, err.message))
        await req.respond(status, body, [("content-type", "application/json")])

    def _select(self, entry: SandboxEntry, sel: wire.ProcessSelector | None) -> ProcessRecord:
        if sel is None or (sel.pid is None and sel.tag is None):
            raise _RpcError("invalid_argument", "a process selector (pid or tag) is required")
        record = entry.processes.find(pid=sel.pid, tag=sel.tag)
        if record is None:
            what = f"pid {sel.pid}" if sel.pid is not None else f"tag {sel.tag!r}"
            raise _RpcError("not_found", f"process with {what} not found")
        return record

    async def _filesystem(
        self, method: str, user: str, entry: SandboxEntry, body: bytes
    ) -> msgspec.Struct | bytes:
        args = msgspec.json.decode(body or b"{}")
        if not isinstance(args, dict):
            raise _RpcError("invalid_argument", "the request must be a JSON object")
        for field in PATH_FIELDS[method]:
            value = args.get(field)
            if not isinstance(value, str) or not value:
                raise _RpcError("invalid_argument", f"{field} is required")
            args[field] = self._abs_path(value, user)
        try:
            result = await fs_call(entry.host, method, args, user=user, env=entry.env)
        except SandboxNotRunningError:
            await self._died(entry)
            raise _RpcError("unavailable", _GONE_MESSAGE) from None
        except (InvalidArgumentError, SandboxError, OSError) as exc:
            raise _RpcError("internal", str(exc)) from None
        return msgspec.json.encode(result)

    async def _list(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        return wire.ListResponse(processes=[r.info() for r in entry.processes.running()])

    async def _send_signal(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        msg = wire.decode(body, wire.SendSignalRequest)
        record = self._select(entry, msg.process)
        try:
            send_signal(record, msg.signal)
        except ValueError as exc:
            raise _RpcError("invalid_argument", str(exc)) from None
        return wire.SendSignalResponse()

    async def _send_input(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        msg = wire.decode(body, wire.SendInputRequest)
        record = self._select(entry, msg.process)
        stdin = record.proc.stdin
        data = msg.input.stdin if msg.input is not None else None
        if stdin is None or record.end is not None:
            raise _RpcError("failed_precondition", "process has no open stdin")
        if data:
            try:
                await stdin.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise _RpcError("failed_precondition", f"stdin closed: {exc}") from None
        return wire.SendInputResponse()

    async def _close_stdin(self, entry: SandboxEntry, body: bytes) -> msgspec.Struct:
        msg = wire.decode(body, wire.CloseStdinRequest)
        record = self._select(entry, msg.process)
        if record.proc.stdin is not None:
            await record.proc.stdin.aclose()
        return wire.CloseStdinResponse()

    async def _stream_rpc(
        self, req: Request, entry: SandboxEntry, method: str, fault: Fault | None
    ) -> None:
        body = await req.body()
        ctype = req.headers.get("content-type", "")
        if not ctype.startswith(_STREAM_JSON):
            await req.respond(415, b"", [("accept-post", _STREAM_JSON)])
            return
        try:
            timeout_sec = connect.parse_timeout_ms(req.headers.get("connect-timeout-ms"))
            keepalive = _keepalive_of(req.headers.get("keepalive-ping-interval"))
            envelopes = connect.EnvelopeDecoder().feed(body)
            if len(envelopes) != 1:
                raise connect.ProtocolError("a server-streaming call needs exactly one message")
            payload = envelopes[0].payload
            user = self._user(req)
        except (connect.ProtocolError, InvalidArgumentError) as exc:
            await self._stream_fail(req, _RpcError("invalid_argument", str(exc)))
            return
        try:
            if method == "Start":
                start = wire.decode(payload, wire.StartRequest)
                if start.process is None or not start.process.cmd:
                    raise _RpcError("invalid_argument", "process.cmd is required")
                if start.pty is not None:
                    raise _RpcError("unimplemented", "pty is not supported by the test server")
                env = {**entry.env, **start.process.envs}
                try:
                    record, sub = await entry.processes.start(
                        entry.host,
                        start.process,
                        user=user,
                        env=env,
                        stdin=True if start.stdin is None else start.stdin,
                        tag=start.tag,
                        timeout_sec=timeout_sec,
                    )
                except (InvalidArgumentError, ValueError) as exc:
                    raise _RpcError("invalid_argument", str(exc)) from None
                except SandboxNotRunningError:
                    await self._died(entry)
                    raise _RpcError("unavailable", _GONE_MESSAGE) from None
                except (SandboxError, OSError) as exc:
                    raise _RpcError("internal", f"cannot start process: {exc}") from None
            else:
                conn = wire.decode(payload, wire.ConnectRequest)
                record = self._select(entry, conn.process)
                sub = record.subscribe()
        except _RpcError as err:
            await self._stream_fail(req, err)
            return
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._stream_fail(req, _RpcError("invalid_argument", str(exc)))
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
        if not req.headers.get("content-type", "").startswith(_STREAM_JSON):
            await req.body()
            await req.respond(415, b"", [("accept-post", _STREAM_JSON)])
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
                        raise _RpcError("invalid_argument", "bad StreamInput message")
                    if "start" in event:
                        sel = msgspec.convert(
                            (event["start"] or {}).get("process") or {}, wire.ProcessSelector
                        )
                        record = self._select(entry, sel)
                    elif "data" in event:
                        if record is None:
                            raise _RpcError("failed_precondition", "data before start")
                        raw = ((event["data"] or {}).get("input") or {}).get("stdin")
                        stdin = record.proc.stdin
                        if stdin is None or record.end is not None:
                            raise _RpcError("failed_precondition", "process has no open stdin")
                        if raw:
                            await stdin.send_all(base64.b64decode(raw))
                if not msg.get("more_body", False):
                    break
            decoder.check_complete()
        except _RpcError as err:
            await self._stream_fail(req, err)
            return
        except (
            connect.ProtocolError,
            msgspec.DecodeError,
            msgspec.ValidationError,
            binascii.Error,
        ) as exc:
            await self._stream_fail(req, _RpcError("invalid_argument", str(exc)))
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            await self._stream_fail(req, _RpcError("failed_precondition", f"stdin closed: {exc}"))
            return
        body = connect.encode_envelope(wire.encode(wire.SendInputResponse()))
        await req.respond(200, body + connect.encode_end_stream(), [("content-type", _STREAM_JSON)])

    async def _stream_fail(self, req: Request, err: _RpcError) -> None:
        end = connect.encode_end_stream(connect.ConnectError(err.code, err.message))
        await req.respond(200, end, [("content-type", _STREAM_JSON)])

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

        await req.start(200, [("content-type", _STREAM_JSON)])
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
                    err = connect.ConnectError("unavailable", _GONE_MESSAGE)
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

        await req.start(200, [("content-type", _STREAM_JSON)])
        await emit(wire.ProcessEvent(start=wire.StartEvent(pid=record.pid)))
        graceful = fault.kind == "goaway" and fault.code == 0
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
                if graceful:
                    await emit(event)
                    break
            else:
                await emit(event)
        if record.gone:
            err = connect.ConnectError("unavailable", _GONE_MESSAGE)
            await req.write(connect.encode_end_stream(err), more=False)
            return
        if graceful:
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


class _LostResponse:
    """Stands in for a Request while its handler runs; swallows the response."""

    def __init__(self, req: Request) -> None:
        self._req = req
        self.method = req.method
        self.path = req.path
        self.http_version = req.http_version
        self.headers = req.headers
        self.query = req.query
        self.started = False
        self.finished = False

    def param(self, name: str) -> str | None:
        return self._req.param(name)

    async def body(self, limit: int = 1 << 30) -> bytes:
        return await self._req.body(limit)

    async def respond(self, status: int, body: bytes = b"", headers: Any = ()) -> None:
        return None

    async def respond_json(self, status: int, value: Any, headers: Any = ()) -> None:
        return None


def is_abort(exc: BaseException) -> bool:
    if isinstance(exc, AbortConnection):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(AbortConnection) is not None
    return False


def _keepalive_of(value: str | None) -> float:
    if value is None:
        return _DEFAULT_KEEPALIVE_SEC
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidArgumentError(f"bad Keepalive-Ping-Interval: {value!r}") from None
    if not 0 < seconds <= 3600:
        raise InvalidArgumentError(f"Keepalive-Ping-Interval out of range: {value!r}")
    return seconds


def _envd_version() -> str:
    from ._registry import ENVD_VERSION

    return ENVD_VERSION
