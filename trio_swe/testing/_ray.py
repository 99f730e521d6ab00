"""A Ray cluster on this machine that sends nothing off it: for tests, benchmarks and trials.

Ray, left to itself, looks beyond the machine in three places, even with
``RAY_USAGE_STATS_ENABLED=0`` and ``_node_ip_address="127.0.0.1"``:

* to find its own address it "connects" a UDP socket towards a public resolver, and
  ``ray.init(address="127.0.0.1:port")`` swaps the loopback address for the address found
  that way (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes it answer loopback instead);
* the head's always-started API server asks the cloud metadata address (169.254.169.254) which
  cloud it is on, unless ``~/ray_bootstrap_config.yaml`` exists (we give the cluster's
  processes a ``HOME`` holding an empty one);
* for a cluster not started by ``ray.init`` (``ray start``, ``Cluster``) it reports "usage
  stats disabled" to Ray's server (``RAY_USAGE_STATS_REPORT_URL`` points it at a closed
  loopback port).

Checked with ``strace -f -e trace=connect,sendto,sendmsg``: no address but loopback.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "LOOPBACK",
    "RAY_LOOPBACK_ENV",
    "add_loopback_node",
    "join_local_ray_cluster",
    "local_ray_cluster",
]

LOOPBACK = "127.0.0.1"

#: Environment that keeps Ray on loopback (see the module docstring).
RAY_LOOPBACK_ENV: Mapping[str, str] = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_REPORT_URL": f"http://{LOOPBACK}:9/",
    "RAY_AUTH_MODE": "disabled",  # a loopback cluster; its processes get a HOME of their own
}


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _node_args(num_cpus: int, object_store_mb: int) -> dict[str, Any]:
    return {
        "node_ip_address": LOOPBACK,
        "include_dashboard": False,
        # Fewer processes per node start faster on a busy machine: no log monitor (nothing
        # reads worker logs here) and no autoscaler monitor (the cluster's size is fixed).
        "include_log_monitor": False,
        "no_monitor": True,
        "num_cpus": num_cpus,
        "object_store_memory": object_store_mb * 1024 * 1024,
    }


def add_loopback_node(
    cluster: Any, resources: Mapping[str, float], *, num_cpus: int = 2, object_store_mb: int = 100
) -> Any:
    """Add a node to a :func:`local_ray_cluster` (while it runs); returns it for ``remove_node``."""
    return cluster.add_node(**_node_args(num_cpus, object_store_mb), resources=dict(resources))


def _start(cluster_class: Any, args: dict[str, Any], nodes: Sequence[Mapping[str, float]]) -> Any:
    """Start the nodes; once more if a node misses Ray's registration wait.

    Ray waits a hard-coded 30 s for a new raylet to register with the GCS; on a saturated
    machine (many test processes on two cores) a node can miss it ("The current node timed out
    during startup"). One more attempt, from scratch, is the bounded answer to that.
    """
    for attempt in (1, 2):
        cluster = cluster_class()
        try:
            cluster.add_node(**args, resources=dict(nodes[0]))  # the first node is the head
            for resources in nodes[1:]:
                cluster.add_node(**args, resources=dict(resources))
            return cluster
        except Exception as exc:
            cluster.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    raise AssertionError("unreachable")


@contextlib.contextmanager
def local_ray_cluster(
    nodes: Sequence[Mapping[str, float]] = ({"node_a": 100}, {"node_b": 100}),
    *,
    num_cpus: int = 2,
    object_store_mb: int = 100,
    namespace: str | None = None,
) -> Iterator[Any]:
    """Start a Ray cluster of ``len(nodes)`` nodes on loopback and connect this process to it.

    Each node gets ``num_cpus`` CPUs and the custom resources of its entry in ``nodes`` (so
    workers can be pinned to it). Yields the :class:`ray.cluster_utils.Cluster`; on exit this
    process disconnects and every node is stopped. The Ray environment variables above stay set
    in this process while the cluster runs (child processes such as ``trio-swe run --ray``
    inherit them).
    """
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    args = _node_args(num_cpus, object_store_mb)
    with (
        tempfile.TemporaryDirectory(prefix="trio_swe-ray-home-") as home,
        _environ(RAY_LOOPBACK_ENV),
    ):
        with open(os.path.join(home, "ray_bootstrap_config.yaml"), "w") as f:
            f.write("{}\n")
        # Only the cluster's processes get this HOME and niceness. Ray nices its workers to 15,
        # which on a machine busy with anything else starves them: beside `stress-ng --cpu 8`
        # a worker's 0.5 s of imports took 60 s. Here they do the caller's work: its priority.
        with _environ({"HOME": home, "RAY_worker_niceness": "0"}):
            cluster = _start(Cluster, args, nodes)
        # Read from the environment when ray is first imported, which may have been earlier.
        saved = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False
        try:
            ray.init(address=cluster.address, _node_ip_address=LOOPBACK, namespace=namespace)
            try:
                yield cluster
            finally:
                ray.shutdown()
        finally:
            ray_constants.ENABLE_RAY_CLUSTER = saved
            cluster.shutdown()


def join_local_ray_cluster(address: str, *, namespace: str | None = None) -> None:
    """Connect this process (another driver) to a running :func:`local_ray_cluster`, on
    loopback as the cluster's own processes are. Disconnect with ``ray.shutdown()``."""
    import ray
    from ray._private import ray_constants

    os.environ.update(RAY_LOOPBACK_ENV)
    ray_constants.ENABLE_RAY_CLUSTER = False  # read when ray was imported
    ray.init(address=address, _node_ip_address=LOOPBACK, namespace=namespace)
