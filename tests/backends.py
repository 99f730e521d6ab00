"""Backends that the backend-agnostic suites (e.g. tests/sandbox/test_detached.py) run against.

Each entry opens a ready Backend for one test and tears everything down afterwards. A suite that
uses the ``backend`` fixture runs once per entry, unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from trio_swe.sandbox import Backend
from trio_swe.sandbox.local import LocalBackend


@asynccontextmanager
async def open_local_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    del tmp_path
    yield LocalBackend()


@asynccontextmanager
async def open_e2b_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    """E2BBackend over h2c against trio_swe.testing's envd server (real local sandboxes).

    The server runs in a thread of its own (so it serves hypothesis examples, which run in
    trio runs of their own too); the template ``str(tmp_path / "image")`` (the suites' image
    directory) boots that directory.
    """
    from .e2b.helpers import e2b_backend_for, open_server_in_thread

    image = str(tmp_path / "image")
    async with open_server_in_thread(templates={image: image, "base": image}) as threaded:
        async with e2b_backend_for(threaded.server) as backend:
            yield backend
        assert await threaded.live_sandbox_ids() == [], "E2BBackend leaked a sandbox"


@asynccontextmanager
async def open_docker_backend(tmp_path: Path) -> AsyncIterator[Backend]:
    """DockerBackend against the test daemon (tests/dockerenv.py): the suites' image directory
    is copied into a container of the base image. Checks that no container of ours is left."""
    from trio_swe.sandbox.docker import DockerBackend

    from .dockerenv import ACTIVE

    del tmp_path
    assert ACTIVE is not None, "the docker_env fixture starts the daemon first"
    async with DockerBackend(host=ACTIVE.docker_host, base_image=ACTIVE.base_image) as backend:
        yield backend
    assert ACTIVE.own_containers() == [], "DockerBackend leaked a container"


BACKENDS: dict[str, Callable[[Path], AbstractAsyncContextManager[Backend]]] = {
    "local": open_local_backend,
    "e2b": open_e2b_backend,
    "docker": open_docker_backend,
}
