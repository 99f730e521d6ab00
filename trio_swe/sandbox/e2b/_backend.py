"""``E2BBackend``: sandboxes from E2B (or anything speaking its REST API and envd), on trio."""

from __future__ import annotations

import math
import os
import random
import re
import ssl
import uuid
from collections.abc import Mapping
from typing import Any, Final

import trio

from ..._errors import ConfigError, InvalidArgumentError, PermanentBootError, SandboxBootError
from .._images import ImageMap, ImageSource
from .._types import BackendStatistics, SandboxSpec
from . import _connect
from ._envd import ENVD_PORT, EnvdClient
from ._fetch import Transport
from ._h2conn import ping_interval_for, ping_timeout_for
from ._h2pool import H2Pool
from ._httpxpool import ConnectionPool
from ._lanes import DEFAULT_MAX_CONNECTIONS, DEFAULT_STREAMS_PER_CONNECTION, PoolStatistics
from ._rest import RestClient
from ._retry import RetryPolicy, RetryStats
from ._sandbox import DEFAULT_MAX_OUTPUT_BYTES, E2BSandbox

#: E2B's own domains route every sandbox through one origin, ``https://sandbox.<domain>``.
_SHARED_ORIGIN_DOMAINS: Final = frozenset(
    {
        "e2b.app",
        "e2b.dev",
        "e2b.pro",
        "e2b-staging.dev",
        "e2b-tango.dev",
        "e2b-juliett.dev",
        "foxtrot-2.e2b.dev",
    }
)
_USER_AGENT: Final = "trio-swe-e2b/0.1"

#: envd's keepalive interval on the purpose-built HTTP/2 client: the official SDK's 50 s. Below
#: the 60 s idle timeout common in proxies (nginx, AWS ALB), and E2B's edge carries streams this
#: quiet for the SDK. That client judges silence per connection (a stream's watchdog first syncs
#: the connection with a PING) and finds a dead connection by its own PINGs (within
#: ``ping_interval_for + ping_timeout_for``, 60 s), so keepalives only keep intermediaries from
#: cutting idle streams; at 10,000 streams, 15 s of them were ~20 % of a core, 50 s ~6 %.
H2_KEEPALIVE_SEC: Final = 50.0
#: envd over HTTP/1.1 (httpx: a plain ``http://`` origin without h2c) cannot sync a connection:
#: its per-stream watchdog (2.5 x this + 1 s) is what finds a dead stream, so it keeps the shorter
#: interval.
HTTPX_KEEPALIVE_SEC: Final = 15.0


def _env_bool(name: str) -> bool:
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes")


#: A Docker image reference with a repository path (``swebench/sweb.eval...:latest``): what
#: SWE-bench rows name, and never an E2B template (names and ids have no ``/``).
_DOCKER_REF_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(?::[0-9]+)?/\S+$")


class E2BBackendStatistics(BackendStatistics, frozen=True, kw_only=True):
    """The E2B backend's counters: sandboxes, every retried call, the connection pools.

    Attributes:
        debug: the backend talks to a local envd (``E2B_DEBUG``).
        calls: calls made through the retry loop (REST and envd).
        attempts: attempts of those calls (first tries and retries).
        retries: attempts after a transient failure.
        resets: connection pool resets after protocol errors.
        gave_up: calls that failed for good after retrying.
        failures: transient failures by kind (``"stream_reset"``, ``"goaway"``, ...).
        pools: one entry per origin.
    """

    debug: bool
    calls: int
    attempts: int
    retries: int
    resets: int
    gave_up: int
    failures: dict[str, int]
    pools: tuple[PoolStatistics, ...]


