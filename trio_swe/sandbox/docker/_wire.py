"""Sans-IO pieces of the Docker Engine API: endpoints, versions, stream frames, tars, labels.

Nothing here does I/O, so each piece is tested on bytes and dicts alone.
"""

from __future__ import annotations

import io
import posixpath
import re
import tarfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec

from ..._errors import ConfigError, SandboxError
from .._types import ResourceLimits

#: The oldest Engine API this client speaks (``Init``, ``PidsLimit``, archive API) and the newest
#: it knows. The version used is the server's, capped at ``API_MAX``.
API_MIN: Final = (1, 25)
API_MAX: Final = (1, 43)
DEFAULT_SOCKET: Final = "/var/run/docker.sock"

#: The label every container of ours carries (value: the owning process, see :func:`owner_id`).
LABEL_OWNER: Final = "trio_swe.owner"
LABEL_SANDBOX: Final = "trio_swe.sandbox"


class Endpoint(msgspec.Struct, frozen=True):
    """Where the daemon listens: a unix socket (``uds``) or a TCP ``base_url``."""

    base_url: str
    uds: str | None = None

    def describe(self) -> str:
        return f"unix://{self.uds}" if self.uds else self.base_url


def endpoint_from(host: str | None) -> Endpoint:
    """The daemon's endpoint, found as the docker CLI finds it: ``DOCKER_HOST``, else the socket.

    ``host`` is a ``DOCKER_HOST`` value: ``unix:///path`` or ``tcp://host:port`` (plain HTTP; TLS
    daemons are not supported). ``None`` or ``""`` means ``/var/run/docker.sock``.
    """
    if not host:
        return Endpoint("http://docker", DEFAULT_SOCKET)
    if host.startswith("unix://"):
        path = host.removeprefix("unix://")
        if not path.startswith("/"):
            raise ConfigError(f"DOCKER_HOST {host!r}: a unix socket path must be absolute")
        return Endpoint("http://docker", path)
    if host.startswith(("tcp://", "http://")):
        rest = host.split("://", 1)[1].rstrip("/")
        if not rest:
            raise ConfigError(f"DOCKER_HOST {host!r}: no host")
        return Endpoint(f"http://{rest}")
    raise ConfigError(
        f"DOCKER_HOST {host!r}: expected unix:///path/to/docker.sock or tcp://host:port"
    )


def _version(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)\.(\d+)", text.strip())
    if not m:
        raise ValueError(text)
    return int(m.group(1)), int(m.group(2))


def negotiate(server: Mapping[str, Any]) -> str:
    """The API version to speak with a daemon whose ``/version`` answered ``server``.

    Raises:
        SandboxError: the daemon is older than :data:`API_MIN` (or its answer is unreadable).
    """
    try:
        theirs = _version(str(server["ApiVersion"]))
        their_min = _version(str(server.get("MinAPIVersion") or "1.12"))
    except (KeyError, ValueError):
        raise SandboxError(f"unreadable /version answer from the Docker daemon: {server!r}")
    use = min(theirs, API_MAX)
    if use < API_MIN or use < their_min:
        raise SandboxError(
            f"Docker daemon speaks API {theirs[0]}.{theirs[1]} (min {their_min[0]}.{their_min[1]});"
            f" this client needs {API_MIN[0]}.{API_MIN[1]}..{API_MAX[0]}.{API_MAX[1]}"
        )
    return f"{use[0]}.{use[1]}"


def is_podman(server: Mapping[str, Any]) -> bool:
    """Does this ``/version`` answer come from podman's Docker-compatible service?"""
    for comp in server.get("Components") or ():
        if "podman" in str(comp.get("Name", "")).lower():
            return True
    return "podman" in str(server.get("Platform", {}).get("Name", "")).lower()


