"""A plain ``exec`` whose stream was cut and whose process envd forgot (issue 27, item 6).

envd keeps a finished process's end event for a retention period (30 s on E2B); a re-attach
that comes later, or a Start whose acknowledgement was lost with its connection, used to end in
``SandboxUnreachableError`` although the command had run. The call's end record in the sandbox
gives the exit code back, marked as having lost its output; a record fenced before any Start
claimed it proves the command never ran, and it is then started afresh, once. An idempotent
call (the settle script is one) has no record: it is run again from the start instead.
"""

from __future__ import annotations

import pytest

from trio_swe import SandboxUnreachableError, open_sandbox
from trio_swe.sandbox.e2b import E2BSandboxStatistics
from trio_swe.testing import Fault, FaultPlan

from .helpers import open_server_and_backend

START = "/process.Process/Start"
CONNECT = "/process.Process/Connect"


def _stats(sb: object) -> E2BSandboxStatistics:
    st = sb.statistics()  # type: ignore[attr-defined]
    assert isinstance(st, E2BSandboxStatistics)
    return st


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
        assert _stats(sb).settles == 1


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


CMD = "echo x >> /tmp/log; echo out; exit 5"


def _lost_ends(times: int) -> FaultPlan:
    """The next ``times`` Start streams end without their end event once the command exited
    (``no_end`` takes the end event's place). With a retention of 0, envd drops the process at
    its end, before the client's re-attach (after a backoff) can reach it: ``Connect`` finds
    nothing."""
    return FaultPlan([Fault(kind="no_end", route=START, after_sec=60.0, times=times)])


async def test_an_idempotent_exec_whose_process_was_forgotten_runs_again() -> None:
    # It used to raise SandboxUnreachableError ("re-attach (process lost)"). A replay-safe
    # command is run again from the start, and only the new run's output is returned.
    plan = _lost_ends(1)
    async with (
        open_server_and_backend(plan, process_retention_sec=0.0) as (server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec(CMD, idempotent=True)
        assert (res.exit_code, res.reason, res.output, res.output_truncated) == (
            5,
            "exit",
            "out\n",
            False,
        )
        assert await sb.read_file("/tmp/log") == b"x\nx\n"  # the lost run and the new one
        by_path = server.statistics().requests_by_path
        assert (by_path[START], by_path[CONNECT]) == (2, 1)
        assert server.statistics().faults_injected == {"no_end": 1}
        # The cut and the lost process: two retries, one of them a re-attach.
        st = _stats(sb)
        assert (st.retries, st.reattaches, st.settles) == (2, 1, 0)


async def test_a_non_idempotent_exec_whose_process_was_forgotten_runs_once() -> None:
    # The same loss for a command that must not run twice: never run again, its record tells.
    plan = _lost_ends(1)
    async with (
        open_server_and_backend(plan, process_retention_sec=0.0) as (server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec(CMD)
        assert (res.exit_code, res.reason, res.output_truncated) == (5, "exit", True)
        assert await sb.read_file("/tmp/log") == b"x\n"
        # Its Start and the settle script's: the command itself was started once.
        assert server.statistics().requests_by_path[START] == 2
        assert _stats(sb).settles == 1


async def test_a_settle_whose_process_was_forgotten_is_asked_again() -> None:
    # Both the command's and its settle script's streams lose their end, and envd forgot both
    # processes: the settle (replay-safe) runs again; the command never does. This raised
    # SandboxUnreachableError: how test_exec_faults.py's plain calls flaked (3 of ~37 runs).
    plan = _lost_ends(2)
    async with (
        open_server_and_backend(plan, process_retention_sec=0.0) as (server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec(CMD)
        assert (res.exit_code, res.reason, res.output_truncated) == (5, "exit", True)
        assert await sb.read_file("/tmp/log") == b"x\n"
        assert server.statistics().faults_injected == {"no_end": 2}
        assert server.statistics().requests_by_path[START] == 3  # command, settle, settle again
        assert _stats(sb).settles == 1
