"""envd's process and file APIs and the REST lifecycle of the local server, over raw HTTP."""

from __future__ import annotations

import httpx
import pytest
import trio

from trio_swe.sandbox.e2b import _connect as connect
from trio_swe.sandbox.e2b import _wire as wire
from trio_swe.testing import EnvdServer, open_envd_server

from ._envd_client import (
    connect_body,
    create,
    start_body,
    stream,
    stream_headers,
    unary,
    wait_until,
)

START = "/process.Process/Start"
CONNECT = "/process.Process/Connect"


async def test_start_streams_pid_output_and_exit_code(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server, envVars={"FROM_SANDBOX": "sbx"})
    out = await stream(
        client,
        server.sandbox_url + START,
        start_body("echo out $FROM_SANDBOX $FROM_CALL; echo err >&2; exit 7", FROM_CALL="call"),
        stream_headers(sbx),
    )
    assert out.pid > 0
    assert out.stdout == b"out sbx call\n"
    assert out.stderr == b"err\n"
    assert out.end == wire.EndEvent(
        exit_code=7, exited=True, status="exit status 7", error="exit status 7"
    )
    assert out.end_stream is not None
    assert out.end_stream.error is None


async def test_zero_exit_code_is_omitted_on_the_wire(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server)
    dec = connect.EnvelopeDecoder()
    raw: list[bytes] = []
    async with client.stream(
        "POST", server.sandbox_url + START, content=start_body("true"), headers=stream_headers(sbx)
    ) as r:
        async for chunk in r.aiter_bytes():
            raw += [e.payload for e in dec.feed(chunk)]
    assert b'{"event":{"end":{"exited":true,"status":"exit status 0"}}}' in raw


async def test_keepalive_events_while_the_process_is_silent(
    server: EnvdServer, h2c_client: httpx.AsyncClient
) -> None:
    sbx = await create(h2c_client, server)
    out = await stream(
        h2c_client,
        server.sandbox_url + START,
        start_body("sleep 1.2; echo late"),
        stream_headers(sbx, keepalive="0.2"),
    )
    assert out.keepalives >= 2
    assert out.stdout == b"late\n"
    assert out.end is not None
    assert out.end.exit_code == 0


async def test_connect_timeout_kills_the_process(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server)
    out = await stream(
        client,
        server.sandbox_url + START,
        start_body("sleep 60", tag="deadline"),
        stream_headers(sbx, timeout_ms=300),
    )
    assert out.end is None
    assert out.end_stream is not None
    assert out.end_stream.error is not None
    assert out.end_stream.error.code == "deadline_exceeded"
    # The process was killed (not left running): a re-attach gets its end event.
    again = await stream(
        client, server.sandbox_url + CONNECT, connect_body(tag="deadline"), stream_headers(sbx)
    )
    assert again.end is not None
    assert again.end.exited is False
    assert again.end.status == "signal: killed"


async def test_reconnect_gets_live_output_only_then_the_exit_code(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server)
    # Stream 1 sees "A", then we cut it; the process waits for a line on stdin.
    async with client.stream(
        "POST",
        server.sandbox_url + START,
        content=start_body("echo A; read line; echo B; exit 4", tag="re", stdin=True),
        headers=stream_headers(sbx),
    ) as r:
        dec = connect.EnvelopeDecoder()
        seen = b""
        pid = 0
        async for chunk in r.aiter_bytes():
            for env in dec.feed(chunk):
                ev = wire.decode(env.payload, wire.StartResponse).event
                assert ev is not None
                if ev.start is not None:
                    pid = ev.start.pid
                if ev.data is not None and ev.data.stdout:
                    seen += ev.data.stdout
            if b"A\n" in seen:
                break
    assert seen == b"A\n"
    assert pid > 0

    async with trio.open_nursery() as nursery:
        results: list[object] = []

        async def attach() -> None:
            results.append(
                await stream(
                    client,
                    server.sandbox_url + CONNECT,
                    connect_body(tag="re"),
                    stream_headers(sbx),
                )
            )

        nursery.start_soon(attach)
        # Feed stdin only once the re-attached stream is open, so "B" cannot race the attach.
        await wait_until(lambda: server.statistics().streams_open == 1)
        listed = await unary(
            client, server.sandbox_url + "/process.Process/List", wire.ListRequest(), sbx
        )
        assert any(p.pid == pid for p in wire.decode(listed.content, wire.ListResponse).processes)
        r = await unary(
            client,
            server.sandbox_url + "/process.Process/SendInput",
            wire.SendInputRequest(
                process=wire.ProcessSelector(pid=pid), input=wire.ProcessInput(stdin=b"go\n")
            ),
            sbx,
        )
        assert r.status_code == 200, r.text
    (out,) = results
    assert isinstance(out, type(results[0]))
    assert out.pid == pid  # type: ignore[attr-defined]
    assert out.stdout == b"B\n"  # type: ignore[attr-defined]  # "A" is not replayed
    assert out.end is not None
    assert out.end.exit_code == 4

    # After the exit, Connect by pid still learns the exit code (retention).
    late = await stream(
        client, server.sandbox_url + CONNECT, connect_body(pid=pid), stream_headers(sbx)
    )
    assert late.stdout == b""
    assert late.end is not None
    assert late.end.exit_code == 4


