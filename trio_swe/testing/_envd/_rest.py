"""The REST lifecycle API: create, get, list, kill, timeout, connect (``X-API-Key``)."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote

import msgspec
import trio

from ..._errors import (
    InvalidArgumentError,
    SandboxError,
)
from ...sandbox.e2b import _wire as wire
from ._asgi import Request
from ._base import (
    MAX_TTL_SEC,
    AppBase,
)
from ._registry import ENVD_VERSION, SandboxEntry


class RestRoutes(AppBase):
    """``/sandboxes`` and ``/v2/sandboxes``."""

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
            await req.respond_json(200, self._listed(req))
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

    def _listed(self, req: Request) -> list[dict[str, object]]:
        """``GET /v2/sandboxes``: filtered by ``metadata`` (form-encoded pairs, each quoted, as
        the SDK sends them; all must match) and ``state`` (every sandbox here is running). One
        page: no ``x-next-token``."""
        wanted = {
            unquote(k): unquote(v)
            for k, v in parse_qsl(req.param("metadata") or "", keep_blank_values=True)
        }
        states = (req.param("state") or "running").split(",")
        out: list[dict[str, object]] = []
        for sandbox_id in self.registry.live_ids():
            entry = self.registry.get(sandbox_id)
            if entry is None or "running" not in states:
                continue
            if all(entry.metadata.get(k) == v for k, v in wanted.items()):
                out.append(entry.detail(self.domain))
        return out

    def _timeout_of(self, body: bytes) -> float:
        try:
            t = msgspec.json.decode(body, type=wire.TimeoutRequest).timeout
        except msgspec.DecodeError:
            t = int(self.default_ttl_sec)
        return float(min(max(t, 0), MAX_TTL_SEC))

    def _info(self, entry: SandboxEntry) -> wire.SandboxInfo:
        return wire.SandboxInfo(
            template_id=entry.template_id,
            sandbox_id=entry.id,
            client_id="local",
            envd_version=ENVD_VERSION,
            envd_access_token=entry.token,
            domain=self.domain,
        )

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
        try:
            if key is None:
                entry = await self._create(new, image, ttl)
            else:
                entry = await self._create_once(key, new, image, ttl)
        except (SandboxError, InvalidArgumentError, OSError) as exc:
            await req.respond_json(500, {"code": 500, "message": f"cannot create sandbox: {exc}"})
            return
        # The answer is sent with no lock held: a client that vanished may leave this send
        # stuck in hypercorn's drain, and a retry with the same key must not wait behind it.
        await req.respond_json(201, self._info(entry))

    async def _create_once(
        self, key: str, new: wire.NewSandbox, image: str, ttl: float
    ) -> SandboxEntry:
        """The sandbox of ``key``: the one an earlier create booted, or a new one.

        The lock covers the boot and the bookkeeping only. The boot is shielded: once begun it
        completes and is recorded under the key even if its client vanished, so the next create
        with that key gets it (and a boot that fails records nothing: the next one boots anew).
        """
        async with self._create_lock(key):
            known = self.registry.get(self._idempotent.get(key, ""))
            if known is not None:
                return known
            with trio.CancelScope(shield=True):
                entry = await self._create(new, image, ttl)
                self._idempotent[key] = entry.id
            return entry

    def _create_lock(self, key: str) -> trio.Lock:
        lock = self._create_locks.get(key)
        if lock is None:
            lock = self._create_locks[key] = trio.Lock()
        return lock

    async def _create(self, new: wire.NewSandbox, image: str, ttl: float) -> SandboxEntry:
        return await self.registry.create(
            template_id=new.template_id,
            image=image,
            ttl_sec=min(max(ttl, 0.0), MAX_TTL_SEC),
            metadata=new.metadata or {},
            env=new.env_vars or {},
        )
