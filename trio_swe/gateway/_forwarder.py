"""A TCP-to-unix-socket forwarder that runs inside a sandbox without a network.

A sandbox started without a network (its own network namespace, loopback only) cannot reach
the gateway's TCP port, and should reach nothing else either. The gateway also listens on a
unix socket whose directory the sandbox sees; this script, started in the sandbox before the
agent, listens on ``127.0.0.1:PORT`` there and relays each connection to that socket. The agent
is pointed at ``http://127.0.0.1:PORT``: the gateway is the only thing it can reach.

Standard library only (it runs with whatever Python the sandbox has); ``FORWARDER_SOURCE`` is
its text, written into the sandbox by the harness.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FORWARDER_SOURCE"]

FORWARDER_SOURCE = Path(__file__).with_name("_forwarder_main.py").read_text()
