"""A gate across processes: agents on Ray workers held until the test opens it.

The test's process serves a :class:`Hub` on loopback. On the workers, :class:`GatedAgent` (an
agent factory's class) reports to it and waits for the gate, and :class:`ReportingBackend` (a
backend factory's) reports every sandbox it creates, so the test sees, from its own process,
how many agents run at once and how many sandboxes were booted meanwhile.

Both classes reach the workers pickled by reference (``tests.ray._gate``): Ray gives its workers
the driver's ``sys.path``. This module imports nothing of pytest's.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import trio

from trio_swe.agents import AgentOutcome, AgentTask, BaseAgent
from trio_swe.config import SweConfig
from trio_swe.sandbox import BackendWrapper, Sandbox, SandboxSpec
from trio_swe.sandbox.local import LocalBackend

_AGENT, _BOOT, _GO = b"a", b"b", b"g"


class Hub:
    """The test's side: counts the agents held at the gate and the sandboxes booted."""

    def __init__(self) -> None:
        self.port = 0
        self.agents = self.peak = self.boots = 0
        self.gate = trio.Event()
        self._changed = trio.Event()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Until ``condition()`` holds (checked at every report)."""
        while not condition():
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _serve(self, stream: trio.SocketStream) -> None:
        async with stream:
            kind = await stream.receive_some(1)
            if kind == _BOOT:
                self.boots += 1
                self._notify()
            elif kind == _AGENT:
                self.agents += 1
                self.peak = max(self.peak, self.agents)
                self._notify()
                try:
                    await self.gate.wait()
                    await stream.send_all(_GO)
                finally:
                    self.agents -= 1
                    self._notify()


@contextlib.asynccontextmanager
async def open_hub() -> AsyncIterator[Hub]:
    hub = Hub()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, hub._serve, 0, host="127.0.0.1")
        )
        hub.port = listeners[0].socket.getsockname()[1]
        yield hub
        nursery.cancel_scope.cancel()


async def _report(port: int, kind: bytes) -> trio.SocketStream:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(kind)
    return stream


class GatedAgent(BaseAgent):
    """Reports to the hub at ``port``, waits for its gate, submits nothing.

    ``functools.partial(GatedAgent, port)`` is a pool's agent factory (called with the config).
    """

    def __init__(self, port: int, config: SweConfig) -> None:
        self.port = port

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        async with await _report(self.port, _AGENT) as stream:
            await stream.receive_some(1)  # the gate opened (or the hub closed)
        return AgentOutcome(exit_code=0, finish="submitted")


class ReportingBackend(BackendWrapper, trio.abc.AsyncResource):
    """A :class:`LocalBackend` under ``state_dir`` that reports each sandbox it creates.

    ``functools.partial(ReportingBackend, port, state_dir)`` is a pool's backend factory.
    """

    def __init__(self, port: int, state_dir: str | Path) -> None:
        super().__init__(LocalBackend(state_dir=state_dir))
        self.port = port

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        sandbox = await super().create_sandbox(spec, nursery)
        stream = await _report(self.port, _BOOT)
        await stream.aclose()
        return sandbox
