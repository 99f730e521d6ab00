"""Sans-IO: image references, manifests, indexes and digests (OCI and Docker v2 schema 2)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from ..._errors import PermanentBootError

OCI_INDEX: Final = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST: Final = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST: Final = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST: Final = "application/vnd.docker.distribution.manifest.v2+json"
#: What a pull asks for. Registries serve an OCI manifest only to a client that accepts it, and
#: turn a Docker v2 manifest into schema 1 for one that sends no Accept (registry 2.8).
ACCEPT: Final = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
INDEX_TYPES: Final = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES: Final = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_NAME_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")


class ImageError(PermanentBootError):
    """An OCI image can never boot: a bad reference, an image the registry does not have, a
    digest mismatch, an unsafe layer. (A registry that cannot be reached is a plain, retryable
    :class:`~trio_swe.SandboxBootError`.)"""


class Reference(msgspec.Struct, frozen=True):
    """``registry/repository:tag`` or ``registry/repository@sha256:...``."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def ref(self) -> str:
        """The manifest reference: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = f"{self.registry}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def parse_reference(text: str) -> Reference:
    """Parse an image reference the way docker does (``docker.io`` and ``library/`` implied).

    Raises:
        ImageError: not a valid reference.
    """
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise ImageError(f"image {text!r}: bad digest {digest!r} (expected sha256:<64 hex>)")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise ImageError(f"image {text!r}: bad tag {tag!r}")
    parts = rest.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        registry, path = first, parts[1:]
    else:
        registry, path = "docker.io", parts
        if len(path) == 1:
            path = ["library", *path]
    if not path or not all(_NAME_COMPONENT.fullmatch(p) for p in path):
        raise ImageError(f"image {text!r}: bad repository name {'/'.join(path)!r}")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(registry, "/".join(path), tag, digest)


def looks_like_reference(text: str) -> bool:
    """Could ``text`` be an image reference rather than a host path? (Paths start with / or .)"""
    if not text or text[0] in "/.~":
        return False
    try:
        parse_reference(text)
    except ImageError:
        return False
    return True


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(data: bytes, expected: str, what: str) -> None:
    """Raises :class:`ImageError` unless ``data`` hashes to ``expected``."""
    if not _DIGEST.fullmatch(expected):
        raise ImageError(f"{what}: unsupported digest {expected!r} (only sha256)")
    got = sha256_digest(data)
    if got != expected:
        raise ImageError(f"{what}: digest mismatch: expected {expected}, got {got}")


def digest_hex(digest: str) -> str:
    """The hex part of a sha256 digest, checked (it names files in the cache)."""
    if not _DIGEST.fullmatch(digest):
        raise ImageError(f"unsupported or malformed digest {digest!r} (only sha256)")
    return digest.split(":", 1)[1]


class Descriptor(msgspec.Struct, frozen=True):
    media_type: str
    digest: str
    size: int
    platform: Mapping[str, Any] | None = None
    annotations: Mapping[str, str] | None = None


class Manifest(msgspec.Struct, frozen=True):
    """An image manifest: its config blob and its layers, bottom first."""

    config: Descriptor
    layers: tuple[Descriptor, ...]


class Index(msgspec.Struct, frozen=True):
    """An OCI index or Docker manifest list."""

    manifests: tuple[Descriptor, ...]


def _descriptor(raw: Any, what: str) -> Descriptor:
    try:
        return Descriptor(
            media_type=str(raw.get("mediaType", "")),
            digest=str(raw["digest"]),
            size=int(raw["size"]),
            platform=raw.get("platform"),
            annotations=raw.get("annotations"),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ImageError(f"{what}: malformed descriptor {raw!r}") from None


def parse_manifest(body: bytes, content_type: str | None, what: str) -> Manifest | Index:
    """An index/list or an image manifest, by its media type (header, else the body's own).

    Raises:
        ImageError: schema 1, unknown types, or malformed JSON.
    """
    try:
        doc = json.loads(body)
    except ValueError:
        raise ImageError(f"{what}: the manifest is not JSON") from None
    if not isinstance(doc, dict):
        raise ImageError(f"{what}: the manifest is not a JSON object")
    media = (content_type or "").split(";")[0].strip() or str(doc.get("mediaType", ""))
    if not media:  # an OCI manifest may omit mediaType: tell by its fields
        media = OCI_INDEX if "manifests" in doc else OCI_MANIFEST
    if media in INDEX_TYPES:
        return Index(tuple(_descriptor(m, what) for m in doc.get("manifests") or ()))
    if media in MANIFEST_TYPES:
        if "config" not in doc or not isinstance(doc.get("layers"), list):
            raise ImageError(f"{what}: manifest without config or layers")
        return Manifest(
            _descriptor(doc["config"], what), tuple(_descriptor(x, what) for x in doc["layers"])
        )
    raise ImageError(
        f"{what}: unsupported manifest type {media!r} (schema 1 and others are not supported)"
    )


def select_platform(
    index: Index, *, os: str = "linux", architecture: str = "amd64", variant: str | None = None
) -> Descriptor:
    """The index entry for this platform (attestation entries, ``unknown/unknown``, skipped).

    Raises:
        ImageError: no entry matches; the message lists those there are.
    """
    seen: list[str] = []
    for d in index.manifests:
        p = d.platform or {}
        seen.append(f"{p.get('os')}/{p.get('architecture')}")
        if p.get("os") != os or p.get("architecture") != architecture:
            continue
        if variant is not None and p.get("variant") not in (None, variant):
            continue
        if d.media_type and d.media_type not in MANIFEST_TYPES:
            continue
        return d
    raise ImageError(
        f"no {os}/{architecture} image in the index (it has: {', '.join(seen) or 'none'})"
    )


class ImageConfig(msgspec.Struct, frozen=True):
    """What a boot needs from the image config: layer diff ids, environment, working dir."""

    diff_ids: tuple[str, ...]
    env: tuple[str, ...] = ()
    working_dir: str = ""
    user: str = ""


def parse_config(body: bytes, what: str) -> ImageConfig:
    try:
        doc = json.loads(body)
        diff_ids = tuple(str(d) for d in doc["rootfs"]["diff_ids"])
        cfg = doc.get("config") or {}
        return ImageConfig(
            diff_ids=diff_ids,
            env=tuple(str(e) for e in cfg.get("Env") or ()),
            working_dir=str(cfg.get("WorkingDir") or ""),
            user=str(cfg.get("User") or ""),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ImageError(f"{what}: malformed image config") from None


def env_mapping(env: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep and key:
            out[key] = value
    return out
