"""The OCI distribution API (pull side) over httpx: manifests and blobs, digests checked."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import httpx
import trio

from ..._errors import SandboxBootError
from ._manifest import (
    ACCEPT,
    ImageError,
    Index,
    Manifest,
    Reference,
    check_digest,
    parse_manifest,
)

_LOOPBACK = re.compile(r"(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?")


def registry_url(registry: str, plain_http: frozenset[str]) -> str:
    """Where ``registry`` is reached: plain HTTP for loopback and listed hosts, else HTTPS."""
    if registry == "docker.io":
        return "https://registry-1.docker.io"
    scheme = "http" if _LOOPBACK.fullmatch(registry) or registry in plain_http else "https"
    return f"{scheme}://{registry}"


def _bearer_challenge(header: str) -> dict[str, str] | None:
    if not header.lower().startswith("bearer "):
        return None
    return dict(re.findall(r'(\w+)="([^"]*)"', header))


class RegistryClient:
    """Pulls from one registry (anonymous, or with the bearer token its challenge asks for)."""

    def __init__(self, registry: str, *, plain_http: frozenset[str], timeout: float) -> None:
        self.base = registry_url(registry, plain_http)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0),
            follow_redirects=True,
            headers={"user-agent": "trio-swe-oci/0.1"},
        )
        self._token: str | None = None
        self.bytes_downloaded = 0

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _get(self, url: str, repo: str, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        try:
            r = await self._client.get(url, headers=headers, **kw)
            if r.status_code == 401 and not self._token:
                challenge = _bearer_challenge(r.headers.get("www-authenticate", ""))
                if challenge and "realm" in challenge:
                    params = {
                        "service": challenge.get("service", ""),
                        "scope": f"repository:{repo}:pull",
                    }
                    t = await self._client.get(challenge["realm"], params=params)
                    if t.status_code == 200:
                        body = t.json()
                        self._token = body.get("token") or body.get("access_token")
                        headers["authorization"] = f"Bearer {self._token}"
                        r = await self._client.get(url, headers=headers, **kw)
        except httpx.HTTPError as exc:
            raise SandboxBootError(f"registry {self.base}: {exc!r}") from exc
        if r.status_code >= 500 or r.status_code == 429:
            raise SandboxBootError(f"registry {self.base}: {r.status_code} for {url}")
        return r

    async def manifest(self, ref: Reference, reference: str) -> tuple[Manifest | Index, str]:
        """The manifest (or index) ``reference`` (tag or digest) and its digest, checked."""
        what = (
            f"{ref.registry}/{ref.repository}@{reference}"
            if reference.startswith("sha256:")
            else (f"{ref.registry}/{ref.repository}:{reference}")
        )
        url = f"{self.base}/v2/{ref.repository}/manifests/{reference}"
        r = await self._get(url, ref.repository, headers={"accept": ACCEPT})
        if r.status_code != 200:
            raise ImageError(f"manifest {what}: registry answered {r.status_code}: {r.text[:300]}")
        body = r.content
        digest = (
            reference
            if reference.startswith("sha256:")
            else r.headers.get("docker-content-digest", "")
        )
        if digest:
            check_digest(body, digest, f"manifest {what}")
        else:
            digest = "sha256:" + hashlib.sha256(body).hexdigest()
        return parse_manifest(body, r.headers.get("content-type"), f"manifest {what}"), digest

    async def blob_bytes(self, ref: Reference, digest: str, limit: int = 64 << 20) -> bytes:
        """A small blob (a config) in memory, digest checked."""
        r = await self._get(f"{self.base}/v2/{ref.repository}/blobs/{digest}", ref.repository)
        if r.status_code != 200:
            raise ImageError(f"blob {digest} of {ref}: registry answered {r.status_code}")
        if len(r.content) > limit:
            raise ImageError(f"blob {digest} of {ref}: over {limit} bytes")
        check_digest(r.content, digest, f"blob of {ref}")
        return r.content

    async def blob_to(self, ref: Reference, digest: str, dest: Path) -> None:
        """Stream a blob into ``dest`` (a new file), checking its digest; removed on mismatch."""
        sha = hashlib.sha256()
        url = f"{self.base}/v2/{ref.repository}/blobs/{digest}"
        headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            async with self._client.stream("GET", url, headers=headers) as r:
                if r.status_code == 401 and not self._token:
                    await r.aread()
                    await self._get(f"{self.base}/v2/", ref.repository)  # learn a token
                    return await self.blob_to(ref, digest, dest) if self._token else None
                if r.status_code != 200:
                    raise ImageError(f"blob {digest} of {ref}: registry answered {r.status_code}")
                f = await trio.open_file(dest, "xb")
                try:
                    async for chunk in r.aiter_bytes(1 << 20):
                        sha.update(chunk)
                        await f.write(chunk)
                        self.bytes_downloaded += len(chunk)
                finally:
                    await f.aclose()
        except httpx.HTTPError as exc:
            dest.unlink(missing_ok=True)  # noqa: ASYNC240 (one unlink of a local file)
            raise SandboxBootError(f"blob {digest} of {ref}: {exc!r}") from exc
        got = "sha256:" + sha.hexdigest()
        if got != digest:
            os.unlink(dest)
            raise ImageError(f"blob of {ref}: digest mismatch: expected {digest}, got {got}")
        return None
