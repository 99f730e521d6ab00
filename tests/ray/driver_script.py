"""A driver process for tests/ray/test_faults.py: a pool on the e2b backend, killed mid-run.

``python driver_script.py JOB.json``: joins the test's cluster, starts two workers (their limiter
is the test's, found by name), prints ``WORKERS {"pids": [...], "ids": [...]}`` once they are
ready, then runs the rows, printing ``done <id>`` per result, until the test kills it.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.*

import trio

from tests.test_episode_support import demo_config
from trio_swe.grading import get_metadata
from trio_swe.testing._ray import join_local_ray_cluster


async def main(job: dict[str, object]) -> None:
    from trio_swe.ray import WorkerPool
    from trio_swe.sandbox.e2b import E2BBackend

    e2b = job["e2b"]
    assert isinstance(e2b, dict)
    rows = job["rows"]
    assert isinstance(rows, list)
    mds = [get_metadata(row, "scaleswe") for row in rows]
    async with WorkerPool(
        resources=[{"node_a": 1}, {"node_b": 1}],
        concurrency=2,
        config=demo_config(policy_url=job["policy_url"], backend="e2b"),
        backend=functools.partial(E2BBackend, h2c=True, **e2b),
        max_alive=4,
        limiter_name=str(job["limiter"]),
        orphan_ttl_sec=float(job["orphan_ttl_sec"]),  # type: ignore[arg-type]
    ) as pool:
        workers = pool.live_workers()
        line = {"pids": [w.info.pid for w in workers], "ids": [w.info.worker_id for w in workers]}
        print("WORKERS " + json.dumps(line), flush=True)
        async with pool.rollouts(mds, network=False) as stream:
            async for result in stream:
                print(f"done {result.instance_id} {result.status}", flush=True)


if __name__ == "__main__":
    job = json.loads(Path(sys.argv[1]).read_text())
    join_local_ray_cluster(str(job["address"]), namespace=str(job["namespace"]))
    trio.run(main, job)
