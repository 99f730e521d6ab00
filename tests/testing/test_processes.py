"""The envd test server's process table: a finished process's output is never dropped.

envd reads a process's pipes with goroutines that run while the process does; this server reads
them with trio tasks, which a starved event loop (a loaded machine) may not have run by the time
the exit is seen, and then not within the drain grace either. ``drain_grace_sec=0`` is that
starved loop, made deterministic: the grace is over before the pumps' next turn.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping

import pytest
import trio
import trio.testing

from trio_swe.sandbox.e2b._wire import ProcessConfig, ProcessEvent
from trio_swe.testing._envd._processes import ProcessTable

_pids = itertools.count(900_000)


class _PipedProcess:
    """A process whose output is in a real pipe: exited by the time its pumps first run (or
    when ``exit`` is set), the pipe's write end closed unless a "background child" holds it."""

    def __init__(self, output: bytes, returncode: int, *, holder: bool = False) -> None:
        r, w = os.pipe()
        os.write(w, output)  # below the pipe's capacity: no reader needed yet
        self.holder: int | None = w
        if not holder:
            os.close(w)
            self.holder = None
        self.pid = next(_pids)
        self.stdout: trio.abc.ReceiveStream | None = trio.lowlevel.FdStream(r)
        self.stderr: trio.abc.ReceiveStream | None = None
        self.stdin: trio.abc.SendStream | None = None
        self.returncode = returncode

    async def wait(self) -> int:
        await trio.lowlevel.checkpoint()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        pass

    async def aclose(self) -> None:
        assert self.stdout is not None
        await self.stdout.aclose()
        if self.holder is not None:
            os.close(self.holder)
            self.holder = None


class _Host:
    def __init__(self, proc: _PipedProcess) -> None:
        self.proc = proc

    async def start_process(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
    ) -> _PipedProcess:
        return self.proc


async def _collect(proc: _PipedProcess) -> tuple[bytes, list[int]]:
    """Start ``proc`` through a process table whose drain grace a starved loop has spent."""
    out = bytearray()
    codes: list[int] = []
    async with trio.open_nursery() as nursery:
        table = ProcessTable(nursery, retention_sec=0.0, drain_grace_sec=0.0)
        _record, sub = await table.start(
            _Host(proc),
            ProcessConfig(cmd="/bin/sh", args=["-c", "true"]),
            user=None,
            env={},
            stdin=False,
            tag="t",
            timeout_sec=None,
        )
        event: ProcessEvent
        async for event in sub:
            if event.data is not None:
                out += event.data.stdout or b""
            elif event.end is not None:
                codes.append(event.end.exit_code)
    return bytes(out), codes


@pytest.mark.parametrize("size", [16, 48 * 1024], ids=["small", "more-than-a-read"])
async def test_output_in_the_pipes_at_exit_reaches_the_stream(size: int) -> None:
    # As call 158 of test_plain_exec_keeps_exit_codes_under_faults[mixed] under load: exit
    # code 71 arrived, its output did not, and nothing said so.
    output = b"x" * (size - 4) + b"end\n"
    got, codes = await _collect(_PipedProcess(output, 71))
    assert codes == [71]
    assert got == output


async def test_a_pipe_held_open_does_not_hold_the_end_back() -> None:
    # A background child keeps the write end: what is in the pipe is delivered, and the end
    # comes without waiting for the child.
    proc = _PipedProcess(b"out\n", 3, holder=True)
    with trio.fail_after(5):
        got, codes = await _collect(proc)
    assert (got, codes) == (b"out\n", [3])