class E2BBackend(trio.abc.AsyncResource):
    """Sandboxes on E2B, through its REST API (lifecycle) and envd (processes, files).

    Configured like the official SDK: every argument left ``None`` is read from its environment
    variable (``E2B_API_KEY``, ``E2B_DOMAIN``, ``E2B_API_URL``, ``E2B_SANDBOX_URL``,
    ``E2B_DEBUG``). Use it through :func:`trio_swe.open_sandbox` with a template name as the
    image, and close it (``async with E2BBackend() as backend`` or :meth:`aclose`) when done.

    Args:
        api_key: REST API key (``X-API-KEY``); required unless ``debug``.
        domain: E2B domain (default ``e2b.app``).
        api_url: REST API base URL (default ``https://api.<domain>``; debug
            ``http://localhost:3000``).
        sandbox_url: envd base URL for every sandbox (default: ``https://sandbox.<domain>`` for
            E2B's domains, ``https://49983-<id>.<domain>`` otherwise, debug
            ``http://localhost:49983``). Requests are routed by the ``E2b-Sandbox-Id`` and
            ``E2b-Sandbox-Port`` headers.
        debug: skip the REST API and talk to one envd directly, as the SDK's debug mode does.
        verify: TLS verification: ``True``, a CA bundle path, or an ``ssl.SSLContext``
            (default: ``SSL_CERT_FILE`` if set, else the system/certifi store).
        h2c: speak HTTP/2 with prior knowledge to ``http://`` URLs (HTTP/1.1 otherwise). envd's
            HTTP/2 (``https://`` or h2c) goes over the purpose-built client of :mod:`._h2conn`;
            the REST API over httpx, and so does envd on HTTP/1.1.
        streams_per_connection: concurrent streams per HTTP/2 connection (E2B's edge allows 100).
        max_connections: connections per origin.
        keepalive_interval: seconds between envd keepalive events on streams; a stream silent
            for 2.5 times that (+ 1 s) is re-attached (on the h2 client: once a PING showed the
            connection itself is not behind). Default: 50 s on HTTP/2 (the SDK's), 15 s on
            HTTP/1.1 (see :data:`H2_KEEPALIVE_SEC`).
        retry_policy: attempts and backoff of transient failures.
        request_timeout: bound on one unary request or file transfer.
        max_output_bytes: ``exec`` keeps the last this many bytes of output.
        seed: seeds the backoff jitter (tests).
        images: which template each row boots (the image-mapping hook ``image_for``): instance
            id -> template, or a function of the instance metadata returning one (None: the
            row's own image, which must then be a template name or id).
    """

    name = "e2b"

    def __init__(
        self,
        api_key: str | None = None,
        domain: str | None = None,
        api_url: str | None = None,
        sandbox_url: str | None = None,
        debug: bool | None = None,
        *,
        verify: ssl.SSLContext | str | bool | None = None,
        h2c: bool = False,
        streams_per_connection: int = DEFAULT_STREAMS_PER_CONNECTION,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        keepalive_interval: float | None = None,
        retry_policy: RetryPolicy | None = None,
        request_timeout: float = 60.0,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        seed: int | None = None,
        images: ImageSource | None = None,
    ) -> None:
        self.image_for = ImageMap(images)
        self.debug = _env_bool("E2B_DEBUG") if debug is None else debug
        self.api_key = api_key or os.environ.get("E2B_API_KEY") or None
        self.domain = domain or os.environ.get("E2B_DOMAIN") or "e2b.app"
        self.api_url = (
            api_url
            or os.environ.get("E2B_API_URL")
            or ("http://localhost:3000" if self.debug else f"https://api.{self.domain}")
        ).rstrip("/")
        url = sandbox_url or os.environ.get("E2B_SANDBOX_URL")
        self.sandbox_url = url.rstrip("/") if url else None
        if not self.debug and not self.api_key:
            raise ConfigError("E2BBackend needs an API key: pass api_key= or set E2B_API_KEY")
        if keepalive_interval is not None and not (
            keepalive_interval > 0 and math.isfinite(keepalive_interval)
        ):
            raise ConfigError(f"keepalive_interval must be positive, got {keepalive_interval}")
        if verify is None:
            verify = os.environ.get("SSL_CERT_FILE") or True
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self._verify: ssl.SSLContext | bool = verify
        self._h2c = h2c
        self._per_conn = streams_per_connection
        self._max_conns = max_connections
        self._keepalive = keepalive_interval
        self._policy = retry_policy or RetryPolicy()
        self._request_timeout = request_timeout
        self._max_output = max_output_bytes
        self._rng = random.Random(seed)
        self._stats = RetryStats()
        self._pools: dict[tuple[str, str], Transport] = {}
        self._token: object | None = None
        self._created = 0
        self._killed = 0
        self._boot_failures = 0
        self._live: set[str] = set()

    # --- connections ---------------------------------------------------------------------

    def _pool(self, origin: str, *, envd: bool = False) -> Transport:
        """The pool of ``origin``: envd's HTTP/2 over the h2 client, the rest over httpx (the
        REST API, and envd on a plain ``http://`` origin without h2c: HTTP/1.1)."""
        token = trio.lowlevel.current_trio_token()
        if token is not self._token:
            # Connections are bound to the trio run that made them; a new run starts over.
            self._pools = {}
            self._token = token
        h2c = self._h2c and origin.startswith("http://")
        tls = origin.startswith("https://")
        lean = envd and (h2c or tls)
        key = ("h2" if lean else "httpx", origin)
        pool = self._pools.get(key)
        if pool is None:
            if lean:
                pool = H2Pool(
                    origin,
                    verify=self._verify,
                    streams_per_connection=self._per_conn,
                    max_connections=self._max_conns,
                    headers={"user-agent": _USER_AGENT},
                    ping_interval=ping_interval_for(self._keepalive_for(pool_is_h2=True)),
                    ping_timeout=ping_timeout_for(self._keepalive_for(pool_is_h2=True)),
                )
            else:
                pool = ConnectionPool(
                    origin,
                    # HTTP/2 only where it can be had (ALPN or h2c): an HTTP/1.1 client limited to
                    # HTTP/2's two connections ran two of a lane's streams at once.
                    http2=tls,
                    h2c=h2c,
                    verify=self._verify,
                    streams_per_connection=self._per_conn,
                    max_connections=self._max_conns,
                    headers={"user-agent": _USER_AGENT},
                )
            self._pools[key] = pool
        return pool

    def _keepalive_for(self, *, pool_is_h2: bool) -> float:
        if self._keepalive is not None:
            return self._keepalive
        return H2_KEEPALIVE_SEC if pool_is_h2 else HTTPX_KEEPALIVE_SEC

    def _rest(self) -> RestClient:
        return RestClient(
            self._pool(self.api_url),
            self.api_key,
            policy=self._policy,
            stats=self._stats,
            rng=self._rng,
            request_timeout=max(self._request_timeout, 120.0),
        )

    def envd_url(self, sandbox_id: str, sandbox_domain: str | None = None) -> str:
        """Where a sandbox's envd is reached (the SDK's rules)."""
        if self.sandbox_url:
            return self.sandbox_url
        if self.debug:
            return f"http://localhost:{ENVD_PORT}"
        dom = sandbox_domain or self.domain
        if dom in _SHARED_ORIGIN_DOMAINS:
            return f"https://sandbox.{dom}"
        return f"https://{ENVD_PORT}-{sandbox_id}.{dom}"

    # --- Backend protocol ----------------------------------------------------------------

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> E2BSandbox:
        """Boot a sandbox from template ``spec.image``.

        If this is cancelled or fails after the REST API may have created the sandbox, the
        create is replayed under the same ``Idempotency-Key`` (shielded, bounded) to learn its
        id, and it is killed: no sandbox leaks.

        Raises:
            SandboxBootError: the API refused or kept failing.
        """
        rest: RestClient | None = None
        token: str | None = None
        domain: str | None = None
        if self.debug:
            self._created += 1
            sandbox_id = "debug_sandbox_id"  # the SDK's debug-mode id: one envd, one sandbox
        else:
            rest = self._rest()
            key = uuid.uuid4().hex
            kwargs: dict[str, Any] = {
                "timeout_sec": max(1, math.ceil(spec.ttl_sec)),
                "metadata": spec.metadata,
                "env_vars": spec.env,
                "allow_internet_access": None if spec.network else False,
                "idempotency_key": key,
            }
            try:
                info = await rest.create(spec.image, **kwargs)
            except BaseException as exc:
                self._boot_failures += 1
                refused = isinstance(exc, _connect.ConnectError) and exc.http_status in range(
                    400, 429
                )
                if not refused:  # the API may have created it: find it and kill it
                    await self._reap_ambiguous_create(rest, spec.image, kwargs)
                if refused and exc.http_status in (400, 404):  # type: ignore[attr-defined]
                    # An unknown template or a refused spec: the same answer every time.
                    raise PermanentBootError(
                        f"E2B refused the sandbox for {spec.image!r}: {exc!r}"
                    ) from exc
                if isinstance(exc, Exception):
                    raise SandboxBootError(f"could not create an E2B sandbox: {exc!r}") from exc
                raise
            self._created += 1
            sandbox_id, token, domain = info.sandbox_id, info.envd_access_token, info.domain
        headers = {"e2b-sandbox-id": sandbox_id, "e2b-sandbox-port": str(ENVD_PORT)}
        if token:
            headers["x-access-token"] = token
        pool = self._pool(self.envd_url(sandbox_id, domain), envd=True)
        envd = EnvdClient(
            pool,
            headers,
            policy=self._policy,
            stats=self._stats,
            rng=self._rng,
            keepalive_interval=self._keepalive_for(pool_is_h2=isinstance(pool, H2Pool)),
            request_timeout=self._request_timeout,
        )
        self._live.add(sandbox_id)
        return E2BSandbox(
            sandbox_id=sandbox_id,
            spec=spec,
            nursery=nursery,
            envd=envd,
            rest=rest,
            stats=self._stats,
            max_output_bytes=self._max_output,
            on_killed=self._forget,
        )

    async def _reap_ambiguous_create(
        self, rest: RestClient, template: str, kwargs: dict[str, Any]
    ) -> None:
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + 30.0
            try:
                info = await rest.create(template, **kwargs)
                await rest.kill(info.sandbox_id)
            except Exception:
                pass  # the API is down: the sandbox (if any) dies at its TTL

    async def kill_sandboxes(self, metadata: Mapping[str, str]) -> list[str]:
        """Kill every sandbox of this API key whose metadata has all of ``metadata``'s pairs.

        For sandboxes whose owner is gone (a process killed outright): the REST API lists them
        by metadata, and each is killed. Returns the ids killed (not those already gone).

        Raises:
            InvalidArgumentError: ``metadata`` is empty (that would match every sandbox).
        """
        if not metadata:
            raise InvalidArgumentError("kill_sandboxes needs at least one metadata pair")
        if self.debug:
            return []  # one envd, no REST API: nothing to list
        rest = self._rest()
        killed = []
        for listed in await rest.list(metadata=metadata):
            if await rest.kill(listed.sandbox_id):
                killed.append(listed.sandbox_id)
                self._live.discard(listed.sandbox_id)
        return killed

    def _forget(self, sandbox: E2BSandbox) -> None:
        if sandbox.id in self._live:
            self._live.discard(sandbox.id)
            self._killed += 1

    async def aclose(self) -> None:
        """Close every connection of this backend (sandboxes are not killed here)."""
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()

    def check_image(self, image: str, *, commit: str | None = None) -> str | None:
        """Why ``image`` is no E2B template reference, or None (no request is made: whether
        the template exists, and its checkout's commit, are checked once booted)."""
        if not image.strip() or any(c.isspace() for c in image) or _DOCKER_REF_RE.match(image):
            return (
                f"image_not_a_template:{image!r} is not an E2B template name or id (a Docker "
                "image name? map rows to templates with E2BBackend(images=...))"
            )
        return None

    def statistics(self) -> E2BBackendStatistics:
        return E2BBackendStatistics(
            debug=self.debug,
            created=self._created,
            killed=self._killed,
            live=len(self._live),
            boot_failures=self._boot_failures,
            **self._stats.snapshot(),
            pools=tuple(p.statistics() for p in self._pools.values()),
        )
