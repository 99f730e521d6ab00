"""envd's HTTP API: ``/health`` and ``GET``/``POST /files``."""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Final

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotRunningError,
    SandboxPermissionError,
)
from ._asgi import Request
from ._base import (
    AppBase,
)
from ._faults import Fault
from ._multipart import MultipartError, boundary_of, parse_multipart
from ._registry import SandboxEntry

#: The most a GET reads by default (the test server keeps a body in memory).
SERVE_MAX_BYTES: Final = 1 << 30
_RANGE = re.compile(r"^bytes=0-(\d+)$")


def _range_limit(header: str | None) -> int | None:
    """Bytes asked for by ``Range: bytes=0-N`` (N + 1); other ranges are ignored (a full body)."""
    m = _RANGE.match(header or "")
    return int(m.group(1)) + 1 if m else None


async def _serve_bytes(
    entry: SandboxEntry, full: str, user: str, limit: int | None, serve_max: int
) -> bytes:
    """What envd's download sends: anything it can open (a device, a FIFO: it blocks), up to
    ``limit`` bytes; a directory is a 400. Cancelled, the reader is killed."""
    sb = entry.sandbox
    q = shlex.quote(full)
    probe = await sb.exec(
        f"[ -e {q} ] || exit 44; [ -d {q} ] && exit 45; exit 0", user=user, cwd="/"
    )
    if probe.exit_code == 44:
        raise SandboxFileNotFoundError(full)
    if probe.exit_code == 45:
        raise SandboxError(f"path '{full}' is a directory")
    cap = serve_max if limit is None else min(limit, serve_max)
    proc = await entry.host.start_process(["head", "-c", str(cap), "--", full], user=user, cwd="/")
    data = bytearray()
    try:
        assert proc.stdout is not None
        while chunk := await proc.stdout.receive_some(1 << 16):
            data += chunk
        status = await proc.wait()
        err = b""
        if proc.stderr is not None:
            while piece := await proc.stderr.receive_some(1 << 16):
                err += piece
    finally:
        await proc.aclose()
    if status != 0:
        raise SandboxError(err.decode(errors="replace").strip() or f"head exited with {status}")
    return bytes(data)


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
            limit = _range_limit(req.headers.get("range"))
            try:
                data = await _serve_bytes(entry, full, user, limit, self.serve_max_bytes)
            except SandboxFileNotFoundError:
                await req.respond_json(404, {"code": 404, "message": f"path '{full}' not found"})
                return
            except SandboxNotRunningError:
                await self._died(entry)
                await self._gone(req, read_body=False)
                return
            except SandboxPermissionError as exc:
                await req.respond_json(403, {"code": 403, "message": str(exc)})
                return
            except (InvalidArgumentError, SandboxError) as exc:
                await req.respond_json(400, {"code": 400, "message": str(exc)})
                return
            headers = [("content-type", "application/octet-stream")]
            if limit is not None and data:
                headers.append(("content-range", f"bytes 0-{len(data) - 1}/*"))
                await req.respond(206, data, headers)
                return
            await req.respond(200, data, headers)
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
            except SandboxPermissionError as exc:
                await req.respond_json(403, {"code": 403, "message": str(exc)})
                return
            except (InvalidArgumentError, SandboxError) as exc:
                await req.respond_json(400, {"code": 400, "message": str(exc)})
                return
            # envd always writes "type" (WrittenFile omits its default when encoding).
            written.append({"path": full, "name": posixpath.basename(full), "type": "file"})
        await req.respond_json(200, written)
