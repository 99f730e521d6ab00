"""One Ray cluster for the whole test session: a head and a second node, on loopback only.

:func:`trio_swe.testing.local_ray_cluster` starts both nodes on 127.0.0.1 with what keeps Ray
from looking beyond the machine; each carries a custom resource naming it (``node_a``,
``node_b``) so a worker can be pinned to each. A cluster start costs 5-10 s (more on a loaded
machine) and about 0.4 GiB, so there is one per session, started by the first test that asks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("ray")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A two-node cluster (custom resources ``node_a`` on the head, ``node_b`` on the other)."""
    from trio_swe.testing._ray import local_ray_cluster

    with local_ray_cluster(namespace="trio_swe-tests") as cluster:
        yield cluster