async def test_without_retention_a_finished_process_is_not_found(client: httpx.AsyncClient) -> None:
    async with open_envd_server(process_retention_sec=0) as server:
        sbx = await create(client, server)
        out = await stream(
            client, server.sandbox_url + START, start_body("exit 3"), stream_headers(sbx)
        )
        assert out.end is not None
        assert out.end.exit_code == 3
        await trio.testing.wait_all_tasks_blocked()
        late = await stream(
            client, server.sandbox_url + CONNECT, connect_body(pid=out.pid), stream_headers(sbx)
        )
        assert late.end_stream is not None
        assert late.end_stream.error is not None
        assert late.end_stream.error.code == "not_found"


async def test_send_signal_and_unknown_pid(server: EnvdServer, client: httpx.AsyncClient) -> None:
    sbx = await create(client, server)
    async with trio.open_nursery() as nursery:
        results = []

        async def run() -> None:
            results.append(
                await stream(
                    client,
                    server.sandbox_url + START,
                    start_body("sleep 60", tag="victim"),
                    stream_headers(sbx),
                )
            )

        nursery.start_soon(run)
        await wait_until(lambda: server.statistics().streams_open == 1)
        listed = await unary(
            client, server.sandbox_url + "/process.Process/List", wire.ListRequest(), sbx
        )
        procs = wire.decode(listed.content, wire.ListResponse).processes
        assert [p.tag for p in procs] == ["victim"]
        r = await unary(
            client,
            server.sandbox_url + "/process.Process/SendSignal",
            wire.SendSignalRequest(
                process=wire.ProcessSelector(tag="victim"), signal=wire.SIGNAL_SIGKILL
            ),
            sbx,
        )
        assert r.status_code == 200
        assert r.json() == {}
    assert results[0].end is not None
    assert results[0].end.status == "signal: killed"

    r = await unary(
        client,
        server.sandbox_url + "/process.Process/SendSignal",
        wire.SendSignalRequest(
            process=wire.ProcessSelector(pid=999999), signal=wire.SIGNAL_SIGKILL
        ),
        sbx,
    )
    assert r.status_code == 404
    assert r.json()["code"] == "not_found"


async def test_health_access_token_and_unknown_sandbox(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server)
    assert (
        await client.get(server.sandbox_url + "/health", headers=sbx.headers())
    ).status_code == 204
    gone = await client.get(server.sandbox_url + "/health", headers={"e2b-sandbox-id": "nope"})
    assert gone.status_code == 502
    assert gone.json()["message"] == "The sandbox was not found"
    bad = {**stream_headers(sbx), "x-access-token": "wrong"}
    r = await client.post(server.sandbox_url + START, content=start_body("true"), headers=bad)
    assert r.status_code == 401


async def test_files_upload_download_and_missing(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server)
    url = server.sandbox_url + "/files"
    r = await client.post(
        url,
        params={"path": "/tmp/a/b.bin"},
        content=b"\x00\x01bin",
        headers={**sbx.headers(), "content-type": "application/octet-stream"},
    )
    assert r.status_code == 200
    assert r.json()[0]["path"] == "/tmp/a/b.bin"
    r = await client.post(url, files={"file": ("/tmp/m.txt", b"multi")}, headers=sbx.headers())
    assert r.status_code == 200
    assert r.json() == [{"path": "/tmp/m.txt", "name": "m.txt", "type": "file"}]
    assert (
        await client.get(url, params={"path": "/tmp/a/b.bin"}, headers=sbx.headers())
    ).content == b"\x00\x01bin"
    assert (
        await client.get(url, params={"path": "/tmp/m.txt"}, headers=sbx.headers())
    ).content == b"multi"
    # Relative paths resolve in the user's home; the user comes from Basic auth.
    r = await client.post(
        url,
        params={"path": "rel.txt"},
        content=b"home",
        headers={**sbx.headers("user"), "content-type": "application/octet-stream"},
    )
    assert r.json()[0]["path"] == "/home/user/rel.txt"
    missing = await client.get(url, params={"path": "/tmp/none"}, headers=sbx.headers())
    assert missing.status_code == 404
    assert "not found" in missing.json()["message"]


