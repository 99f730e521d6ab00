"""A content-addressed cache of unpacked OCI layers, shared by every sandbox on the host.

Layout under ``root``::

    layers/<chain id>/     one layer unpacked (overlayfs format), named by its chain id
    images/<digest>.json   an image: its layers' chain ids (bottom first) and its config
    tmp/                   downloads and unpacks in progress (renamed into place when done)

A layer is named by its *chain id* (the digest of its diff id and those of every layer below,
as containerd names snapshots), so two images that share a base share its directories, and a
layer is unpacked once however many images and sandboxes use it. Everything is built in
``tmp/`` and renamed into place: a crash never leaves a half-made layer that a boot would use,
and two processes racing on one layer both end with the same directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import IO, Any

import msgspec
import trio

from ..._groups import open_private_nursery
from ..._lru import Lru
from .._keyed import KeyedLock
from ._manifest import (
    Descriptor,
    ImageConfig,
    ImageError,
    Index,
    Manifest,
    Reference,
    check_digest,
    digest_hex,
    parse_config,
    parse_manifest,
    parse_reference,
    select_platform,
)
from ._registry import RegistryClient
from ._unpack import unpack_layer

_REF_NAME = "org.opencontainers.image.ref.name"
#: Layer downloads in flight at once (docker pulls three at a time too).
_PARALLEL_DOWNLOADS = 3
#: Resolved images kept in memory (the most recently used); an older one is looked up again
#: (its manifest read, its layers found in the cache directory) when it comes back.
RESOLVED_CACHE_SIZE = 1024


class OciImage(msgspec.Struct, frozen=True):
    """An image ready to boot: its unpacked layers (bottom first) and its config."""

    key: str
    layers: tuple[Path, ...]
    config: ImageConfig


class Source(msgspec.Struct, frozen=True):
    """Where an image comes from: ``kind`` is ``registry``, ``layout`` or ``archive``."""

    kind: str
    location: str
    tag: str | None = None


def parse_source(image: str) -> Source:
    """``oci:DIR[:TAG]`` (an OCI layout), ``docker-archive:FILE`` (``docker save``), or a
    registry reference (``registry/name:tag``, ``name@sha256:...``).

    Raises:
        ImageError: none of those.
    """
    if image.startswith("oci:"):
        rest = image.removeprefix("oci:")
        path, sep, tag = rest.rpartition(":")
        if sep and "/" not in tag and not os.path.isdir(rest):
            return Source("layout", path, tag or None)
        return Source("layout", rest)
    if image.startswith("docker-archive:"):
        return Source("archive", image.removeprefix("docker-archive:"))
    if image.endswith(".tar") and os.path.isfile(image):
        return Source("archive", image)
    parse_reference(image)
    return Source("registry", image)


def is_oci_image(image: str) -> bool:
    """Is ``image`` one of :func:`parse_source`'s forms (rather than a directory or path@commit)?"""
    if image.startswith(("oci:", "docker-archive:")):
        return True
    if image.startswith(("/", ".", "~")):
        return image.endswith(".tar") and os.path.isfile(image)
    if os.path.isdir(image):
        return False
    try:
        parse_reference(image)
    except ImageError:
        return False
    return True


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """The OCI chain ids of a layer stack (bottom first), hex."""
    out: list[str] = []
    chain = ""
    for diff in diff_ids:
        digest_hex(diff)
        chain = (
            diff
            if not chain
            else "sha256:" + hashlib.sha256(f"{chain} {diff}".encode()).hexdigest()
        )
        out.append(digest_hex(chain))
    return out


