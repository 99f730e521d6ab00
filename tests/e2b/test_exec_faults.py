"""Plain ``exec`` under dense stream and connection faults (issue 27, item 6).

540 concurrent non-idempotent ``exec`` calls (180 per fault mix; each appends its number to a
file, prints a line, sleeps, exits with its own code) while the server cuts streams
(RST_STREAM), closes TCP connections, or injects every kind in turn, at the fault matrix's dense
rate. The server keeps a finished process's end for 1 s only (E2B: 30 s), so re-attaches that
come late meet envd's "not found" too. Every call must return its exit code; nothing may run
twice; no result may be made up (a result for a command that never ran, a wrong code, or a
complete-looking output that lost its end).

Before the end record, 21-23 of the 540 calls here got ``SandboxUnreachableError`` (tcp_close
and the mix; 4 of them for commands that had run, the others for commands that had not).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import partial

import pytest
import trio

from trio_swe import ExecResult, open_sandbox
from trio_swe.testing import FaultPlan

from .helpers import e2b_backend_for, open_server_in_thread
from .test_fault_matrix import DENSE_SHAPES, _dense_ticker

CALLS = 180
SANDBOXES = 6
#: Calls start at random over this many seconds: ~33 dense ticks of faults while they run.
SPREAD_SEC = 20.0


async def run_exec_matrix(*, dense: Sequence[str], seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    plan = FaultPlan([], seed=seed)
    plan.enabled = False  # boot cleanly
    jobs = [(i, rng.uniform(0.1, 1.5), rng.randrange(0, 120)) for i in range(CALLS)]
    delays = [rng.uniform(0, SPREAD_SEC) for _ in range(CALLS)]
    outcomes: dict[int, ExecResult | Exception] = {}
    logs: dict[int, bytes] = {}
    async with (
        open_server_in_thread(faults=plan, process_retention_sec=1.0) as threaded,
        e2b_backend_for(threaded.server, seed=seed, streams_per_connection=16) as backend,
    ):
        ready: list[int] = []
        running = {"n": SANDBOXES}
        quiet = trio.Event()

        async def one_sandbox(k: int) -> None:
            async with open_sandbox(backend, "base", ttl_sec=3600) as sb:

                async def one(i: int, sec: float, code: int) -> None:
                    await trio.sleep(delays[i])
                    try:
                        outcomes[i] = await sb.exec(
                            f"echo {i} >> /tmp/effects; echo out{i}; sleep {sec:.2f}; "
                            f"echo end{i}; exit {code}",
                            timeout=300,  # correctness, not speed: a loaded CI machine
                        )
                    except Exception as exc:  # counted below, never swallowed
                        outcomes[i] = exc

                ready.append(k)
                if len(ready) == SANDBOXES:
                    plan.enabled = True
                async with trio.open_nursery() as nursery:
                    for i, sec, code in jobs[k::SANDBOXES]:
                        nursery.start_soon(one, i, sec, code)
                running["n"] -= 1
                if running["n"] == 0:
                    plan.enabled = False  # read the evidence without faults
                    quiet.set()
                await quiet.wait()
                logs[k] = await sb.read_file("/tmp/effects")

        with trio.fail_after(600):  # a hang fails the test, never blocks CI
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(
                        _dense_ticker,
                        threaded,
                        plan,
                        dense,
                        rotate=len(dense) > 1,
                        min_ticks=0,
                        enough=trio.Event(),
                    )
                )
                async with trio.open_nursery() as sandboxes:
                    for k in range(SANDBOXES):
                        sandboxes.start_soon(one_sandbox, k)
                nursery.cancel_scope.cancel()
        stats = await threaded.statistics()
    effects: dict[int, int] = {}
    for log in logs.values():
        for x in log.split():
            effects[int(x)] = effects.get(int(x), 0) + 1
    return {
        "jobs": jobs,
        "outcomes": outcomes,
        "effects": effects,
        "faults": stats.faults_injected,
    }


@pytest.mark.parametrize("kinds", [["rst"], ["tcp_close"], ["mixed"]], ids=lambda k: k[0])
async def test_plain_exec_keeps_exit_codes_under_faults(kinds: list[str]) -> None:
    dense = list(DENSE_SHAPES) if kinds == ["mixed"] else kinds
    got = await run_exec_matrix(dense=dense, seed=27)
    jobs = got["jobs"]
    outcomes = got["outcomes"]
    effects = got["effects"]
    assert isinstance(jobs, list)
    assert isinstance(outcomes, dict)
    assert isinstance(effects, dict)
    errors = {i: repr(o)[:300] for i, o in outcomes.items() if isinstance(o, Exception)}
    double = sorted(i for i, n in effects.items() if n > 1)
    codes = {i: code for i, _sec, code in jobs}
    results = {i: o for i, o in outcomes.items() if isinstance(o, ExecResult)}
    wrong = {i: r for i, r in results.items() if (r.exit_code, r.reason) != (codes[i], "exit")}
    made_up = sorted(i for i in results if effects.get(i, 0) != 1)
    # An output that lost its end (emitted while detached) must say so.
    unflagged = {
        i: r for i, r in results.items() if f"end{i}" not in r.output and not r.output_truncated
    }
    ran = sorted(i for i in errors if effects.get(i, 0))  # lost exit codes of commands that ran
    assert errors == {}, (len(errors), len(ran), dict(list(errors.items())[:5]))
    assert (double, wrong, made_up, unflagged) == ([], {}, [], {})
    assert len(results) == CALLS
    faults = got["faults"]
    assert isinstance(faults, dict)
    # The faults happened (each kind, for the mix), and some calls needed their record.
    assert sum(faults.values()) >= 15, faults
    if kinds == ["mixed"]:
        assert len(faults) == len(DENSE_SHAPES), faults
    print(kinds, faults)
