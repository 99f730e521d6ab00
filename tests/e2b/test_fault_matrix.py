"""The fault matrix: many concurrent ``exec_and_wait`` calls while the server injects every fault.

Seeded. Every exit code must come back right, every command's side effect (one line appended to
a file) must happen exactly once, and afterwards no sandbox and no process may be left on the
server. A silent stream must be found by the idle watchdog, not hang the test.

The default run is scaled down (40 calls of 1-3 s); ``TRIO_SWE_FULL_FAULT_MATRIX=1`` runs the
issue's full size (200 calls of 5-20 s).
"""

from __future__ import annotations

import os
import random

import msgspec
import pytest
import trio

from trio_swe import exec_and_wait, open_sandbox
from trio_swe.testing import REFUSED_STREAM, Fault, FaultPlan

from .helpers import e2b_backend_for, open_server_in_thread

ENVD = "/process.Process/*"


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


async def run_matrix(
    *,
    calls: int,
    sandboxes: int,
    min_sec: float,
    max_sec: float,
    p: float,
    seed: int,
) -> dict[str, int]:
    rng = random.Random(seed)
    plan = FaultPlan([*one_of_each_kind(), *every_fault(p)], seed=seed)
    plan.enabled = False  # boot cleanly; faults start with the commands
    async with open_server_in_thread(faults=plan) as threaded:
        server = threaded.server
        # 16 streams per connection: several connections, and a connection fault cuts a few.
        async with e2b_backend_for(server, seed=seed, streams_per_connection=16) as backend:
            jobs = [(i, rng.uniform(min_sec, max_sec), rng.randrange(0, 120)) for i in range(calls)]
            results: dict[int, tuple[int, str]] = {}
            logs: dict[int, bytes] = {}

            async def one_sandbox(k: int) -> None:
                async with open_sandbox(backend, "base", ttl_sec=600) as sb:
                    mine = [j for j in jobs if j[0] % sandboxes == k]

                    async def one(i: int, sec: float, code: int) -> None:
                        r = await exec_and_wait(
                            sb,
                            f"echo {i} >> /tmp/effects; sleep {sec:.2f}; exit {code}",
                            time_budget_sec=max_sec * 10 + 60,
                        )
                        results[i] = (r.exit_code, r.reason)

                    ready.append(k)
                    if len(ready) == sandboxes:
                        plan.enabled = True
                    async with trio.open_nursery() as nursery:
                        for i, sec, code in mine:
                            nursery.start_soon(one, i, sec, code)
                    plan.enabled = False  # read the evidence without faults
                    logs[k] = await sb.read_file("/tmp/effects")

            ready: list[int] = []
            with trio.fail_after(max_sec * 10 + 240):  # a hang fails the test, never blocks CI
                async with trio.open_nursery() as nursery:
                    for k in range(sandboxes):
                        nursery.start_soon(one_sandbox, k)

            for i, _sec, code in jobs:
                assert results[i] == (code, "exit"), (i, results[i], code)
            for k in range(sandboxes):
                lines = sorted(int(x) for x in logs[k].split())
                assert lines == [j[0] for j in jobs if j[0] % sandboxes == k], k
            stats = await threaded.statistics()
            injected = stats["faults_injected"]
            assert stats["live_sandboxes"] == 0
            assert stats["processes_running"] == 0
            bstats = backend.statistics()
            assert bstats["sandboxes_live"] == 0
        assert await threaded.live_sandbox_ids() == []
    return {"faults": sum(injected.values()), "kinds": len(injected), **injected}


async def test_fault_matrix_scaled_down() -> None:
    # p=0.02 per rule is about one faulted RPC in six: hostile, yet eight transport attempts in a
    # row all faulted stays a one-in-millions event (at p=0.04, one in three, retries ran out in
    # about one run of ten under load). Every kind is covered by one_of_each_kind() anyway.
    got = await run_matrix(calls=40, sandboxes=4, min_sec=1.0, max_sec=3.0, p=0.02, seed=20261129)
    assert got["faults"] >= 20, got  # faults really happened
    assert got["kinds"] == 7, got  # of every kind the server knows


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TRIO_SWE_FULL_FAULT_MATRIX") != "1",
    reason="the issue's full size (200 calls of 5-20 s); set TRIO_SWE_FULL_FAULT_MATRIX=1",
)
async def test_fault_matrix_full_size() -> None:
    got = await run_matrix(calls=200, sandboxes=20, min_sec=5.0, max_sec=20.0, p=0.03, seed=5)
    assert got["kinds"] == 7, got  # every kind the server knows