class FrameDecoder:
    """Demultiplexes Docker's raw stream (``application/vnd.docker.raw-stream``).

    Each frame is an 8-byte header (stream 1 = stdout, 2 = stderr; 3 bytes zero; big-endian
    u32 length) and that many bytes of payload. Feed bytes as they arrive; frames come out whole.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= 8:
            stream = self._buf[0]
            if stream not in (0, 1, 2) or self._buf[1:4] != b"\0\0\0":
                raise SandboxError(f"malformed Docker stream frame header {bytes(self._buf[:8])!r}")
            size = int.from_bytes(self._buf[4:8], "big")
            if len(self._buf) < 8 + size:
                break
            out.append((stream or 1, bytes(self._buf[8 : 8 + size])))
            del self._buf[: 8 + size]
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame (non-zero at EOF means the stream was cut)."""
        return len(self._buf)


def file_archive(name: str, data: bytes, *, mode: int, uid: int, gid: int) -> bytes:
    """A tar holding one regular file ``name`` (for ``PUT /containers/{id}/archive``)."""
    buf = io.BytesIO()
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.uid, info.gid = uid, gid
    info.mtime = int(time.time())
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def staged_archive(directory: str, data: bytes, *, uid: int, gid: int) -> bytes:
    """A tar holding ``directory/`` (mode 0700) and ``directory/f`` (mode 0600, ``data``), both
    owned by ``uid:gid``: the bytes of a write as that user, staged where only it can read them
    (see :meth:`DockerSandbox.write_file`)."""
    buf = io.BytesIO()
    now = int(time.time())
    top = tarfile.TarInfo(directory)
    top.type, top.mode, top.uid, top.gid, top.mtime = tarfile.DIRTYPE, 0o700, uid, gid, now
    info = tarfile.TarInfo(f"{directory}/f")
    info.size, info.mode, info.uid, info.gid, info.mtime = len(data), 0o600, uid, gid, now
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        tf.addfile(top)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class ArchiveMember(msgspec.Struct, frozen=True):
    """The first entry of a ``GET /containers/{id}/archive`` answer."""

    kind: str  # "file", "dir", "symlink", "other"
    data: bytes = b""
    linkname: str = ""


