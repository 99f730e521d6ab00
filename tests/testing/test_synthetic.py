"""The synthetic mode of the envd test server: ``exec_and_wait``'s shapes answered by timers."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator

import pytest
import trio

from trio_swe import InvalidArgumentError, Sandbox, exec_and_wait, open_sandbox, wait_cleanups
from trio_swe.sandbox.e2b import E2BBackend
from trio_swe.testing import EnvdServer, EnvdServerProcess, SyntheticBackend, open_envd_server
from trio_swe.testing._envd._synthetic import Program, SyntheticSandbox, parse_program

from ..e2b.helpers import e2b_backend_for


def test_parse_program() -> None:
    assert parse_program("sleep 2.5; exit 3") == Program(2.5, 3, b"")
    assert parse_program("echo a 'b c'\nsleep 1\nfalse") == Program(1.0, 1, b"a b c\n")
    assert parse_program("cd /tmp || exit 126\nexport A='x'\ntrue\n") == Program(0.0, 0, b"")
    assert parse_program("exit") == Program(0.0, 0, b"")
    assert parse_program("sleep 1; exit 7; echo never") == Program(1.0, 7, b"")
    assert parse_program("python -c 1") is None
    assert parse_program("sleep 1 && true") is None


@pytest.fixture
async def synthetic() -> AsyncIterator[tuple[EnvdServer, SyntheticBackend, E2BBackend]]:
    backend = SyntheticBackend()
    async with (
        open_envd_server(backend=backend) as server,
        e2b_backend_for(server) as e2b,
    ):
        yield server, backend, e2b


def _state(sb: Sandbox, server: EnvdServer) -> SyntheticSandbox:
    entry = server._registry.get(sb.id)
    assert entry is not None
    assert isinstance(entry.sandbox, SyntheticSandbox)
    return entry.sandbox


async def test_detached_calls_are_timers(
    synthetic: tuple[EnvdServer, SyntheticBackend, E2BBackend],
) -> None:
    server, backend, e2b = synthetic
    with trio.fail_after(60):  # a hang guard only
        async with open_sandbox(e2b, "base", workdir="/tmp") as sb:
            results = {}

            async def one(code: int) -> None:
                results[code] = await exec_and_wait(
                    sb, f"echo out-{code}; sleep 0.5; exit {code}", time_budget_sec=30
                )

            async with trio.open_nursery() as nursery:
                for code in range(5):
                    nursery.start_soon(one, code)
            for code, r in results.items():
                assert (r.exit_code, r.reason) == (code, "exit")
                # The output rules of exec_and_wait hold: "" on success, the tail otherwise.
                assert r.output == ("" if code == 0 else f"out-{code}\n")
                assert r.tag in backend.ends
            full = await exec_and_wait(sb, "echo all; exit 0", time_budget_sec=30, want_output=True)
            assert full.output == "all\n"
            over = await exec_and_wait(sb, "sleep 60", time_budget_sec=0.5)
            assert (over.exit_code, over.reason) == (-1, "time_budget")
            unknown = await exec_and_wait(sb, "python -m pytest", time_budget_sec=30)
            assert unknown.exit_code == 127  # never pretends to run what it does not know
            # The same tag runs again; an overlapping call with it is refused.
            for _ in range(2):
                assert (
                    await exec_and_wait(sb, "exit 4", time_budget_sec=30, tag="t")
                ).exit_code == 4

            # Held until the test cancels it (a fixed budget could run out first under load).
            held = trio.CancelScope()

            async def long() -> None:
                with held:
                    await exec_and_wait(sb, "sleep 60", time_budget_sec=math.inf, tag="busy")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(long)
                await backend.next_spawn()
                assert "/tmp/.trio_swe/busy" in _state(sb, server).calls
                with pytest.raises(InvalidArgumentError, match="in use"):
                    await exec_and_wait(sb, "true", time_budget_sec=30, tag="busy")
                held.cancel()
            assert held.cancelled_caught
            await wait_cleanups(sb)
            state = _state(sb, server)
            assert state.calls == {}
            assert state.files == {}
            plain = await sb.exec("echo hi; exit 2")
            assert (plain.exit_code, plain.output) == (2, "hi\n")
    by_shape = backend.by_shape
    assert by_shape["spawn"] >= 10
    assert by_shape["kill"] >= 1
    assert by_shape["cleanup"] >= 9


def test_server_in_a_subprocess_reports_ends_and_stats() -> None:
    async def run(info: dict[str, str]) -> tuple[str, float]:
        async with (
            E2BBackend(
                api_key=info["api_key"],
                api_url=info["api_url"],
                sandbox_url=info["sandbox_url"],
                verify=info["ca_path"],
            ) as e2b,
            open_sandbox(e2b, "base", workdir="/tmp") as sb,
        ):
            r = await exec_and_wait(sb, "sleep 0.2; exit 9", time_budget_sec=60)
            assert r.exit_code == 9
            assert r.tag is not None
            return r.tag, time.monotonic()

    with EnvdServerProcess(synthetic=True, tls=True) as srv:
        tag, seen = trio.run(run, srv.info)
        ends = srv.query("ends")
        stats = srv.query("stats")
    assert ends[tag] <= seen  # the end is the server's; the client saw it later
    assert stats["synthetic"]["by_shape"]["spawn"] == 1
    assert stats["server"]["sandboxes_killed"] == 1
    assert stats["cpu_sec"] > 0


async def test_reschedule_ends_running_commands_when_told(
    synthetic: tuple[EnvdServer, SyntheticBackend, E2BBackend],
) -> None:
    """A load test's long timers end when the backend is told, spread, in spawn order."""
    _, backend, e2b = synthetic
    with trio.fail_after(60):  # a hang guard only: the commands would run 100,000 s
        async with open_sandbox(e2b, "base", workdir="/tmp") as sb:
            codes: list[int] = []

            async def one(code: int) -> None:
                r = await exec_and_wait(sb, f"sleep 100000; exit {code}", time_budget_sec=1e6)
                codes.append(r.exit_code)

            async with trio.open_nursery() as nursery:
                for code in range(3):
                    nursery.start_soon(one, code)
                    await backend.next_spawn()  # spawned in this order
                first = time.monotonic() + 0.2
                assert backend.reschedule(first, 0.3) == 3
                # In spawn order: the command of exit code k ends k x 0.1 s after the first.
                by_code = sorted(backend.ends.values())
                assert by_code == pytest.approx([first, first + 0.1, first + 0.2])
            assert sorted(codes) == [0, 1, 2]
            assert backend.reschedule(time.monotonic(), 1.0) == 0  # nothing runs any more
