"""envd's HTTP API: ``/health`` and ``GET``/``POST /files``."""

from __future__ import annotations

import posixpath

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotRunningError,
)
from ._asgi import Request
from ._base import (
    AppBase,
)
from ._faults import Fault
from ._multipart import MultipartError, boundary_of, parse_multipart
from ._registry import SandboxEntry


class FileRoutes(AppBase):
    """``/health`` and ``/files``."""

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
