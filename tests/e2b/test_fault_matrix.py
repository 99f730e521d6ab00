"""The fault matrix: many concurrent ``exec_and_wait`` calls while the server injects every fault.

Seeded. Every exit code must come back right, every command's side effect (one line appended to
a file) must happen exactly once, and afterwards no sandbox and no process may be left on the
server. A silent stream must be found by the idle watchdog, not hang the test.

Two kinds of runs:

* probabilistic: every rule fires on a seeded coin per request (``every_fault``), plus one of
  each kind for coverage;
* dense (issue 9, item 4): on top of that, a ticker arms one injection of a kind every
  ``DENSE_PERIOD`` seconds (about 50 per 30 s per kind, the rate at which callers used to lose
  their exit codes), so the fault rate does not depend on how many requests the run makes.

The default run has the scaled-down probabilistic matrix and one dense run with every kind at
once, both with 200 concurrent calls of short commands; ``TRIO_SWE_FULL_FAULT_MATRIX=1`` adds the
issue's full size (200 calls of 5-20 s) for each kind alone and all together.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Sequence
from functools import partial

import msgspec
import pytest
import trio

from trio_swe import ExecResult, exec_and_wait, open_sandbox, wait_cleanups
from trio_swe.testing import REFUSED_STREAM, Fault, FaultPlan

from .helpers import ThreadedServer, e2b_backend_for, open_server_in_thread

ENVD = "/process.Process/*"
#: One armed injection per kind every this many seconds: 50 per 30 s.
DENSE_PERIOD = 0.6

#: Per kind, the shapes the dense ticker arms in turn (each fires once, on the next request).
DENSE_SHAPES: dict[str, list[Fault]] = {
    "goaway": [
        Fault(kind="goaway", route=ENVD, after_sec=0.2),
        Fault(kind="goaway", route=ENVD, before_request=True),
        Fault(kind="goaway", route="/files", after_sec=0.0),
    ],
    "rst": [
        Fault(kind="rst", route=ENVD, after_sec=0.2),
        Fault(kind="rst", route=ENVD, before_request=True, code=REFUSED_STREAM),
        Fault(kind="rst", route="/files", after_sec=0.0),
    ],
    "status": [
        Fault(kind="status", route="*", status=502),
        Fault(kind="status", route="*", status=503, retry_after=0.1),
        Fault(kind="status", route="*", status=429, retry_after=0.2),
    ],
    "tcp_close": [
        Fault(kind="tcp_close", route=ENVD, after_sec=0.2),
        Fault(kind="tcp_close", route=ENVD, before_request=True),
    ],
    "hang": [Fault(kind="hang", route=ENVD, after_sec=0.2)],
    "no_end": [Fault(kind="no_end", route=ENVD, after_sec=0.2)],
    "latency": [Fault(kind="latency", route="*", delay_sec=0.5)],
}
#: Kinds armed only every n-th tick: a hang costs its victim a whole idle-watchdog period
#: (3.5 s here) and every re-attach is the next request, so at one per 0.6 s nearly every
#: request of a slowed-down run would hang (a livelock of the test, not a finding).
DENSE_EVERY: dict[str, int] = {"hang": 5}


def every_fault(p: float) -> list[Fault]:
    """Every fault kind the server knows, each with probability ``p`` per matching request."""
    faults = [
        # Gateway answers: never reach envd (REST routes too: they never create anything).
        Fault(kind="status", route="*", status=503, retry_after=0.1, probability=p),
        Fault(kind="status", route="*", status=502, probability=p),
        Fault(kind="status", route="*", status=429, retry_after=0.2, probability=p),
        Fault(kind="latency", route="*", delay_sec=0.3, probability=p),
        # Frame level, on envd's RPCs and files (not on REST create: the local server does not
        # honour Idempotency-Key, so a cut create would really boot a second sandbox).
        # Connection-level faults (GOAWAY, TCP close) cut every stream multiplexed on the
        # connection, so they get a smaller probability per request: at ``p``, with dozens of
        # streams per connection, nearly every round of re-attaches would be cut again.
        Fault(kind="rst", route=ENVD, after_sec=0.3, probability=p),
        Fault(kind="rst", route=ENVD, before_request=True, code=REFUSED_STREAM, probability=p),
        Fault(kind="goaway", route=ENVD, after_sec=0.4, probability=p / 8),
        Fault(kind="goaway", route=ENVD, before_request=True, probability=p / 8),
        Fault(kind="tcp_close", route=ENVD, after_sec=0.5, probability=p / 8),
        Fault(kind="no_end", route=ENVD, after_sec=0.2, probability=p),
        Fault(kind="hang", route=ENVD, after_sec=0.2, probability=p / 2),
        Fault(kind="rst", route="/files", after_sec=0.0, probability=p),
    ]
    return faults


def one_of_each_kind() -> list[Fault]:
    """Every kind once, on a ``Start`` stream, so coverage never depends on timing or luck.

    The seeded coins of :func:`every_fault` decide per request, and how many requests a run makes
    depends on scheduling, so a rare kind (a connection fault at ``p/8``) may not come up at all.
    These rules fire on the first matching requests once faults are enabled (spaced by ``skip``)
    and are of shapes that are always recorded: refused before forwarding, or due on a stream whose
    process ends first ("a decided fault always happens").
    """
    start = "/process.Process/Start"
    shapes = [
        Fault(kind="status", route=start, status=503, retry_after=0.1),
        Fault(kind="latency", route=start, delay_sec=0.3),
        Fault(kind="rst", route=start, before_request=True, code=REFUSED_STREAM),
        Fault(kind="goaway", route=start, before_request=True),
        Fault(kind="tcp_close", route=start, before_request=True),
        Fault(kind="no_end", route=start, after_sec=0.2),
        Fault(kind="hang", route=start, after_sec=0.2),
    ]
    return [msgspec.structs.replace(f, times=1, skip=3 * i) for i, f in enumerate(shapes)]


async def _dense_ticker(
    threaded: ThreadedServer,
    plan: FaultPlan,
    kinds: Sequence[str],
    *,
    rotate: bool,
    min_ticks: int,
    enough: trio.Event,
) -> None:
    """Arm injections every ``DENSE_PERIOD`` s while faults are on.

    ``rotate``: one kind per tick, in turn (every kind present, the total at the dense rate);
    otherwise every kind on every tick (each kind alone at the dense rate). ``enough`` is set
    after ``min_ticks`` ticks with faults on.
    """
    tick = 0
    while True:
        await trio.sleep(DENSE_PERIOD)
        if not plan.enabled:
            continue
        now = [kinds[tick % len(kinds)]] if rotate else list(kinds)
        armed = [
            msgspec.structs.replace(DENSE_SHAPES[k][tick % len(DENSE_SHAPES[k])], times=1)
            for k in now
            if rotate or tick % DENSE_EVERY.get(k, 1) == 0
        ]
        tick += 1

        async def add(armed: list[Fault] = armed) -> None:
            for fault in armed:
                plan.add(fault)

        await threaded.call(add)
        if tick >= min_ticks:
            enough.set()


async def run_matrix(
    *,
    calls: int,
    sandboxes: int,
    min_sec: float,
    max_sec: float,
    p: float,
    seed: int,
    dense: Sequence[str] = (),
    rotate: bool = False,
    min_ticks: int = 0,
) -> dict[str, int]:
    """Run the matrix; with ``dense``, faults stay on for at least ``min_ticks`` dense ticks.

    How long the calls take depends on the machine, so a fast one would end the run before the
    ticker armed the injections a test counts on. Each sandbox keeps making filler calls (whose
    exit codes are checked like the others) until the ticker has ticked ``min_ticks`` times.
    """
    rng = random.Random(seed)
    plan = FaultPlan([*one_of_each_kind(), *every_fault(p)], seed=seed)
    plan.enabled = False  # boot cleanly; faults start with the commands
    async with open_server_in_thread(faults=plan) as threaded:
        server = threaded.server
        # 16 streams per connection: several connections, and a connection fault cuts a few.
        async with e2b_backend_for(server, seed=seed, streams_per_connection=16) as backend:
            jobs = [(i, rng.uniform(min_sec, max_sec), rng.randrange(0, 120)) for i in range(calls)]
            outcomes: dict[int, ExecResult | Exception] = {}
            logs: dict[int, bytes] = {}
            leftovers: dict[int, str] = {}
            running = {"n": sandboxes}
            quiet = trio.Event()  # every sandbox's calls are done: faults are off
            enough = trio.Event()  # the dense ticker has ticked min_ticks times
            if not dense:
                enough.set()
            fillers: list[ExecResult] = []

            async def one_sandbox(k: int) -> None:
                async with open_sandbox(backend, "base", ttl_sec=3600) as sb:
                    mine = [j for j in jobs if j[0] % sandboxes == k]

                    async def one(i: int, sec: float, code: int) -> None:
                        try:
                            outcomes[i] = await exec_and_wait(
                                sb,
                                f"echo {i} >> /tmp/effects; sleep {sec:.2f}; exit {code}",
                                time_budget_sec=600,  # correctness, not speed: a loaded 2-core CI machine is slow
                            )
                        except Exception as exc:  # counted as lost below, never swallowed
                            outcomes[i] = exc

                    ready.append(k)
                    if len(ready) == sandboxes:
                        plan.enabled = True
                    async with trio.open_nursery() as nursery:
                        for i, sec, code in mine:
                            nursery.start_soon(one, i, sec, code)
                    while not enough.is_set():
                        filler = await exec_and_wait(sb, "sleep 0.3; exit 7", time_budget_sec=600)
                        fillers.append(filler)
                    running["n"] -= 1
                    if running["n"] == 0:
                        plan.enabled = False  # read the evidence without faults
                        quiet.set()
                    await quiet.wait()
                    logs[k] = await sb.read_file("/tmp/effects")
                    await wait_cleanups(sb)  # calls remove their files after returning
                    # Every path left, so that a failure says what was left (a call's whole
                    # directory, or one file a late request wrote).
                    left = await sb.exec(
                        "cd /tmp/.trio_swe 2>/dev/null && find . -mindepth 1 | sort; true", cwd="/"
                    )
                    leftovers[k] = left.output.strip()

            ready: list[int] = []
            with trio.fail_after(900):  # a hang fails the test, never blocks CI
                async with trio.open_nursery() as nursery:
                    if dense:
                        nursery.start_soon(
                            partial(
                                _dense_ticker,
                                threaded,
                                plan,
                                dense,
                                rotate=rotate,
                                min_ticks=min_ticks,
                                enough=enough,
                            )
                        )
                    async with trio.open_nursery() as sandboxes_nursery:
                        for k in range(sandboxes):
                            sandboxes_nursery.start_soon(one_sandbox, k)
                    nursery.cancel_scope.cancel()

            effects: dict[int, int] = {}
            for k in range(sandboxes):
                for x in logs[k].split():
                    effects[int(x)] = effects.get(int(x), 0) + 1
            errors = {i: o for i, o in outcomes.items() if isinstance(o, Exception)}
            lost = sorted(i for i in errors if effects.get(i, 0) > 0)
            double = sorted(i for i, n in effects.items() if n > 1)
            wrong = sorted(
                i
                for i, _sec, code in jobs
                if isinstance(outcomes.get(i), ExecResult)
                and (outcomes[i].exit_code, outcomes[i].reason) != (code, "exit")  # type: ignore[union-attr]
            )
            assert not errors, {i: repr(e)[:300] for i, e in list(errors.items())[:5]}
            assert (lost, double, wrong) == ([], [], []), (
                lost,
                double,
                [(i, outcomes[i], dict((j, c) for j, _, c in jobs)[i]) for i in wrong[:5]],
            )
            assert sorted(effects) == [j[0] for j in jobs]
            assert {(f.exit_code, f.reason) for f in fillers} <= {(7, "exit")}, fillers[:5]
            late = {k: late_writes(v) for k, v in leftovers.items()}
            assert not {k: v for k, v in leftovers.items() if late[k] is None}
            stats = await threaded.statistics()
            injected = stats.faults_injected
            assert stats.live_sandboxes == 0
            assert stats.processes_running == 0
            bstats = backend.statistics()
            assert bstats.live == 0
        assert await threaded.live_sandbox_ids() == []
    return {
        "faults": sum(injected.values()),
        "kinds": len(injected),
        "late_writes": sum(n or 0 for n in late.values()),
        **injected,
    }


_LATE_WRITE = re.compile(r"\./([0-9a-f]{32})(/cmd\.[0-9a-f]{32}\.sh)?")


def late_writes(listing: str) -> int | None:
    """How many call directories hold nothing but their command file, or None if anything else
    was left. A retried write whose first attempt the server ran late can land after the call's
    removal (docs/detached.md): no client can fence that, and the kill takes it."""
    dirs: dict[str, int] = {}
    for line in listing.split():
        m = _LATE_WRITE.fullmatch(line)
        if m is None:
            return None
        dirs[m[1]] = dirs.get(m[1], 0) + (1 if m[2] else 0)
    if any(n != 1 for n in dirs.values()):
        return None
    return len(dirs)


async def test_fault_matrix_scaled_down() -> None:
    # p=0.02 per rule is about one faulted RPC in six: hostile, yet eight transport attempts in a
    # row all faulted stays a one-in-millions event. Every kind is covered by one_of_each_kind().
    got = await run_matrix(calls=40, sandboxes=4, min_sec=1.0, max_sec=3.0, p=0.02, seed=20261129)
    assert got["faults"] >= 20, got  # faults really happened
    assert got["kinds"] == 7, got  # of every kind the server knows


async def _dense_run(
    *, p: float, seed: int, dense: Sequence[str], min_ticks: int, rotate: bool = False
) -> dict[str, int]:
    """200 concurrent calls of 0.5-3 s on 10 sandboxes, a dense ticker arming ``dense``."""
    return await run_matrix(
        calls=200,
        sandboxes=10,
        min_sec=0.5,
        max_sec=3.0,
        p=p,
        seed=seed,
        dense=dense,
        rotate=rotate,
        min_ticks=min_ticks,
    )


async def test_fault_matrix_dense_goaway() -> None:
    # Issue 9 item 4: a GOAWAY every 0.6 s (50 per 30 s) under 200 concurrent calls; 33 of 200
    # callers used to get SandboxUnreachableError for commands that ran.
    got = await _dense_run(p=0.0, seed=7, dense=["goaway"], min_ticks=14)
    # 14 ticks arm 14 GOAWAYs; the last one or two may find no request before faults go off.
    assert got.get("goaway", 0) >= 10, got


async def test_fault_matrix_dense_every_kind() -> None:
    # Every kind in turn at the dense rate, on top of the coins: no caller may lose its exit code
    # however many attempts in a row fail.
    # min_ticks: three rounds of the seven kinds.
    got = await _dense_run(p=0.01, seed=9, dense=list(DENSE_SHAPES), rotate=True, min_ticks=21)
    assert got["kinds"] == 7, got
    assert got["faults"] >= 20, got


FULL = pytest.mark.skipif(
    os.environ.get("TRIO_SWE_FULL_FAULT_MATRIX") != "1",
    reason="the issue's full size (200 calls of 5-20 s); set TRIO_SWE_FULL_FAULT_MATRIX=1",
)


@pytest.mark.slow
@FULL
async def test_fault_matrix_full_size() -> None:
    got = await run_matrix(calls=200, sandboxes=20, min_sec=5.0, max_sec=20.0, p=0.03, seed=5)
    print("full matrix (probabilistic):", got)
    assert got["kinds"] == 7, got  # every kind the server knows


@pytest.mark.slow
@FULL
@pytest.mark.parametrize(
    "kinds", [*([k] for k in DENSE_SHAPES), ["mixed"]], ids=lambda k: "+".join(k)
)
async def test_fault_matrix_full_size_dense(kinds: list[str]) -> None:
    mixed = kinds == ["mixed"]
    got = await run_matrix(
        calls=200,
        sandboxes=20,
        min_sec=5.0,
        max_sec=20.0,
        p=0.0,
        seed=11,
        dense=list(DENSE_SHAPES) if mixed else kinds,
        rotate=mixed,
    )
    print(f"full matrix, dense {kinds}:", got)
    assert got["faults"] >= 10, got
