"""Serve the ASGI app with hypercorn's trio connection handler, each connection under a guard.

With ``lean=True``, HTTP/2-over-TLS connections are served by :mod:`._h2server` instead (a
server that keeps up with thousands of streams); the rest still go to hypercorn.

``hypercorn.trio.serve`` runs every connection in one ``trio.serve_listeners`` nursery, so an
exception escaping one connection stops the whole server. hypercorn 0.18 raises such an
exception (``KeyError`` in its HTTP/2 event loop) when a peer drops a connection while request
bodies are still being processed, and a fault-injecting test server sees such peers all the
time. So this module accepts connections itself and runs hypercorn's per-connection
``TCPServer`` for each, counting (not propagating) what escapes. Lifespan events are not sent:
the envd app needs none.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import trio

_log = logging.getLogger("trio_swe.testing")


async def serve_connections(
    app: Any,
    config: Any,
    listeners: list[trio.abc.Listener[Any]],
    stats: Counter[str],
    *,
    lean: bool = False,
    max_streams: int = 100,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` (ASGI) on ``listeners`` with hypercorn ``config`` until cancelled."""
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.utils import wrap_app

    wrapped = wrap_app(app, config.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)

    async def handle(stream: trio.abc.Stream) -> None:
        stats["connections"] += 1
        try:
            if lean and isinstance(stream, trio.SSLStream):
                try:
                    with trio.fail_after(config.ssl_handshake_timeout):
                        await stream.do_handshake()
                except (trio.BrokenResourceError, trio.TooSlowError):
                    await trio.aclose_forcefully(stream)
                    return
                if stream.selected_alpn_protocol() == "h2":
                    from ._h2server import serve_h2

                    await serve_h2(stream, app, max_streams=max_streams, stats=stats)
                    return
            await TCPServer(wrapped, config, context, {}, stream).run()  # type: ignore[arg-type]
        except Exception as exc:
            # One broken connection must not take the server down (see the module docstring).
            stats["connection_errors"] += 1
            _log.debug("hypercorn connection failed: %r", exc)
            await trio.aclose_forcefully(stream)

    task_status.started()
    await trio.serve_listeners(handle, listeners)
