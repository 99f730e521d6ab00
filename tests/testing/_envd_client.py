"""Small raw clients for the envd test server (httpx + trio_swe's sans-IO Connect codec)."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import trio

from trio_swe.sandbox.e2b import _connect as connect
from trio_swe.sandbox.e2b import _wire as wire
from trio_swe.testing import EnvdServer


class Sbx:
    """A sandbox created over REST, with the headers envd requests need."""

    def __init__(self, sandbox_id: str, token: str | None) -> None:
        self.id = sandbox_id
        self.token = token

    def headers(self, user: str | None = None) -> dict[str, str]:
        h = {"e2b-sandbox-id": self.id, "e2b-sandbox-port": "49983"}
        if self.token:
            h["x-access-token"] = self.token
        if user:
            h["authorization"] = "Basic " + base64.b64encode(f"{user}:".encode()).decode()
        return h


async def create(
    client: httpx.AsyncClient, server: EnvdServer, *, timeout: int = 120, **extra: Any
) -> Sbx:
    body = {"templateID": "base", "timeout": timeout, **extra}
    r = await client.post(
        f"{server.api_url}/v2/sandboxes", json=body, headers={"x-api-key": server.api_key or ""}
    )
    assert r.status_code == 201, r.text
    info = wire.decode(r.content, wire.SandboxInfo)
    return Sbx(info.sandbox_id, info.envd_access_token)


def start_body(cmd: str, *, tag: str | None = None, stdin: bool = False, **env: str) -> bytes:
    req = wire.StartRequest(
        process=wire.ProcessConfig(cmd="/bin/sh", args=["-c", cmd], envs=dict(env)),
        tag=tag,
        stdin=stdin,
    )
    return connect.encode_envelope(wire.encode(req))


def connect_body(*, pid: int | None = None, tag: str | None = None) -> bytes:
    req = wire.ConnectRequest(process=wire.ProcessSelector(pid=pid, tag=tag))
    return connect.encode_envelope(wire.encode(req))


def stream_headers(
    sbx: Sbx, *, keepalive: str | None = None, timeout_ms: int | None = None
) -> dict[str, str]:
    h = {
        **sbx.headers(),
        "content-type": "application/connect+json",
        "connect-protocol-version": "1",
    }
    if keepalive is not None:
        h["keepalive-ping-interval"] = keepalive
    if timeout_ms is not None:
        h["connect-timeout-ms"] = str(timeout_ms)
    return h


class StreamOutcome:
    def __init__(self) -> None:
        self.events: list[wire.ProcessEvent] = []
        self.end_stream: connect.EndStream | None = None

    @property
    def pid(self) -> int:
        return next(e.start.pid for e in self.events if e.start is not None)

    @property
    def stdout(self) -> bytes:
        return b"".join(e.data.stdout or b"" for e in self.events if e.data is not None)

    @property
    def stderr(self) -> bytes:
        return b"".join(e.data.stderr or b"" for e in self.events if e.data is not None)

    @property
    def end(self) -> wire.EndEvent | None:
        return next((e.end for e in self.events if e.end is not None), None)

    @property
    def keepalives(self) -> int:
        return sum(1 for e in self.events if e.keepalive is not None)

    def feed(self, envelopes: list[connect.Envelope]) -> None:
        for env in envelopes:
            if env.end_stream:
                self.end_stream = connect.parse_end_stream(env.payload)
            else:
                self.events.append(
                    wire.decode(env.payload, wire.StartResponse).event or wire.ProcessEvent()
                )


async def stream(
    client: httpx.AsyncClient, url: str, body: bytes, headers: Mapping[str, str]
) -> StreamOutcome:
    """Run one server-streaming call to its end."""
    out = StreamOutcome()
    dec = connect.EnvelopeDecoder()
    async with client.stream("POST", url, content=body, headers=dict(headers)) as r:
        assert r.status_code == 200, await r.aread()
        async for chunk in r.aiter_bytes():
            out.feed(dec.feed(chunk))
    return out


async def unary(client: httpx.AsyncClient, url: str, message: Any, sbx: Sbx) -> httpx.Response:
    return await client.post(
        url,
        content=wire.encode(message),
        headers={
            **sbx.headers(),
            "content-type": "application/json",
            "connect-protocol-version": "1",
        },
    )


async def wait_until(condition: Callable[[], bool], *, timeout: float = 30.0) -> None:
    """Poll a condition of the server's state (an outcome, not a timing assumption)."""
    with trio.fail_after(timeout):
        while not condition():  # noqa: ASYNC110 - polls server state; no event to wait on
            await trio.sleep(0.01)