def first_member(tar_bytes: bytes) -> ArchiveMember:
    """The entry a single-path archive request returned (its bytes, for a regular file)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:") as tf:
            member = tf.next()
            if member is None:
                raise SandboxError("the Docker daemon returned an empty archive")
            if member.isfile():
                f = tf.extractfile(member)
                assert f is not None
                return ArchiveMember("file", f.read())
            if member.isdir():
                return ArchiveMember("dir")
            if member.issym():
                return ArchiveMember("symlink", linkname=member.linkname)
            return ArchiveMember("other")
    except tarfile.TarError as exc:
        raise SandboxError(f"unreadable archive from the Docker daemon: {exc}") from exc


def resolve_link(path: str, linkname: str) -> str:
    """Where symlink ``path -> linkname`` points, as an absolute path in the container."""
    if linkname.startswith("/"):
        return posixpath.normpath(linkname)
    return posixpath.normpath(posixpath.join(posixpath.dirname(path), linkname))


def owner_id(host: str, boot_id: str, pid: int, start_ticks: str) -> str:
    """The owner label of our containers: which process on which machine (boot) made them."""
    return f"{host}/{boot_id}/{pid}/{start_ticks}"


def is_stale(owner: str, *, host: str, boot_id: str, alive: Callable[[int, str], bool]) -> bool:
    """Was the container labelled ``owner`` left behind by a process that is gone?

    Only containers made on this host are judged: another machine sharing the daemon keeps its
    own. A container from an earlier boot of this host is stale; so is one whose process (pid
    and start time, so a reused pid does not count) no longer runs.
    """
    parts = owner.split("/")
    if len(parts) != 4 or parts[0] != host or not (parts[2].isascii() and parts[2].isdigit()):
        return False
    if parts[1] != boot_id:
        return True
    return not alive(int(parts[2]), parts[3])


def env_list(env: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


def container_body(
    *,
    image: str,
    workdir: str | None,
    env: Mapping[str, str],
    labels: Mapping[str, str],
    network_mode: str,
    limits: ResourceLimits | None,
    ulimits: Iterable[tuple[str, int, int]] = (),
    init: bool = True,
    binds: Iterable[str] = (),
) -> dict[str, Any]:
    """The ``POST /containers/create`` body of one sandbox.

    The container's main process only keeps it alive (the image's own command is not run):
    every command arrives through the exec API.
    """
    host: dict[str, Any] = {"NetworkMode": network_mode, "Init": init}
    if binds:
        # Host paths shown read-only at the same place (the daemon's host: a local daemon).
        host["Binds"] = [f"{p}:{p}:ro" for p in binds]
    if limits is not None:
        if limits.memory_bytes is not None:
            host["Memory"] = limits.memory_bytes
            host["MemorySwap"] = limits.memory_bytes  # no swap beyond the limit
        if limits.cpus is not None:
            host["NanoCpus"] = round(limits.cpus * 1e9)
        if limits.pids is not None:
            host["PidsLimit"] = limits.pids
    if ulimits:
        host["Ulimits"] = [{"Name": n, "Soft": s, "Hard": h} for n, s, h in ulimits]
    body: dict[str, Any] = {
        "Image": image,
        "Entrypoint": ["/bin/sh", "-c", "while :; do sleep 86400; done"],
        "Cmd": [],
        "Env": env_list(env),
        "Labels": dict(labels),
        "AttachStdin": False,
        "AttachStdout": False,
        "AttachStderr": False,
        "Tty": False,
        "OpenStdin": False,
        "HostConfig": host,
    }
    if network_mode == "none":
        body["NetworkDisabled"] = True
    if workdir:
        body["WorkingDir"] = workdir
    return body


def split_reference(ref: str) -> tuple[str, str]:
    """``fromImage`` and ``tag`` query values of ``POST /images/create`` for an image reference.

    ``host:5000/name:tag`` -> (``host:5000/name``, ``tag``); ``name@sha256:...`` ->
    (``name``, ``sha256:...``); no tag -> ``latest``.
    """
    if "@" in ref:
        name, digest = ref.split("@", 1)
        return name, digest
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = ref.rsplit(":", 1)
        return name, tag
    return ref, "latest"


class PullProgress(msgspec.Struct, kw_only=True):
    """Where a pull through the daemon stands (from its JSON-lines progress stream).

    Attributes:
        image: the reference being pulled.
        status: the last status line (``"Downloading"``, ``"Pull complete"``, ...).
        layers: layer id -> (bytes done, bytes total) of the current phase.
        done: True once the daemon reported the final status.
    """

    image: str
    status: str = ""
    layers: dict[str, tuple[int, int]] = msgspec.field(default_factory=dict)
    done: bool = False

    @property
    def current(self) -> int:
        return sum(c for c, _ in self.layers.values())

    @property
    def total(self) -> int:
        return sum(t for _, t in self.layers.values())


def apply_pull_event(progress: PullProgress, event: Mapping[str, Any]) -> None:
    """Fold one line of the pull stream into ``progress``.

    Raises:
        SandboxError: the line reports an error (e.g. manifest unknown).
    """
    if "error" in event or "errorDetail" in event:
        detail = event.get("errorDetail") or {}
        raise SandboxError(str(event.get("error") or detail.get("message") or event))
    status = str(event.get("status", ""))
    progress.status = status
    layer = event.get("id")
    detail = event.get("progressDetail") or {}
    if layer and "total" in detail:
        progress.layers[str(layer)] = (int(detail.get("current", 0)), int(detail["total"]))
    elif layer and status in ("Pull complete", "Already exists", "Download complete"):
        _, total = progress.layers.get(str(layer), (0, 0))
        progress.layers[str(layer)] = (total, total)
    if status.startswith(("Status: Downloaded", "Status: Image is up to date", "Digest:")):
        progress.done = progress.done or status.startswith("Status:")
