"""envd's process table of one sandbox: start, fan-out of output, re-attach, exit retention.

Like envd: output goes to whoever is attached when it is produced (no replay); a process does
not die when its stream is cut; ``Connect-Timeout-Ms`` on ``Start`` kills it when it elapses; the
end event of a finished process is kept for a retention period so a late ``Connect`` still
learns the exit code.
"""

from __future__ import annotations

import math
import os
import signal as _signal
from collections.abc import Mapping
from typing import Protocol

import trio

from ...sandbox.e2b._wire import DataEvent, EndEvent, ProcessConfig, ProcessEvent, ProcessInfo

_READ_CHUNK = 32 * 1024
#: After the main process exits, how long to wait for the pipes' end (background children may
#: hold them open); what is in them then is read all the same.
_DRAIN_GRACE_SEC = 0.5
#: At most this much of what is in a pipe at the end of the grace is read (a pipe holds 64 KiB
#: unless enlarged; a background child that keeps writing must not keep the end back).
_DRAIN_NOW_MAX = 1 << 20


class StreamingProcess(Protocol):
    """What the server needs of a process (``trio_swe.sandbox.local.LocalProcess``)."""

    @property
    def pid(self) -> int: ...
    @property
    def stdout(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def stderr(self) -> trio.abc.ReceiveStream | None: ...
    @property
    def stdin(self) -> trio.abc.SendStream | None: ...
    async def wait(self) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    async def aclose(self) -> None: ...


class ProcessHost(Protocol):
    """A sandbox that can start streaming processes (``LocalSandbox.start_process``)."""

    async def start_process(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
    ) -> StreamingProcess: ...


def end_event_for(returncode: int) -> EndEvent:
    """The envd end event for a return code (negative: killed by that signal).

    Like envd (Go's ``exec.ExitError``), a non-zero exit or a signal also sets ``error`` to the
    status text (``"exit status 3"``, ``"signal: killed"``); a zero exit has none.
    """
    if returncode >= 0:
        status = f"exit status {returncode}"
        return EndEvent(
            exit_code=returncode, exited=True, status=status, error=status if returncode else None
        )
    try:
        name = (_signal.strsignal(-returncode) or "").lower() or f"signal {-returncode}"
    except ValueError:
        name = f"signal {-returncode}"
    status = f"signal: {name}"
    return EndEvent(exit_code=-1, exited=False, status=status, error=status)


class ProcessRecord:
    """One process started through envd."""

    def __init__(self, proc: StreamingProcess, config: ProcessConfig, tag: str | None) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.config = config
        self.tag = tag
        self.subscribers: list[trio.MemorySendChannel[ProcessEvent]] = []
        self.end: EndEvent | None = None
        self.done = trio.Event()
        #: The sandbox was killed under the process: streams end with "unavailable".
        self.gone = False
        #: Its Start deadline (Connect-Timeout-Ms) elapsed and it was killed for it.
        self.deadline_hit = False

    def subscribe(self) -> trio.MemoryReceiveChannel[ProcessEvent]:
        """Attach a listener; it gets live events only, then the end event, then EOF."""
        send, recv = trio.open_memory_channel[ProcessEvent](math.inf)
        if self.end is not None or self.gone:
            if self.end is not None and not self.gone:
                send.send_nowait(ProcessEvent(end=self.end))
            send.close()
        else:
            self.subscribers.append(send)
        return recv

    def unsubscribe(self, recv: trio.MemoryReceiveChannel[ProcessEvent]) -> None:
        """Detach a listener (its stream ended or was cut)."""
        recv.close()

    def _broadcast(self, event: ProcessEvent) -> None:
        alive = []
        for ch in self.subscribers:
            try:
                ch.send_nowait(event)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                continue
            alive.append(ch)
        self.subscribers = alive

    def _close_subscribers(self) -> None:
        for ch in self.subscribers:
            ch.close()
        self.subscribers = []

    def info(self) -> ProcessInfo:
        return ProcessInfo(config=self.config, pid=self.pid, tag=self.tag)


class ProcessTable:
    """Every process of one sandbox, by pid and by tag.

    Args:
        nursery: the sandbox's nursery; output pumps and retention timers run there.
        retention_sec: how long the end event of a finished process stays available.
        drain_grace_sec: after a process exits, how long its pipes are waited on for their end
            (background children may hold them open).
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        retention_sec: float,
        drain_grace_sec: float = _DRAIN_GRACE_SEC,
    ) -> None:
        self._nursery = nursery
        self._retention = retention_sec
        self._drain_grace = drain_grace_sec
        self._by_pid: dict[int, ProcessRecord] = {}
        self._by_tag: dict[str, ProcessRecord] = {}
        self.started = 0
        self._gone = False

    async def start(
        self,
        host: ProcessHost,
        config: ProcessConfig,
        *,
        user: str | None,
        env: Mapping[str, str],
        stdin: bool,
        tag: str | None,
        timeout_sec: float | None,
        cwd: str | None = None,
    ) -> tuple[ProcessRecord, trio.MemoryReceiveChannel[ProcessEvent]]:
        """Start ``config.cmd config.args`` (in ``cwd``, resolved by the caller; ``None``:
        ``config.cwd``) and attach the caller before any output flows."""
        if tag is not None and tag in self._by_tag and self._by_tag[tag].end is None:
            raise ValueError(f"a running process already has tag {tag!r}")
        proc = await host.start_process(
            [config.cmd, *config.args],
            user=user,
            env=env,
            cwd=config.cwd if cwd is None else cwd,
            stdin=stdin,
        )
        record = ProcessRecord(proc, config, tag)
        self._by_pid[record.pid] = record
        if tag is not None:
            self._by_tag[tag] = record
        self.started += 1
        sub = record.subscribe()
        self._nursery.start_soon(self._run, record)
        if timeout_sec is not None:
            self._nursery.start_soon(self._deadline, record, trio.current_time() + timeout_sec)
        return record, sub

    def find(self, *, pid: int | None, tag: str | None) -> ProcessRecord | None:
        """The process selected by ``pid`` or ``tag`` (running or recently ended)."""
        if pid is not None:
            return self._by_pid.get(pid)
        if tag is not None:
            return self._by_tag.get(tag)
        return None

    def running(self) -> list[ProcessRecord]:
        return [r for r in self._by_pid.values() if r.end is None]

    def __len__(self) -> int:
        return sum(1 for r in self._by_pid.values() if r.end is None)

    def mark_gone(self) -> None:
        """The sandbox is being killed: end every attached stream as "sandbox not found"."""
        self._gone = True
        for record in self._by_pid.values():
            record.gone = True
            record._close_subscribers()

    async def _deadline(self, record: ProcessRecord, deadline: float) -> None:
        with trio.move_on_at(deadline):
            await record.done.wait()
            return
        record.deadline_hit = True
        _kill(record)

    async def _pump(
        self, record: ProcessRecord, stream: trio.abc.ReceiveStream | None, which: str
    ) -> None:
        if stream is None:
            return
        try:
            while True:
                chunk = await stream.receive_some(_READ_CHUNK)
                if not chunk:
                    return
                _deliver(record, which, bytes(chunk))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return

    async def _run(self, record: ProcessRecord) -> None:
        proc = record.proc
        try:
            async with trio.open_nursery() as pumps:
                pumps.start_soon(self._pump, record, proc.stdout, "stdout")
                pumps.start_soon(self._pump, record, proc.stderr, "stderr")
                returncode = await proc.wait()
                # Background children may hold the pipes open; do not wait for them forever.
                pumps.cancel_scope.deadline = trio.current_time() + self._drain_grace
            if pumps.cancel_scope.cancelled_caught:
                # The grace is the clock's: a starved loop spends it before a pump had its turn
                # (a pump checkpoints before it reads), with the output still in the pipe. envd's
                # readers run beside the process and have it: read what is there, without waiting.
                for stream, which in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
                    for chunk in _read_now(stream):
                        _deliver(record, which, chunk)
        finally:
            with trio.CancelScope(shield=True):
                await proc.aclose()
        record.end = end_event_for(returncode)
        if not record.gone:
            record._broadcast(ProcessEvent(end=record.end))
        record._close_subscribers()
        record.done.set()
        await trio.sleep(self._retention)
        if self._by_pid.get(record.pid) is record:
            del self._by_pid[record.pid]
        if record.tag is not None and self._by_tag.get(record.tag) is record:
            del self._by_tag[record.tag]


def _deliver(record: ProcessRecord, which: str, raw: bytes) -> None:
    """Send one chunk of output to the attached streams (none once the sandbox is gone)."""
    if record.gone:
        return
    data = DataEvent(stdout=raw) if which == "stdout" else DataEvent(stderr=raw)
    record._broadcast(ProcessEvent(data=data))


def _read_now(stream: trio.abc.ReceiveStream | None) -> list[bytes]:
    """What a pipe holds right now, up to :data:`_DRAIN_NOW_MAX` bytes, read without waiting
    (a pipe's fd is non-blocking); nothing for a stream that is no pipe."""
    fileno = getattr(stream, "fileno", None)
    if fileno is None:
        return []
    chunks: list[bytes] = []
    left = _DRAIN_NOW_MAX
    while left > 0:
        try:
            chunk = os.read(fileno(), min(_READ_CHUNK, left))
        except OSError:  # BlockingIOError: empty (a background child holds it open)
            break
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return chunks


def _kill(record: ProcessRecord) -> None:
    try:
        record.proc.send_signal(_signal.SIGKILL)
    except (ProcessLookupError, OSError):
        pass


def send_signal(record: ProcessRecord, name: str) -> None:
    """Deliver ``SIGNAL_SIGKILL``/``SIGNAL_SIGTERM`` to the process group.

    Raises:
        ValueError: an unknown signal name.
    """
    sig = {"SIGNAL_SIGKILL": _signal.SIGKILL, "SIGNAL_SIGTERM": _signal.SIGTERM}.get(name)
    if sig is None:
        raise ValueError(f"unsupported signal {name!r}")
    if record.end is not None:
        return
    try:
        record.proc.send_signal(sig)
    except (ProcessLookupError, OSError):
        pass
