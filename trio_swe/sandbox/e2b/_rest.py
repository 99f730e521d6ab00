"""E2B's REST API, the lifecycle subset: create, list, kill, set timeout, connect.

``POST /v2/sandboxes`` (201), ``GET /v2/sandboxes?metadata=...`` (200, paged by the
``x-next-token`` header), ``DELETE /sandboxes/{id}`` (204; 404 means already gone, which is
success for a kill), ``POST /sandboxes/{id}/timeout`` (204), ``POST /sandboxes/{id}/connect``
(200 running / 201 resumed). Header ``X-API-KEY``. A create carries an ``Idempotency-Key`` so
that retrying it after an ambiguous failure does not boot a second sandbox.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Mapping
from urllib.parse import quote, urlencode

from . import _connect, _wire
from ._fetch import Answer, Transport, fetch
from ._retry import RetryPolicy, RetryStats


class RestClient:
    """The lifecycle API at ``pool.origin``.

    Args:
        pool: connections to the API origin.
        api_key: sent as ``X-API-KEY``.
        policy, stats, rng: retry policy and counters (shared with the backend).
        request_timeout: bound on one attempt (a create boots a VM: allow time).
    """

    def __init__(
        self,
        pool: Transport,
        api_key: str | None,
        *,
        policy: RetryPolicy,
        stats: RetryStats,
        rng: random.Random,
        request_timeout: float = 120.0,
    ) -> None:
        self.pool = pool
        self.headers = {"x-api-key": api_key} if api_key else {}
        self._headers = [(k.encode(), v.encode()) for k, v in self.headers.items()]
        self.policy = policy
        self.stats = stats
        self.rng = rng
        self.request_timeout = request_timeout
        self.rpcs = 0
        self.resets = 0

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        ok: tuple[int, ...],
        idempotent: bool,
    ) -> Answer:
        extra = {**({"content-type": "application/json"} if json else {}), **(headers or {})}
        return await fetch(
            self.pool,
            method,
            path,
            headers=self._headers + [(k.encode(), v.encode()) for k, v in extra.items()],
            body=json,
            ok=ok,
            idempotent=idempotent,
            timeout=self.request_timeout,
            policy=self.policy,
            stats=self.stats,
            rng=self.rng,
            owner=self,
        )

    async def create(
        self,
        template: str,
        *,
        timeout_sec: int,
        metadata: Mapping[str, str],
        env_vars: Mapping[str, str],
        allow_internet_access: bool | None = None,
        idempotency_key: str | None = None,
    ) -> _wire.SandboxInfo:
        """Boot a sandbox; retried safely thanks to the ``Idempotency-Key``."""
        body = _wire.NewSandbox(
            template_id=template,
            timeout=timeout_sec,
            metadata=dict(metadata) or None,
            env_vars=dict(env_vars) or None,
            allow_internet_access=allow_internet_access,
        )
        resp = await self._call(
            "POST",
            "/v2/sandboxes",
            json=_wire.encode(body),
            headers={"idempotency-key": idempotency_key or uuid.uuid4().hex},
            ok=(200, 201),
            idempotent=True,
        )
        return _wire.decode(resp.content, _wire.SandboxInfo)

    async def list(
        self, *, metadata: Mapping[str, str], states: tuple[str, ...] = ("running", "paused")
    ) -> list[_wire.ListedSandbox]:
        """Every sandbox whose metadata has all of ``metadata``'s pairs (filtered by the API),
        in the given states, following the pages."""
        # The API takes the pairs as one form-encoded parameter, each key and value quoted
        # first (as the official SDK sends them).
        params = {
            "metadata": urlencode({quote(k): quote(v) for k, v in metadata.items()}),
            "state": ",".join(states),
            "limit": "100",
        }
        out: list[_wire.ListedSandbox] = []
        while True:
            resp = await self._call(
                "GET", f"/v2/sandboxes?{urlencode(params)}", ok=(200,), idempotent=True
            )
            out += _wire.decode(resp.content, list[_wire.ListedSandbox])
            token = resp.header("x-next-token")
            if not token:
                return out
            params["nextToken"] = token

    async def kill(self, sandbox_id: str) -> bool:
        """Kill a sandbox; False when it was already gone (404), which is not an error."""
        try:
            await self._call(
                "DELETE", f"/sandboxes/{quote(sandbox_id, safe='')}", ok=(200, 204), idempotent=True
            )
        except _connect.ConnectError as exc:
            if exc.http_status == 404:
                return False
            raise
        return True

    async def exists(self, sandbox_id: str) -> bool:
        """``GET /sandboxes/{id}``: False when the API no longer knows the sandbox (404)."""
        try:
            await self._call(
                "GET", f"/sandboxes/{quote(sandbox_id, safe='')}", ok=(200,), idempotent=True
            )
        except _connect.ConnectError as exc:
            if exc.http_status == 404:
                return False
            raise
        return True

    async def set_timeout(self, sandbox_id: str, timeout_sec: int) -> None:
        """Make the sandbox live ``timeout_sec`` from now."""
        await self._call(
            "POST",
            f"/sandboxes/{quote(sandbox_id, safe='')}/timeout",
            json=_wire.encode(_wire.TimeoutRequest(timeout=timeout_sec)),
            ok=(200, 204),
            idempotent=True,
        )

    async def connect(self, sandbox_id: str, timeout_sec: int) -> _wire.SandboxInfo:
        """Connect to (and resume, if paused) an existing sandbox."""
        resp = await self._call(
            "POST",
            f"/sandboxes/{quote(sandbox_id, safe='')}/connect",
            json=_wire.encode(_wire.TimeoutRequest(timeout=timeout_sec)),
            ok=(200, 201),
            idempotent=True,
        )
        return _wire.decode(resp.content, _wire.SandboxInfo)