def _hash_file(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


#: Fetches layer ``i``'s blob and gives an open file of it (the caller closes it).
LayerOpener = Callable[[int, Path], Awaitable[IO[bytes]]]


class OciStoreStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The image cache's counters.

    Attributes:
        images_resolved: images looked up and ready (once per name while it is among the
            :data:`RESOLVED_CACHE_SIZE` most recently used).
        layers_unpacked: layers downloaded (or read) and unpacked into the cache.
        layers_reused: layers found unpacked in the cache.
        bytes_downloaded: bytes fetched from registries.
    """

    images_resolved: int
    layers_unpacked: int
    layers_reused: int
    bytes_downloaded: int


class OciStore:
    """Pulls and unpacks OCI images into the shared cache; see the module doc.

    Args:
        root: the cache directory.
        plain_http: registries reached over plain HTTP besides loopback ones (``host:port``).
        timeout: bound on one registry request (blobs stream without a total bound).
        platform: ``(os, architecture)`` picked from indexes.
    """

    def __init__(
        self,
        root: Path,
        *,
        plain_http: Sequence[str] = (),
        timeout: float = 300.0,
        platform: tuple[str, str] = ("linux", "amd64"),
    ) -> None:
        self.root = root
        self._plain_http = frozenset(plain_http)
        self._timeout = timeout
        self._platform = platform
        self._locks = KeyedLock()
        self._resolved: Lru[str, OciImage] = Lru(RESOLVED_CACHE_SIZE)
        self._stats: dict[str, int] = {
            "images_resolved": 0,
            "layers_unpacked": 0,
            "layers_reused": 0,
            "bytes_downloaded": 0,
        }

    def statistics(self) -> OciStoreStatistics:
        return OciStoreStatistics(**self._stats)

    async def get(self, image: str) -> OciImage:
        """The image, pulled and unpacked unless the cache has it (once per name while it is
        among the :data:`RESOLVED_CACHE_SIZE` most recently used; after that, its layers are
        found on disk)."""
        async with self._locks.hold("image:" + image):
            hit = self._resolved.get(image)
            if hit is not None:
                return hit
            for sub in ("layers", "images", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            source = parse_source(image)
            if source.kind == "registry":
                result = await self._from_registry(parse_reference(source.location))
            elif source.kind == "layout":
                result = await self._from_layout(Path(source.location), source.tag)
            else:
                result = await self._from_archive(Path(source.location))
            self._resolved.put(image, result)
            self._stats["images_resolved"] += 1
            return result

    # -- the shared part ----------------------------------------------------------------------------
    async def _assemble(self, key: str, config: ImageConfig, opener: LayerOpener) -> OciImage:
        record = self.root / "images" / f"{digest_hex(key)}.json"
        chains = chain_ids(config.diff_ids)
        paths: list[Path] = []
        for i, chain in enumerate(chains):
            final = self.root / "layers" / chain
            async with self._locks.hold("layer:" + chain):
                if final.is_dir():
                    self._stats["layers_reused"] += 1
                else:
                    await self._unpack_one(i, chain, config.diff_ids[i], final, paths, opener)
                    self._stats["layers_unpacked"] += 1
            paths.append(final)
        if not record.exists():
            tmp = record.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"layers": chains, "diff_ids": list(config.diff_ids)}))
            os.replace(tmp, record)
        return OciImage(key=key, layers=tuple(paths), config=config)

    async def _unpack_one(
        self,
        i: int,
        chain: str,
        diff_id: str,
        final: Path,
        below: list[Path],
        opener: LayerOpener,
    ) -> None:
        work = Path(tempfile.mkdtemp(prefix=f"{chain[:12]}-", dir=self.root / "tmp"))
        try:
            blob = await opener(i, work / "blob")
            try:
                await trio.to_thread.run_sync(
                    lambda: unpack_layer(
                        blob, work / "tree", diff_id=diff_id, lowers=list(reversed(below))
                    )
                )
            finally:
                blob.close()
            try:
                os.rename(work / "tree", final)
            except OSError:
                if not os.path.isdir(final):  # noqa: ASYNC240 (lost a race: theirs is as good)
                    raise
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(shutil.rmtree, work, True)

    # -- registries -----------------------------------------------------------------------------------
    async def _from_registry(self, ref: Reference) -> OciImage:
        client = RegistryClient(ref.registry, plain_http=self._plain_http, timeout=self._timeout)
        try:
            top, digest = await client.manifest(ref, ref.ref)
            if isinstance(top, Index):
                entry = select_platform(top, os=self._platform[0], architecture=self._platform[1])
                top, digest = await client.manifest(ref, entry.digest)
                if not isinstance(top, Manifest):
                    raise ImageError(f"{ref}: an index inside an index is not supported")
            manifest = top
            config = parse_config(
                await client.blob_bytes(ref, manifest.config.digest), f"config of {ref}"
            )
            self._check_layers(manifest, config, str(ref))

            return await self._prefetching(client, ref, manifest, digest, config)
        finally:
            self._stats["bytes_downloaded"] += client.bytes_downloaded
            with trio.CancelScope(shield=True):
                await client.aclose()

    async def _prefetching(
        self,
        client: RegistryClient,
        ref: Reference,
        manifest: Manifest,
        digest: str,
        config: ImageConfig,
    ) -> OciImage:
        """Download the missing layers a few at a time while they are unpacked in order."""
        chains = chain_ids(config.diff_ids)
        need = [i for i, c in enumerate(chains) if not (self.root / "layers" / c).is_dir()]
        ready = {i: trio.Event() for i in need}
        blobs: dict[int, Path] = {}
        failed: dict[int, Exception] = {}
        limiter = trio.CapacityLimiter(_PARALLEL_DOWNLOADS)
        work = Path(tempfile.mkdtemp(prefix="pull-", dir=self.root / "tmp"))

        async def fetch(i: int) -> None:
            try:
                async with limiter:
                    dest = work / f"{i}.blob"
                    await client.blob_to(ref, manifest.layers[i].digest, dest)
                    blobs[i] = dest
            except Exception as exc:  # raised by the unpacker, in order, as a plain error
                failed[i] = exc
            finally:
                ready[i].set()

        async def opener(i: int, dest: Path) -> IO[bytes]:
            if i not in ready:  # cached when we looked, gone since: fetch it now
                await client.blob_to(ref, manifest.layers[i].digest, dest)
                return open(dest, "rb")  # noqa: ASYNC230 (a local file, opened once)
            await ready[i].wait()
            if i in failed:
                raise failed[i]
            return open(blobs.pop(i), "rb")  # noqa: ASYNC230

        try:
            async with open_private_nursery("a layer download") as nursery:
                for i in need:
                    nursery.start_soon(fetch, i)
                result = await self._assemble(digest, config, opener)
                nursery.cancel_scope.cancel()
            return result
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(shutil.rmtree, work, True)

    @staticmethod
    def _check_layers(manifest: Manifest, config: ImageConfig, what: str) -> None:
        if len(manifest.layers) != len(config.diff_ids):
            raise ImageError(
                f"{what}: {len(manifest.layers)} layers but {len(config.diff_ids)} diff ids"
            )
        for layer in manifest.layers:
            if "nondistributable" in layer.media_type or "foreign" in layer.media_type:
                raise ImageError(f"{what}: foreign layer {layer.digest} cannot be pulled")

    # -- OCI layouts -------------------------------------------------------------------------------
    async def _from_layout(self, layout: Path, tag: str | None) -> OciImage:
        def blob(digest: str) -> Path:
            return layout / "blobs" / "sha256" / digest_hex(digest)

        def read_checked(d: Descriptor) -> bytes:
            data = blob(d.digest).read_bytes()
            check_digest(data, d.digest, f"oci:{layout} blob")
            return data

        try:
            index = parse_manifest((layout / "index.json").read_bytes(), None, f"oci:{layout}")
        except OSError as exc:
            raise ImageError(f"oci:{layout}: not an OCI layout ({exc})") from exc
        if not isinstance(index, Index):
            raise ImageError(f"oci:{layout}: index.json is not an index")
        if tag is None:
            entries = list(index.manifests)
            if len(entries) > 1:
                entries = [d for d in entries if _ref_name(d) in (None, "latest")]
        else:
            entries = [d for d in index.manifests if _ref_name(d) == tag]
        if not entries:
            raise ImageError(f"oci:{layout}: no image tagged {tag or 'latest'!r}")
        entry = entries[0]
        top = parse_manifest(read_checked(entry), entry.media_type, f"oci:{layout}")
        if isinstance(top, Index):
            entry = select_platform(top, os=self._platform[0], architecture=self._platform[1])
            top = parse_manifest(read_checked(entry), entry.media_type, f"oci:{layout}")
        if not isinstance(top, Manifest):
            raise ImageError(f"oci:{layout}: nested indexes are not supported")
        manifest = top
        config = parse_config(read_checked(manifest.config), f"oci:{layout} config")
        self._check_layers(manifest, config, f"oci:{layout}")

        async def opener(i: int, dest: Path) -> IO[bytes]:
            path = blob(manifest.layers[i].digest)
            got = await trio.to_thread.run_sync(_hash_file, path)
            if got != manifest.layers[i].digest:
                raise ImageError(
                    f"oci:{layout} layer: digest mismatch: expected {manifest.layers[i].digest}, got {got}"
                )
            return open(path, "rb")  # noqa: ASYNC230

        return await self._assemble(entry.digest, config, opener)

    # -- docker save tarballs -----------------------------------------------------------------------
    async def _from_archive(self, archive: Path) -> OciImage:
        def load() -> tuple[bytes, list[str]]:
            with tarfile.open(archive, "r:") as tf:
                manifest = json.loads(_member(tf, "manifest.json"))
                if not isinstance(manifest, list) or not manifest:
                    raise ImageError(f"docker-archive:{archive}: empty manifest.json")
                first: dict[str, Any] = manifest[0]
                return _member(tf, str(first["Config"])), [str(x) for x in first["Layers"]]

        try:
            raw_config, layer_names = await trio.to_thread.run_sync(load)
        except (OSError, tarfile.TarError, KeyError, ValueError) as exc:
            if isinstance(exc, ImageError):
                raise
            raise ImageError(
                f"docker-archive:{archive}: not a docker save tarball ({exc})"
            ) from exc
        config = parse_config(raw_config, f"docker-archive:{archive} config")
        if len(layer_names) != len(config.diff_ids):
            raise ImageError(f"docker-archive:{archive}: layer count differs from the config's")

        async def opener(i: int, dest: Path) -> IO[bytes]:
            def extract() -> None:
                with tarfile.open(archive, "r:") as tf:
                    src = tf.extractfile(layer_names[i])
                    if src is None:
                        raise ImageError(f"docker-archive:{archive}: no layer {layer_names[i]}")
                    with open(dest, "xb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)

            await trio.to_thread.run_sync(extract)
            return open(dest, "rb")  # noqa: ASYNC230

        key = "sha256:" + hashlib.sha256(raw_config).hexdigest()
        return await self._assemble(key, config, opener)


def _member(tf: tarfile.TarFile, name: str) -> bytes:
    f = tf.extractfile(name)
    if f is None:
        raise ImageError(f"{name} is not a file in the archive")
    return f.read()


def _ref_name(d: Descriptor) -> str | None:
    name = (d.annotations or {}).get(_REF_NAME)
    return str(name) if name else None
