"""The server's live sandboxes: creation from templates, TTL reclaim, kill."""

from __future__ import annotations

import datetime as _dt
import logging
import secrets
from collections.abc import Mapping
from typing import Any, cast

import trio

from ...sandbox._protocol import Backend, Sandbox
from ...sandbox._types import SandboxSpec
from ._processes import ProcessHost, ProcessTable

_log = logging.getLogger("trio_swe.testing")
_KILL_TIMEOUT_SEC = 30.0


def _now_utc() -> _dt.datetime:
    return _dt.datetime.now(_dt.UTC)


class SandboxEntry:
    """One live sandbox of the server."""

    def __init__(
        self,
        *,
        sandbox_id: str,
        template_id: str,
        sandbox: Sandbox,
        token: str | None,
        ttl_sec: float,
        metadata: Mapping[str, str],
        env: Mapping[str, str],
        processes: ProcessTable,
    ) -> None:
        self.id = sandbox_id
        self.template_id = template_id
        self.sandbox = sandbox
        self.token = token
        self.metadata = dict(metadata)
        self.env = dict(env)
        self.processes = processes
        self.started_at = _now_utc()
        self.end_at = self.started_at
        self.ttl_scope = trio.CancelScope()
        self.kill_requested = trio.Event()
        self.dead = trio.Event()
        self.set_timeout(ttl_sec)

    @property
    def host(self) -> ProcessHost:
        return cast(ProcessHost, self.sandbox)

    def set_timeout(self, seconds: float) -> None:
        """The sandbox is reclaimed ``seconds`` from now unless extended again."""
        self.ttl_scope.deadline = trio.current_time() + seconds
        self.end_at = _now_utc() + _dt.timedelta(seconds=seconds)

    def extend_to_at_least(self, seconds: float) -> None:
        """Keep the sandbox alive for at least ``seconds`` more (``connect``)."""
        deadline = trio.current_time() + seconds
        if deadline > self.ttl_scope.deadline:
            self.set_timeout(seconds)

    def detail(self, domain: str) -> dict[str, Any]:
        """The REST API's ``SandboxDetail``."""

        def iso(t: _dt.datetime) -> str:
            return t.isoformat().replace("+00:00", "Z")

        out: dict[str, Any] = {
            "templateID": self.template_id,
            "sandboxID": self.id,
            "clientID": "local",
            "startedAt": iso(self.started_at),
            "endAt": iso(self.end_at),
            "envdVersion": ENVD_VERSION,
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "state": "running",
            "metadata": self.metadata,
            "domain": domain,
        }
        if self.token is not None:
            out["envdAccessToken"] = self.token
        return out


#: The envd version this server claims (0.6.x: exit retention, octet-stream uploads, CloseStdin).
ENVD_VERSION = "0.6.13"


class SandboxRegistry:
    """Creates sandboxes from a backend, reclaims them at their timeout, kills them on demand.

    Args:
        backend: where sandboxes come from; their objects must offer ``start_process``.
        nursery: the server's nursery; every sandbox lives in a task there.
        workdir: the workdir of every sandbox.
        retention_sec: how long finished processes' end events are kept.
    """

    def __init__(
        self,
        backend: Backend,
        nursery: trio.Nursery,
        *,
        workdir: str,
        retention_sec: float,
    ) -> None:
        self._backend = backend
        self._nursery = nursery
        self._workdir = workdir
        self._retention = retention_sec
        self._live: dict[str, SandboxEntry] = {}
        self.created = 0
        self.killed = 0
        self.reclaimed = 0
        self.create_failures = 0
        #: Sandboxes found dead on their own (their backend lost them), then reclaimed.
        self.died = 0

    def get(self, sandbox_id: str) -> SandboxEntry | None:
        return self._live.get(sandbox_id)

    def live_ids(self) -> list[str]:
        return list(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def process_count(self) -> int:
        return sum(len(e.processes) for e in self._live.values())

    async def create(
        self,
        *,
        template_id: str,
        image: str,
        ttl_sec: float,
        metadata: Mapping[str, str],
        env: Mapping[str, str],
        sandbox_id: str | None = None,
        secure: bool = True,
    ) -> SandboxEntry:
        """Boot a sandbox; it lives until killed, reclaimed at its timeout, or server exit."""
        spec = SandboxSpec(
            image=image,
            workdir=self._workdir,
            env=dict(env),
            ttl_sec=ttl_sec,
            metadata=dict(metadata),
        )
        sid = sandbox_id or "i" + secrets.token_hex(10)
        token = secrets.token_urlsafe(16) if secure else None
        try:
            entry: SandboxEntry = await self._nursery.start(
                self._run, spec, sid, template_id, token, ttl_sec
            )
        except BaseException:
            self.create_failures += 1
            raise
        return entry

    async def kill(self, sandbox_id: str) -> bool:
        """Kill a sandbox and wait until it is gone; False when it is unknown."""
        entry = self._live.get(sandbox_id)
        if entry is None:
            return False
        entry.kill_requested.set()
        await entry.dead.wait()
        return True

    async def _run(
        self,
        spec: SandboxSpec,
        sandbox_id: str,
        template_id: str,
        token: str | None,
        ttl_sec: float,
        *,
        task_status: trio.TaskStatus[SandboxEntry] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as sb_nursery:
            sandbox = await self._backend.create_sandbox(spec, sb_nursery)
            entry = SandboxEntry(
                sandbox_id=sandbox_id,
                template_id=template_id,
                sandbox=sandbox,
                token=token,
                ttl_sec=ttl_sec,
                metadata=spec.metadata,
                env=spec.env,
                processes=ProcessTable(sb_nursery, retention_sec=self._retention),
            )
            self._live[sandbox_id] = entry
            self.created += 1
            try:
                task_status.started(entry)
                with entry.ttl_scope:
                    await entry.kill_requested.wait()
                if entry.kill_requested.is_set():
                    self.killed += 1
                else:
                    self.reclaimed += 1
                    _log.info("sandbox %s reclaimed at its timeout", sandbox_id)
            finally:
                del self._live[sandbox_id]
                entry.processes.mark_gone()
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(_KILL_TIMEOUT_SEC):
                        await sandbox.kill()
                    sb_nursery.cancel_scope.cancel()
                    entry.dead.set()
