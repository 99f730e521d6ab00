"""A plain ``exec`` whose stream was cut and whose process envd forgot (issue 27, item 6).

envd keeps a finished process's end event for a retention period (30 s on E2B); a re-attach
that comes later, or a Start whose acknowledgement was lost with its connection, used to end in
``SandboxUnreachableError`` although the command had run. The call's end record in the sandbox
gives the exit code back, marked as having lost its output; a record fenced before any Start
claimed it proves the command never ran, and it is then started afresh, once.
"""

from __future__ import annotations

import pytest

from trio_swe import SandboxUnreachableError, open_sandbox
from trio_swe.sandbox.e2b import E2BSandboxStatistics
from trio_swe.testing import Fault, FaultPlan

from .helpers import open_server_and_backend

START = "/process.Process/Start"


def _settles(sb: object) -> int:
    st = sb.statistics()  # type: ignore[attr-defined]
    assert isinstance(st, E2BSandboxStatistics)
    return st.settles


async def test_exit_code_read_from_the_record_after_envd_forgot_the_process() -> None:
    # The stream goes silent; by the time the idle watchdog gives up on it (~3.5 s), the
    # command has ended and envd (retention 0.1 s) knows no process by its tag.
    plan = FaultPlan([Fault(kind="hang", route=START, after_sec=0.3, times=1)])
    async with (
        open_server_and_backend(plan, process_retention_sec=0.1) as (server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec("echo x >> /tmp/log; echo early; sleep 1; echo late; exit 5")
        assert (res.exit_code, res.reason) == (5, "exit")
        # What came before the cut is kept; what came after is gone, and the result says so.
        assert res.output_truncated
        assert "late" not in res.output
        assert await sb.read_file("/tmp/log") == b"x\n"
        assert server.statistics().faults_injected == {"hang": 1}
        assert _settles(sb) == 1


async def test_exit_code_read_from_the_record_after_a_cut_start() -> None:
    # A reset of the Start stream once it ran a while; the command is short, so the Connect
    # after the backoff finds nothing at envd.
    plan = FaultPlan([Fault(kind="rst", route=START, after_sec=0.3, times=1)])
    async with (
        open_server_and_backend(plan, process_retention_sec=0.0) as (server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec("echo x >> /tmp/log; exit 3")
        assert (res.exit_code, res.reason) == (3, "exit")
        assert await sb.read_file("/tmp/log") == b"x\n"
        assert server.statistics().faults_injected == {"rst": 1}


async def test_a_killed_command_without_record_stays_an_error() -> None:
    # The command kills its own wrapper (the whole process group): no exit status was recorded,
    # and envd forgot the process. Nothing is made up: the call raises, and says why.
    plan = FaultPlan([Fault(kind="hang", route=START, after_sec=0.3, times=1)])
    async with (
        open_server_and_backend(plan, process_retention_sec=0.1) as (_, backend),
        open_sandbox(backend, "base") as sb,
    ):
        with pytest.raises(SandboxUnreachableError, match="killed before it recorded"):
            await sb.exec("echo x >> /tmp/log; sleep 0.5; kill -9 0")
        assert await sb.read_file("/tmp/log") == b"x\n"


async def test_records_are_removed_in_batches() -> None:
    # Every plain exec leaves a few bytes; later calls remove finished calls' records.
    async with open_server_and_backend() as (_, backend), open_sandbox(backend, "base") as sb:
        for _ in range(150):
            assert (await sb.exec("true")).ok
        left = await sb.exec("ls /tmp/.trio_swe_exec.root | wc -l", idempotent=True)
        assert int(left.output) <= 64 + 1, left
