"""``open_envd_server``: hypercorn (trio worker) serving the envd app, optionally behind the
HTTP/2 fault proxy, on loopback with an ephemeral port."""

from __future__ import annotations

import logging
import os
import ssl
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import msgspec
import trio

from ..._errors import ConfigError, InvalidArgumentError
from ...sandbox._protocol import Backend
from ._app import EnvdApp, FaultHandoff, is_abort
from ._faults import FaultPlan
from ._files import SERVE_MAX_BYTES
from ._h2proxy import FaultProxyStatistics
from ._hypercorn import serve_connections
from ._registry import SandboxRegistry

_log = logging.getLogger("trio_swe.testing")

#: E2B's default user (its templates' ``set_user`` default), also the server's.
E2B_USER = "user"


class _DropInjectedAborts(logging.Filter):
    """hypercorn logs every exception an app raises; injected HTTP/1.1 aborts are not errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not is_abort(exc)


_hypercorn_log = logging.getLogger("trio_swe.testing.hypercorn")
_hypercorn_log.addFilter(_DropInjectedAborts())


class EnvdServerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`EnvdServer.statistics` reports.

    Attributes:
        requests: HTTP requests served.
        requests_by_path: of them, by path (``/process.Process/Start``, ``/v2/sandboxes``...).
        streams_open: streaming RPCs in flight now.
        streams_total: streaming RPCs served in all.
        live_sandboxes: sandboxes alive now.
        sandboxes_created: sandboxes created.
        sandboxes_killed: sandboxes killed through the API.
        sandboxes_reclaimed: sandboxes whose time to live ran out.
        sandboxes_died: sandboxes found dead on their own (and reclaimed).
        processes_running: processes running in all sandboxes.
        faults_injected: faults injected, by kind (app-level and frame-level).
        connections: client connections accepted.
        connection_errors: connections that ended in an error.
        lean_connections: of the accepted, those served by the lean HTTP/2 server
            (``lean_http2=True``); the others went to hypercorn.
        proxy: the HTTP/2 fault proxy's counters, when it runs.
    """

    requests: int
    requests_by_path: dict[str, int]
    streams_open: int
    streams_total: int
    live_sandboxes: int
    sandboxes_created: int
    sandboxes_killed: int
    sandboxes_reclaimed: int
    sandboxes_died: int
    processes_running: int
    faults_injected: dict[str, int]
    connections: int
    connection_errors: int
    lean_connections: int = 0
    proxy: FaultProxyStatistics | None = None


class EnvdServer:
    """A running local envd-compatible server. Obtain it from :func:`open_envd_server`.

    Attributes:
        api_url: base URL of the REST lifecycle API (``E2B_API_URL``).
        sandbox_url: base URL of envd for every sandbox (``E2B_SANDBOX_URL``); requests pick
            their sandbox with the ``E2b-Sandbox-Id`` header, as through E2B's edge.
        domain: the domain reported in REST answers (``E2B_DOMAIN``).
        api_key: the accepted ``X-API-Key`` (``E2B_API_KEY``), or ``None`` for no check.
        faults: the live :class:`FaultPlan`; add or clear rules while the server runs.
        ca_path: with ``tls=True``, a PEM file of the CA that signed the server's certificate
            (point ``SSL_CERT_FILE`` at it); otherwise ``None``.
    """

    def __init__(
        self,
        *,
        url: str,
        domain: str,
        api_key: str | None,
        app: EnvdApp,
        registry: SandboxRegistry,
        plan: FaultPlan,
        ca: Any | None,
        ca_path: str | None,
        proxy: Any | None,
        connection_stats: Counter[str] | None = None,
    ) -> None:
        self.api_url = url
        self.sandbox_url = url
        self.domain = domain
        self.api_key = api_key
        self.faults = plan
        self.ca_path = ca_path
        self._ca = ca
        self._app = app
        self._registry = registry
        self._proxy = proxy
        self._connections = connection_stats if connection_stats is not None else Counter()

    def live_sandbox_ids(self) -> list[str]:
        """Ids of the sandboxes alive now."""
        return self._registry.live_ids()

    def statistics(self) -> EnvdServerStatistics:
        """Counters: requests by path, streams, sandboxes, processes, faults injected."""
        stats = self._app.stats
        return EnvdServerStatistics(
            requests=sum(stats.requests.values()),
            requests_by_path=dict(stats.requests),
            streams_open=stats.streams_open,
            streams_total=stats.streams_total,
            live_sandboxes=len(self._registry),
            sandboxes_created=self._registry.created,
            sandboxes_killed=self._registry.killed,
            sandboxes_reclaimed=self._registry.reclaimed,
            sandboxes_died=self._registry.died,
            processes_running=self._registry.process_count(),
            faults_injected=dict(self.faults.injected()),
            connections=self._connections["connections"],
            connection_errors=self._connections["connection_errors"],
            lean_connections=self._connections["lean_connections"],
            proxy=self._proxy.statistics() if self._proxy is not None else None,
        )

    def client_ssl_context(self) -> ssl.SSLContext:
        """An SSL context for clients that trusts the server's CA (``tls=True`` only).

        Raises:
            ConfigError: the server runs without TLS.
        """
        if self._ca is None:
            raise ConfigError("the server was opened with tls=False")
        ctx = ssl.create_default_context()
        self._ca.configure_trust(ctx)
        return ctx

    def sdk_env(self, *, debug: bool = False) -> dict[str, str]:
        """Environment variables that point the official ``e2b`` SDK (and
        ``trio_swe``'s E2B backend) at this server."""
        env = {
            "E2B_API_URL": self.api_url,
            "E2B_SANDBOX_URL": self.sandbox_url,
            "E2B_DOMAIN": self.domain,
            "E2B_API_KEY": self.api_key or "unused",
        }
        if debug:
            env["E2B_DEBUG"] = "true"
        if self.ca_path is not None:
            env["SSL_CERT_FILE"] = self.ca_path
        return env

    async def wait_sandbox_gone(self, sandbox_id: str) -> None:
        """Return once the sandbox is dead (killed or reclaimed); at once if unknown."""
        entry = self._registry.get(sandbox_id)
        if entry is not None:
            await entry.dead.wait()

    async def kill_sandbox(self, sandbox_id: str) -> bool:
        """Kill a sandbox from the server side (as if E2B lost it); False when unknown."""
        return await self._registry.kill(sandbox_id)


