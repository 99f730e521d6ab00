"""The ASGI app: E2B's REST lifecycle API and envd's process and file APIs, with app-level faults.

Routes (one origin serves both, like ``api_url`` and ``sandbox_url`` pointing at one server):

* REST (``X-API-Key``): ``POST /sandboxes``, ``POST /v2/sandboxes``, ``GET /sandboxes/{id}``,
  ``DELETE /sandboxes/{id}``, ``POST /sandboxes/{id}/timeout``,
  ``POST /sandboxes/{id}/connect`` and ``POST /v2/sandboxes/{id}/connect``.
* envd (routed by the ``E2b-Sandbox-Id`` header, or a ``49983-<id>.<domain>`` Host; checked
  against ``X-Access-Token``): ``GET /health``, ``GET``/``POST /files``, and Connect RPCs
  (JSON codec) of ``process.Process`` and ``filesystem.Filesystem``.

This module decides each request's fault and routes it; the route groups live in ``_rest``,
``_files``, ``_rpc`` and ``_streams``, their shared state and helpers in ``_base``.
"""

from __future__ import annotations

import logging
from typing import Final

import trio

from ._asgi import ClientGone, Receive, Request, Scope, Send
from ._base import FAULT_HEADER, FaultHandoff, is_abort
from ._faults import APP_KINDS, FRAME_KINDS, Fault
from ._files import FileRoutes
from ._rest import RestRoutes
from ._rpc import RpcRoutes

_log = logging.getLogger("trio_swe.testing")

__all__ = ["FAULT_HEADER", "EnvdApp", "FaultHandoff", "is_abort"]

_ALL_KINDS: Final = APP_KINDS | FRAME_KINDS


class EnvdApp(RestRoutes, FileRoutes, RpcRoutes):
    """The ASGI application. Built by :func:`trio_swe.testing.open_envd_server`."""

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
