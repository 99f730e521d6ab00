"""``DockerBackend``: one container per sandbox, through the Docker Engine API (or podman's)."""

from __future__ import annotations

import itertools
import logging
import os
import posixpath
import resource
import shlex
import socket
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import trio

from ..._errors import (
    BackendUnavailableError,
    PermanentBootError,
    SandboxBootError,
    SandboxError,
)
from .._keyed import KeyedLock
from .._types import BackendStatistics, ResourceLimits, SandboxSpec
from .._validate import check_abs_path, check_env
from ..local._image import ImageCache, split_image
from ._engine import Engine, EngineError
from ._sandbox import DockerSandbox, remove_container
from ._wire import (
    LABEL_OWNER,
    LABEL_SANDBOX,
    PullProgress,
    container_body,
    endpoint_from,
    is_podman,
    is_stale,
    owner_id,
    split_reference,
)

log = logging.getLogger("trio_swe.docker")

# The image's own ENV comes first; these only fill in what is commonly wanted on top.
_BASE_ENV = {
    # Trees copied in (and images) are owned by root; let `agent` run git in them anyway.
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "safe.directory",
    "GIT_CONFIG_VALUE_0": "*",
    "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _start_ticks(pid: int) -> str:
    """A process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, ticks: str) -> bool:
    return _start_ticks(pid) == ticks != ""


def _podman_ulimits() -> list[tuple[str, int, int]]:
    """Explicit rlimits for podman, whose defaults exceed what root may set on some hosts.

    Without ``CAP_SYS_RESOURCE`` (containers, Firecracker guests), podman's default ``nofile``
    (1048576) fails the container start; so do high ``nproc`` values.
    """
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1048576 if nofile == resource.RLIM_INFINITY else min(nofile, 1048576)
    nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
    return [("nofile", nofile, nofile), ("nproc", nproc, nproc)]


def _tar_tree(src: Path, arcname: str) -> IO[bytes]:
    """A tar of the directory ``src`` as ``arcname``, owned by root (a temp file, for upload)."""
    out = tempfile.TemporaryFile()  # noqa: SIM115 (the caller reads and closes it)

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.add(src, arcname=arcname, filter=as_root)
    out.seek(0)
    return out


class DockerBackendStatistics(BackendStatistics, frozen=True, kw_only=True):
    """The docker backend's counters.

    Attributes:
        swept: containers of dead owners removed by the startup sweep.
        pulls: images pulled through the daemon.
        api_version: the negotiated Engine API version (None before the first connection).
        engine: ``"docker <version>"`` or ``"podman <version>"`` (None before it).
    """

    swept: int
    pulls: int
    api_version: str | None
    engine: str | None


class DockerBackend:
    """Sandboxes as containers of a Docker daemon (or podman's Docker-compatible service).

    Every sandbox is a container made from ``spec.image``, started with no network
    (``NetworkMode: none``) unless the spec allows it and ``network_mode`` names one, the
    resource limits of ``spec.limits`` (else ``limits``), and labels marking it as ours
    (``trio_swe.sandbox``, ``trio_swe.owner``: this process). Commands run through the exec API,
    files move through the archive API, and the container is force-removed when the sandbox is
    killed. Containers left by a process that died (by its owner label) are removed at the first
    boot. Images the daemon lacks are pulled through it (``on_pull_progress`` sees the progress).

    Use it through :func:`trio_swe.open_sandbox` with an image reference, and close it
    (``async with DockerBackend() as backend`` or :meth:`aclose`) when done.

    Args:
        host: the daemon, as ``DOCKER_HOST`` spells it (``unix:///run/docker.sock``,
            ``tcp://127.0.0.1:2375``); default ``$DOCKER_HOST``, else ``/var/run/docker.sock``.
        base_image: lets a host directory or ``path@commit`` stand as the image (as on the local
            backend): the container is made from ``base_image`` and the tree is copied to the
            workdir. Default ``$SWE_DOCKER_BASE_IMAGE``; unset: such images are refused.
        network_mode: the network of sandboxes whose spec allows network (``spec.network``);
            ``"none"`` (the default) keeps every sandbox off the network.
        limits: resource limits of sandboxes whose spec has none.
        env: environment of every command in every sandbox of this backend.
        init: run the daemon's init (``docker-init``) as PID 1, reaping orphans. Default: on
            for Docker, off for podman (its ``catatonit`` is often not installed; the keep-alive
            shell then is PID 1 and reaps what is reparented to it).
        ulimits: explicit rlimits, ``(name, soft, hard)``; default none for Docker and
            ``nofile``/``nproc`` within this process's hard limits for podman.
        pull: ``"missing"`` pulls images the daemon lacks; ``"never"`` fails the boot instead.
        on_pull_progress: called with a :class:`PullProgress` after every progress line.
        max_concurrent_boots: container creations in flight at once.
        boot_timeout_sec: bound on one container's create + start (+ tree copy), pulls excluded.
        pull_timeout_sec: bound on one image pull.
        request_timeout: bound on one API call (execs are bounded by their own ``timeout``).
        state_dir: where ``path@commit`` checkouts are cached (as on the local backend).
        host_paths: host directories shown read-only at the same path in every container (bind
            mounts of the daemon's host, so a local daemon): e.g. the CLI agents' install cache
            and the gateway's socket directory, which CLI agents need
            (:func:`trio_swe.agents.cli_agent_host_paths`).

    Raises:
        BackendUnavailableError: at the first boot, when the daemon cannot be reached.
    """

    name = "docker"

    def __init__(
        self,
        *,
        host: str | None = None,
        base_image: str | None = None,
        network_mode: str = "none",
        limits: ResourceLimits | None = None,
        env: Mapping[str, str] | None = None,
        init: bool | None = None,
        ulimits: list[tuple[str, int, int]] | None = None,
        pull: str = "missing",
        on_pull_progress: Callable[[PullProgress], None] | None = None,
        max_concurrent_boots: int = 8,
        boot_timeout_sec: float = 120.0,
        pull_timeout_sec: float = 3600.0,
        request_timeout: float = 60.0,
        state_dir: str | os.PathLike[str] | None = None,
        host_paths: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        if pull not in ("missing", "never"):
            raise SandboxError(f"pull must be 'missing' or 'never', got {pull!r}")
        self.endpoint = endpoint_from(host if host is not None else os.environ.get("DOCKER_HOST"))
        self.base_image = base_image or os.environ.get("SWE_DOCKER_BASE_IMAGE") or None
        self.network_mode = network_mode
        self.host_paths = [check_abs_path(os.fspath(p), what="host_paths") for p in host_paths]
        for p in self.host_paths:
            if ":" in p:
                raise SandboxError(f"host_paths: a bind-mounted path cannot contain ':': {p!r}")
        self.limits = limits
        self._env = {**_BASE_ENV, **check_env(env)}
        self._init = init
        self._ulimits = ulimits
        self._pull = pull
        self._on_progress = on_pull_progress
        self._boot_limiter = trio.CapacityLimiter(max_concurrent_boots)
        self._boot_timeout = boot_timeout_sec
        self._pull_timeout = pull_timeout_sec
        self._request_timeout = request_timeout
        root = (
            Path(state_dir)
            if state_dir
            else Path(tempfile.gettempdir()) / f"trio_swe-{os.getuid()}"
        )
        self._trees = ImageCache(root / "images")
        self._engine: Engine | None = None
        self._token: object | None = None
        self._ready = False
        self._podman = False
        self._pull_locks = KeyedLock()
        self._counter = itertools.count()
        self._host = socket.gethostname()
        self._boot_id = _boot_id()
        self._owner = owner_id(self._host, self._boot_id, os.getpid(), _start_ticks(os.getpid()))
        self._live: set[DockerSandbox] = set()
        self._stats: dict[str, Any] = {
            "created": 0,
            "killed": 0,
            "boot_failures": 0,
            "swept": 0,
            "pulls": 0,
            "api_version": None,
            "engine": None,
        }

    # -- connection -----------------------------------------------------------------------------
    def _current_engine(self) -> Engine:
        token = trio.lowlevel.current_trio_token()
        if self._engine is None or token is not self._token:
            # httpx clients belong to the trio run that made them: a new run starts over.
            self._engine = Engine(self.endpoint, request_timeout=self._request_timeout)
            self._token = token
            self._ready = False
        return self._engine

    async def engine(self) -> Engine:
        """The negotiated connection (``GET /version`` once per trio run; sweep once)."""
        engine = self._current_engine()
        if not self._ready:
            try:
                version = await engine.negotiate()
            except SandboxError as exc:
                raise BackendUnavailableError(str(exc)) from exc
            self._podman = is_podman(version)
            self._stats["api_version"] = engine.prefix.removeprefix("/v")
            self._stats["engine"] = (
                f"{'podman' if self._podman else 'docker'} {version.get('Version')}"
            )
            if self._stats["created"] == 0 and self._stats["boot_failures"] == 0:
                await self.sweep()
            self._ready = True
        return engine

    async def sweep(self) -> int:
        """Force-remove containers left by processes of this host that are gone; their number."""
        engine = self._current_engine()
        r = await engine.request(
            "GET",
            "/containers/json",
            params={"all": "true", "filters": f'{{"label":["{LABEL_SANDBOX}"]}}'},
            what="list containers",
        )
        swept = 0
        for c in r.json():
            owner = (c.get("Labels") or {}).get(LABEL_OWNER, "")
            if is_stale(owner, host=self._host, boot_id=self._boot_id, alive=_alive):
                await remove_container(engine, str(c["Id"]))
                swept += 1
        if swept:
            log.info("removed %d container(s) left by dead processes", swept)
        self._stats["swept"] += swept
        return swept

    async def aclose(self) -> None:
        """Close the connections (sandboxes are not killed here: ``open_sandbox`` does that)."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await engine.aclose()

    async def __aenter__(self) -> DockerBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def statistics(self) -> DockerBackendStatistics:
        return DockerBackendStatistics(**self._stats, live=len(self._live))

    # -- images -----------------------------------------------------------------------------------
    async def ensure_image(self, ref: str) -> None:
        """Pull ``ref`` through the daemon unless it has it (one pull per image at a time)."""
        engine = await self.engine()
        if await engine.image_inspect(ref) is not None:
            return
        async with self._pull_locks.hold(ref):
            if await engine.image_inspect(ref) is not None:
                return
            if self._pull == "never":
                raise SandboxBootError(f"docker image {ref!r} is not present and pull='never'")
            progress = PullProgress(image=ref)
            from_image, tag = split_reference(ref)
            log.info("pulling %s", ref)
            t0 = time.monotonic()
            with trio.move_on_after(self._pull_timeout) as scope:
                try:
                    await engine.pull(from_image, tag, progress, self._on_progress)
                except SandboxError as exc:
                    unknown = "not found" in str(exc) or "manifest unknown" in str(exc)
                    kind = PermanentBootError if unknown else SandboxBootError
                    raise kind(f"cannot pull docker image {ref!r}: {exc}") from exc
            if scope.cancelled_caught:
                raise SandboxBootError(f"pulling {ref!r} took over {self._pull_timeout:g} s")
            if await engine.image_inspect(ref) is None:
                raise SandboxBootError(
                    f"pull of {ref!r} ended without the image: {progress.status}"
                )
            self._stats["pulls"] += 1
            log.info("pulled %s in %.1f s", ref, time.monotonic() - t0)

    def _is_tree(self, image: str) -> bool:
        if image.startswith("/") or image.startswith("."):
            return True
        return os.path.isdir(image)

    # -- boot -------------------------------------------------------------------------------------
    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> DockerSandbox:
        """Create and start a container; see :func:`trio_swe.open_sandbox`."""
        workdir = check_abs_path(spec.workdir, what="workdir")
        if workdir == "/":
            raise SandboxBootError("workdir must not be /")
        tree: Path | None = None
        image = spec.image
        if self._is_tree(image):
            if self.base_image is None:  # no retry makes one appear
                raise PermanentBootError(
                    f"docker image {image!r} is a host path: set SWE_DOCKER_BASE_IMAGE (or pass "
                    "DockerBackend(base_image=...)) to copy host trees into containers of that "
                    "image"
                )
            split_image(image)  # a clear error for neither a directory nor path@commit
            tree = await self._trees.resolve(image)
            image = self.base_image
        try:
            await self.ensure_image(image)
        except BaseException:
            self._stats["boot_failures"] += 1
            raise
        async with self._boot_limiter:
            return await self._boot(spec, image, workdir, tree, nursery)

    async def _boot(
        self, spec: SandboxSpec, image: str, workdir: str, tree: Path | None, nursery: trio.Nursery
    ) -> DockerSandbox:
        engine = await self.engine()
        t0 = time.monotonic()
        name = f"trio_swe-{os.getpid()}-{next(self._counter)}-{os.urandom(3).hex()}"
        network = self.network_mode if spec.network else "none"
        labels = {
            LABEL_SANDBOX: "1",
            LABEL_OWNER: self._owner,
            **{f"trio_swe.meta.{k}": str(v) for k, v in spec.metadata.items()},
        }
        ulimits = (
            self._ulimits
            if self._ulimits is not None
            else (_podman_ulimits() if self._podman else [])
        )
        body = container_body(
            image=image,
            workdir=None if tree is not None else workdir,
            env={**self._env, **check_env(spec.env)},
            labels=labels,
            network_mode=network,
            limits=spec.limits or self.limits,
            ulimits=ulimits,
            init=self._init if self._init is not None else not self._podman,
            binds=self.host_paths,
        )
        try:
            with trio.fail_after(self._boot_timeout):
                # Shielded: a create cut off midway goes on in the daemon, and its container
                # could appear after our remove. Bounded by the request timeout instead.
                with trio.CancelScope(shield=True):
                    r = await engine.request(
                        "POST", "/containers/create", params={"name": name}, json=body,
                        what=f"create container from {image}",
                    )  # fmt: skip
                cid = str(r.json()["Id"])
                await trio.lowlevel.checkpoint()
                await engine.request("POST", f"/containers/{cid}/start", what="start container")
                sandbox = DockerSandbox(
                    engine=engine,
                    container_id=cid,
                    name=name,
                    workdir=workdir,
                    nursery=nursery,
                    env={**self._env, **check_env(spec.env)},
                    boot_sec=0.0,
                    on_close=self._closed,
                )
                if tree is not None:
                    await self._copy_tree(engine, sandbox, tree, workdir)
        except BaseException as exc:
            self._stats["boot_failures"] += 1
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + 30
                try:
                    # By name: a create whose reply was lost (cancelled mid-call) is found too.
                    await remove_container(engine, name)
                except SandboxError:
                    pass
            if isinstance(exc, trio.TooSlowError):
                raise SandboxBootError(
                    f"the container was not up within {self._boot_timeout:g} s"
                ) from None
            if isinstance(exc, EngineError):
                raise SandboxBootError(
                    f"cannot start a container of {image!r}: {exc.message}"
                ) from exc
            raise
        sandbox.record_boot(time.monotonic() - t0)
        self._stats["created"] += 1
        self._live.add(sandbox)
        return sandbox

    async def _copy_tree(
        self, engine: Engine, sandbox: DockerSandbox, tree: Path, workdir: str
    ) -> None:
        parent, base = posixpath.split(workdir.rstrip("/"))
        if parent != "/":
            r = await sandbox.exec(f"mkdir -p -- {shlex.quote(parent)}", cwd="/", timeout=60)
            if not r.ok:
                raise SandboxBootError(f"cannot create {parent} in the container: {r.output}")
        archive = await trio.to_thread.run_sync(_tar_tree, tree, base)
        try:
            data = await trio.to_thread.run_sync(archive.read)
        finally:
            archive.close()
        await engine.request(
            "PUT",
            f"/containers/{sandbox.id}/archive",
            params={"path": parent},
            content=data,
            headers={"content-type": "application/x-tar"},
            what=f"copy {tree} to {workdir}",
        )

    def _closed(self, sandbox: DockerSandbox) -> None:
        if sandbox in self._live:
            self._live.discard(sandbox)
            self._stats["killed"] += 1


__all__ = ["DockerBackend", "EngineError"]
