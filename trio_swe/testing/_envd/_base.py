"""Shared state and helpers of the envd app: errors, fault hand-off, routing, auth."""

from __future__ import annotations

import base64
import binascii
import logging
import posixpath
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from ..._errors import InvalidArgumentError
from ._asgi import Request
from ._faults import FRAME_KINDS, Fault, FaultPlan
from ._registry import SandboxEntry, SandboxRegistry

_log = logging.getLogger("trio_swe.testing")

#: Header the fault proxy puts on every HTTP/2 request it forwards: the id of the app-level fault
#: it decided for it, or ``-`` for none. Clients' own copies are stripped by the proxy.
FAULT_HEADER: Final = "trio-swe-fault"
#: The SDK's sandbox id in debug mode.
DEBUG_SANDBOX_ID: Final = "debug_sandbox_id"
DEFAULT_KEEPALIVE_SEC: Final = 90.0
MAX_TTL_SEC: Final = 24 * 3600.0
_HOST_RE: Final = re.compile(r"^(\d+)-([A-Za-z0-9_-]+)\.")
STREAM_JSON: Final = "application/connect+json"
GONE_MESSAGE: Final = "The sandbox was not found"


class AbortConnection(Exception):
    """Raised inside a handler after the response started: hypercorn drops an HTTP/1.1
    connection when the app fails mid-response (the HTTP/1.1 stand-in for frame faults)."""


class RpcError(Exception):
    """A Connect error a handler answers with (``code`` is a Connect code)."""

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


class AppBase:
    """State shared by the route groups of :class:`~._app.EnvdApp`."""

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
        serve_max_bytes: int,
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
        self.serve_max_bytes = serve_max_bytes
        self._idempotent: dict[str, str] = {}
        self._create_locks: dict[str, trio.Lock] = {}
        self.stats = Stats()
        self._debug_lock = trio.Lock()

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
        lost = LostResponse(req)
        await handler(lost)  # type: ignore[arg-type]
        self.plan.record(fault)
        await self._abort(req, fault)

    def image_for(self, template: str) -> str | None:
        """The image (directory or ``path@commit``) of a template, or None when unknown."""
        if self.templates is None:
            return self.default_image
        return self.templates.get(template)

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
                        ttl_sec=MAX_TTL_SEC,
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
                "message": GONE_MESSAGE,
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

    def _abs_path(self, path: str, user: str) -> str:
        """envd's resolution of a path (or a ``cwd``): ``~`` and relative paths, an empty one
        too, are in the user's home."""
        if path.startswith("/"):
            return posixpath.normpath(path)
        home = "/root" if user == "root" else f"/home/{user}"
        if path == "~" or path.startswith("~/"):
            path = path[2:]
        return posixpath.normpath(posixpath.join(home, path))


class LostResponse:
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


def keepalive_of(value: str | None) -> float:
    if value is None:
        return DEFAULT_KEEPALIVE_SEC
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidArgumentError(f"bad Keepalive-Ping-Interval: {value!r}") from None
    if not 0 < seconds <= 3600:
        raise InvalidArgumentError(f"Keepalive-Ping-Interval out of range: {value!r}")
    return seconds
