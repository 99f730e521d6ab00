"""A thin async client of the Docker Engine API over httpx (unix socket or TCP), on trio."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx

from ..._errors import SandboxError, SandboxNotRunningError, SandboxUnreachableError
from ._wire import Endpoint, FrameDecoder, PullProgress, apply_pull_event, negotiate


class EngineError(SandboxError):
    """The daemon answered with an error status.

    Attributes:
        status: the HTTP status (404: no such object; 409: conflict, e.g. not running).
    """

    def __init__(self, what: str, status: int, message: str) -> None:
        super().__init__(f"{what}: Docker daemon answered {status}: {message}")
        self.status = status
        self.message = message


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and "message" in body:
            return str(body["message"])
    except (ValueError, UnicodeDecodeError):
        pass
    return response.text[:500]


class Engine:
    """One trio run's connection pool to the daemon, with the negotiated API version."""

    def __init__(self, endpoint: Endpoint, *, request_timeout: float) -> None:
        self.endpoint = endpoint
        transport = httpx.AsyncHTTPTransport(
            uds=endpoint.uds,
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=64),
        )
        self._client = httpx.AsyncClient(
            transport=transport,
            base_url=endpoint.base_url,
            timeout=httpx.Timeout(request_timeout, connect=10.0),
            headers={"user-agent": "trio-swe-docker/0.1"},
        )
        self.version: Mapping[str, Any] = {}
        self.prefix = ""

    async def aclose(self) -> None:
        await self._client.aclose()

    async def negotiate(self) -> Mapping[str, Any]:
        """``GET /version``; fixes the version prefix of every later call."""
        try:
            response = await self._client.get("/version")
        except httpx.TransportError as exc:
            raise SandboxUnreachableError(
                f"cannot reach the Docker daemon at {self.endpoint.describe()}: {exc!r}"
            ) from exc
        if response.status_code != 200:
            raise EngineError("GET /version", response.status_code, _message(response))
        self.version = response.json()
        self.prefix = "/v" + negotiate(self.version)
        return self.version

    async def request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        ok: tuple[int, ...] = (200, 201, 204),
        **kwargs: Any,
    ) -> httpx.Response:
        """One call; a status outside ``ok`` raises :class:`EngineError`."""
        try:
            response = await self._client.request(method, self.prefix + path, **kwargs)
        except httpx.TransportError as exc:
            raise SandboxUnreachableError(f"{what}: Docker daemon unreachable: {exc!r}") from exc
        if response.status_code not in ok:
            raise EngineError(what, response.status_code, _message(response))
        return response

    @asynccontextmanager
    async def stream(
        self, method: str, path: str, *, what: str, check: bool = True, **kwargs: Any
    ) -> AsyncIterator[httpx.Response]:
        """A streamed call (no read timeout: pulls and commands last); with ``check``, a status
        other than 200 raises :class:`EngineError`. A transport failure, also one while the
        block reads the body, is :class:`SandboxUnreachableError`."""
        kwargs.setdefault("timeout", httpx.Timeout(None, connect=10.0))
        try:
            async with self._client.stream(method, self.prefix + path, **kwargs) as response:
                if check and response.status_code != 200:
                    await response.aread()
                    raise EngineError(what, response.status_code, _message(response))
                yield response
        except httpx.TransportError as exc:
            raise SandboxUnreachableError(f"{what}: Docker daemon unreachable: {exc!r}") from exc

    # -- exec ---------------------------------------------------------------------------------
    async def exec_create(self, container: str, body: Mapping[str, Any]) -> str:
        try:
            r = await self.request(
                "POST", f"/containers/{container}/exec", json=body, what="exec create"
            )
        except EngineError as exc:
            if exc.status in (404, 409):
                raise SandboxNotRunningError(
                    f"container {container[:12]} is not running: {exc.message}"
                ) from exc
            raise
        return str(r.json()["Id"])

    async def exec_stream(self, exec_id: str, on_frame: Callable[[int, bytes], None]) -> None:
        """``POST /exec/{id}/start`` attached; every demultiplexed frame goes to ``on_frame``."""
        decoder = FrameDecoder()
        async with self.stream(
            "POST",
            f"/exec/{exec_id}/start",
            what="exec start",
            json={"Detach": False, "Tty": False},
        ) as response:
            async for chunk in response.aiter_raw():
                for stream, data in decoder.feed(chunk):
                    on_frame(stream, data)
        if decoder.pending:
            raise SandboxUnreachableError("exec stream: cut in the middle of a frame")

    async def exec_inspect(self, exec_id: str) -> Mapping[str, Any]:
        r = await self.request("GET", f"/exec/{exec_id}/json", what="exec inspect")
        result: Mapping[str, Any] = r.json()
        return result

    # -- images ---------------------------------------------------------------------------------
    async def image_inspect(self, ref: str) -> Mapping[str, Any] | None:
        """The image's ``/images/{name}/json``, or None when the daemon does not have it."""
        try:
            r = await self.request("GET", f"/images/{ref}/json", what=f"inspect image {ref}")
        except EngineError as exc:
            if exc.status == 404:
                return None
            raise
        result: Mapping[str, Any] = r.json()
        return result

    async def pull(
        self,
        from_image: str,
        tag: str,
        progress: PullProgress,
        on_progress: Callable[[PullProgress], None] | None,
    ) -> None:
        """``POST /images/create``, following its JSON-lines progress to the end."""
        async with self.stream(
            "POST",
            "/images/create",
            what=f"pull {progress.image}",
            params={"fromImage": from_image, "tag": tag},
        ) as response:
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                apply_pull_event(progress, event)
                if on_progress is not None:
                    on_progress(progress)

    # -- archives -------------------------------------------------------------------------------
    @asynccontextmanager
    async def get_archive(self, container: str, path: str) -> AsyncIterator[httpx.Response]:
        async with self.stream(
            "GET",
            f"/containers/{container}/archive",
            what=f"read {path}",
            check=False,
            params={"path": path},
            timeout=self._client.timeout,
        ) as response:
            yield response