def _default_backend() -> Backend:
    try:
        from ...sandbox.local import LocalBackend
    except ImportError as exc:  # pragma: no cover - the local backend ships with trio_swe
        raise ConfigError(f"the local backend is unavailable: {exc}") from exc
    # E2B's templates run as `user` (home /home/user); `agent` is the account trio_swe's
    # episodes hand the tree to, which they would create with useradd on E2B (the local
    # sandbox's /etc/passwd is read-only).
    backend: Backend = LocalBackend(users=(E2B_USER, "agent"))
    return backend


@asynccontextmanager
async def open_envd_server(
    *,
    backend: Backend | None = None,
    templates: Mapping[str, str] | None = None,
    api_key: str | None = "test-key",
    tls: bool = False,
    http2: bool = True,
    faults: FaultPlan | None = None,
    fault_proxy: bool | None = None,
    sandbox_ttl_sec: float = 300.0,
    process_retention_sec: float = 30.0,
    default_user: str = "user",
    workdir: str = "/testbed",
    domain: str = "localhost",
    debug_template: str | None = "base",
    max_concurrent_streams: int = 100,
    host: str = "127.0.0.1",
    ca: Any | None = None,
    user_aliases: Mapping[str, str] | None = None,
    lean_http2: bool = False,
    serve_max_bytes: int = SERVE_MAX_BYTES,
) -> AsyncIterator[EnvdServer]:
    """Serve E2B's REST lifecycle API and envd's process/file APIs on loopback.

    Every sandbox is a real sandbox of ``backend`` (by default a
    :class:`trio_swe.sandbox.local.LocalBackend`); commands are real processes. On exit every
    sandbox is killed.

    Args:
        backend: where sandboxes come from. Its sandboxes must offer
            ``start_process(argv, *, user, env, cwd, stdin)`` (the local backend does).
        templates: template name -> image (a directory or ``path@commit``). ``None``: every
            template name boots an empty directory.
        api_key: the ``X-API-Key`` the REST API accepts; ``None`` accepts anything.
        tls: serve HTTPS with a certificate from a fresh trustme CA (ALPN ``h2``,
            ``http/1.1``); see :attr:`EnvdServer.ca_path`. Otherwise plain HTTP/1.1 and h2c
            (prior knowledge).
        http2: offer ``h2`` in ALPN (TLS only; h2c prior knowledge always works).
        faults: the fault plan (see :class:`FaultPlan`); empty plan when ``None``.
        fault_proxy: put the HTTP/2 frame-level fault proxy in front of hypercorn. Default:
            on when ``faults`` is given. Without it HTTP/2 requests only get app-level faults.
        sandbox_ttl_sec: timeout of a sandbox created without one.
        process_retention_sec: how long a finished process's end event stays available to
            ``Connect`` (envd: 30 s).
        default_user: the user of requests that name none (E2B's templates: ``user``, whose
            home ``/home/user`` is where its commands run and relative paths resolve).
        workdir: where the template's image is mounted in every sandbox (E2B templates put
            SWE-bench repositories at ``/testbed``). Commands that name no ``cwd`` run in
            their user's home, as on E2B, not here.
        domain: the domain reported in REST answers.
        debug_template: template of the sandbox lazily created for the SDK's debug-mode id
            ``debug_sandbox_id``; ``None`` refuses debug mode.
        max_concurrent_streams: HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS`` (E2B's edge: 100).
        host: loopback address to bind (``127.0.0.1`` or ``::1``).
        ca: a ``trustme.CA`` to issue the certificate from (default: a fresh one). Reuse one CA
            per process when the client caches its trust store (the e2b SDK does).
        user_aliases: user names mapped to the backend's users (default none: the default
            backend's sandboxes have E2B's ``user`` account, uid 1000 unless the host uses
            it, with a writable ``/home/user``; ``{"user": "agent"}`` suits a
            ``LocalBackend()`` of your own, which has only ``agent``).
        lean_http2: serve HTTP/2-over-TLS connections with a lean server of our own instead
            of hypercorn (which at thousands of streams queues requests and replies in its
            per-frame awaits: the server, not the client, becomes what a load test measures).
            TLS only, no fault proxy (frame faults need hypercorn behind the proxy).
        serve_max_bytes: the most a ``GET /files`` sends (default 1 GiB: the server keeps a
            body in memory); a larger file's body is cut there, ending cleanly, as a server
            with a cap of its own does.

    Yields:
        The running :class:`EnvdServer`.
    """
    if host == "localhost":
        host = "127.0.0.1"  # one address, so every listener shares one port
    if host not in ("127.0.0.1", "::1"):
        raise InvalidArgumentError(f"the test server binds loopback only, not {host!r}")
    from hypercorn.config import Config

    plan = faults if faults is not None else FaultPlan()
    use_proxy = (faults is not None) if fault_proxy is None else fault_proxy
    if lean_http2 and (use_proxy or not tls or not http2):
        raise InvalidArgumentError("lean_http2 needs tls=True, http2=True and no fault proxy")
    handoff = FaultHandoff()
    with tempfile.TemporaryDirectory(prefix="trio-swe-envd-") as tmp:
        default_image = os.path.join(tmp, "empty-template")
        os.mkdir(default_image)
        cert = None
        ca_path = None
        if tls:
            import trustme

            ca = ca if ca is not None else trustme.CA()
            cert = ca.issue_cert("127.0.0.1", "localhost", "::1")
            ca_path = os.path.join(tmp, "ca.pem")
            ca.cert_pem.write_to_path(ca_path)
        async with trio.open_nursery() as nursery:
            registry = SandboxRegistry(
                backend if backend is not None else _default_backend(),
                nursery,
                workdir=workdir,
                retention_sec=process_retention_sec,
            )
            app = EnvdApp(
                registry=registry,
                plan=plan,
                handoff=handoff,
                api_key=api_key,
                templates=templates,
                default_image=default_image,
                default_ttl_sec=sandbox_ttl_sec,
                default_user=default_user,
                domain=domain,
                debug_template=debug_template,
                user_aliases={} if user_aliases is None else user_aliases,
                serve_max_bytes=serve_max_bytes,
            )
            config = Config()
            config.accesslog = None
            config.errorlog = _hypercorn_log
            config.h2_max_concurrent_streams = max_concurrent_streams
            config.keep_alive_timeout = 650.0
            # hypercorn sends GOAWAY after 1000 requests per connection by default; E2B's edge
            # does not, and a GOAWAY must only come from the fault plan.
            config.keep_alive_max_requests = 2**31
            config.include_server_header = False
            alpn = ["h2", "http/1.1"] if http2 else ["http/1.1"]
            ssl_ctx = None
            if tls:
                assert cert is not None
                ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                cert.configure_cert(ssl_ctx)
                ssl_ctx.set_alpn_protocols(alpn)
            # A deep backlog: bursts of connections from 1,000 sandboxes' clients.
            sockets = await trio.open_tcp_listeners(0, host=host, backlog=4096)
            port = sockets[0].socket.getsockname()[1]
            listeners: list[trio.abc.Listener[Any]] = list(sockets)
            if ssl_ctx is not None and not use_proxy:
                listeners = [
                    trio.SSLListener(lst, ssl_ctx, https_compatible=True) for lst in sockets
                ]
            conn_stats: Counter[str] = Counter()
            await nursery.start(
                partial(
                    serve_connections,
                    lean=lean_http2,
                    max_streams=max_concurrent_streams,
                ),
                app,
                config,
                listeners,
                conn_stats,
            )
            proxy = None
            if use_proxy:
                from ._h2proxy import FaultProxy

                proxy = FaultProxy(
                    upstream=(host, port), plan=plan, handoff=handoff, ssl_context=ssl_ctx
                )
                port = await nursery.start(proxy.serve, host)
            scheme = "https" if tls else "http"
            netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            server = EnvdServer(
                url=f"{scheme}://{netloc}",
                domain=domain,
                api_key=api_key,
                app=app,
                registry=registry,
                plan=plan,
                ca=ca if tls else None,
                ca_path=ca_path,
                proxy=proxy,
                connection_stats=conn_stats,
            )
            try:
                yield server
            finally:
                nursery.cancel_scope.cancel()