async def test_rest_auth_detail_delete_and_idempotency(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    r = await client.post(f"{server.api_url}/v2/sandboxes", json={"templateID": "base"})
    assert r.status_code == 401
    key = {"x-api-key": server.api_key or "", "idempotency-key": "abc-1"}
    a = await client.post(
        f"{server.api_url}/v2/sandboxes",
        json={"templateID": "base", "metadata": {"k": "v"}},
        headers=key,
    )
    b = await client.post(
        f"{server.api_url}/v2/sandboxes", json={"templateID": "base"}, headers=key
    )
    assert a.status_code == b.status_code == 201
    sid = a.json()["sandboxID"]
    assert b.json()["sandboxID"] == sid
    assert server.live_sandbox_ids() == [sid]
    detail = await client.get(f"{server.api_url}/sandboxes/{sid}", headers=key)
    assert detail.json()["state"] == "running"
    assert detail.json()["metadata"] == {"k": "v"}
    assert (
        await client.delete(f"{server.api_url}/sandboxes/{sid}", headers=key)
    ).status_code == 204
    assert server.live_sandbox_ids() == []
    assert (
        await client.delete(f"{server.api_url}/sandboxes/{sid}", headers=key)
    ).status_code == 404
    assert (await client.get(f"{server.api_url}/sandboxes/{sid}", headers=key)).status_code == 404


async def test_sandbox_is_reclaimed_at_its_timeout(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server, timeout=600)
    key = {"x-api-key": server.api_key or ""}
    r = await client.post(
        f"{server.api_url}/sandboxes/{sbx.id}/timeout", json={"timeout": 1}, headers=key
    )
    assert r.status_code == 204
    with trio.fail_after(30):
        await server.wait_sandbox_gone(sbx.id)
    stats = server.statistics()
    assert stats.sandboxes_reclaimed == 1
    assert stats.live_sandboxes == 0
    assert (
        await client.get(server.sandbox_url + "/health", headers=sbx.headers())
    ).status_code == 502


async def test_sandbox_killed_mid_stream_ends_it_as_not_found(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    sbx = await create(client, server)
    async with trio.open_nursery() as nursery:
        results = []

        async def run() -> None:
            results.append(
                await stream(
                    client, server.sandbox_url + START, start_body("sleep 60"), stream_headers(sbx)
                )
            )

        nursery.start_soon(run)
        await wait_until(lambda: server.statistics().streams_open == 1)
        assert await server.kill_sandbox(sbx.id)
    (out,) = results
    assert out.end is None
    assert out.end_stream is not None
    assert out.end_stream.error is not None
    assert out.end_stream.error.code == "unavailable"
    assert out.end_stream.error.message == "The sandbox was not found"


@pytest.mark.parametrize(
    "path", ["/process.Process/Update", "/filesystem.Filesystem/CreateWatcher"]
)
async def test_unimplemented_rpcs_say_so(
    server: EnvdServer, client: httpx.AsyncClient, path: str
) -> None:
    sbx = await create(client, server)
    r = await unary(client, server.sandbox_url + path, wire.ListRequest(), sbx)
    assert r.status_code == 501
    assert r.json()["code"] == "unimplemented"


@pytest.mark.parametrize("fault_proxy", [False, True])
async def test_tls_serves_http2_and_http1(fault_proxy: bool) -> None:
    async with open_envd_server(tls=True, fault_proxy=fault_proxy) as server:
        assert server.ca_path is not None
        ctx = server.client_ssl_context()
        async with (
            httpx.AsyncClient(verify=ctx, http2=True, timeout=60) as h2,
            httpx.AsyncClient(verify=ctx, timeout=60) as h1,
        ):
            sbx = await create(h2, server)
            for client, version in ((h2, "HTTP/2"), (h1, "HTTP/1.1")):
                r = await client.get(server.sandbox_url + "/health", headers=sbx.headers())
                assert r.status_code == 204
                assert r.http_version == version
                out = await stream(
                    client, server.sandbox_url + START, start_body("echo tls"), stream_headers(sbx)
                )
                assert out.stdout == b"tls\n"


async def test_only_loopback_addresses_are_served() -> None:
    from trio_swe import InvalidArgumentError

    with pytest.raises(InvalidArgumentError):
        async with open_envd_server(host="0.0.0.0"):
            pass


async def test_a_sandbox_that_dies_on_its_own_is_gone(
    server: EnvdServer, client: httpx.AsyncClient
) -> None:
    import os
    import signal

    sbx = await create(client, server)
    local = server._registry.get(sbx.id).sandbox  # type: ignore[union-attr]
    os.kill(local.init_pid, signal.SIGKILL)  # type: ignore[attr-defined]  # lost by its backend
    with trio.fail_after(20):
        while local.alive:  # type: ignore[attr-defined]  # noqa: ASYNC110 - backend state
            await trio.sleep(0.01)
    out = await stream(client, server.sandbox_url + START, start_body("true"), stream_headers(sbx))
    assert out.end is None
    assert out.end_stream is not None
    assert out.end_stream.error is not None
    assert out.end_stream.error.code == "unavailable"
    assert out.end_stream.error.message == "The sandbox was not found"
    assert server.live_sandbox_ids() == []
    assert server.statistics().sandboxes_died == 1
    gone = await client.get(server.sandbox_url + "/health", headers=sbx.headers())
    assert gone.status_code == 502
