"""Fault injection: the plan (sans-IO) and every fault as a client actually sees it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from trio_swe import InvalidArgumentError
from trio_swe.sandbox.e2b import _connect as connect
from trio_swe.sandbox.e2b import _wire as wire
from trio_swe.testing import (
    CANCEL,
    INTERNAL_ERROR,
    NO_ERROR,
    REFUSED_STREAM,
    EnvdServer,
    Fault,
    FaultPlan,
    open_envd_server,
)
from trio_swe.testing._envd._multipart import MultipartError, parse_multipart

from ..conftest import host_pids_gone, host_pids_seen
from ._envd_client import Sbx, create, start_body, stream_headers, unary, wait_until
from ._h2client import H2Client, StreamResult

START = "/process.Process/Start"

# --- the plan, sans-IO ------------------------------------------------------------------------


def test_first_matching_rule_wins_and_budgets_run_out() -> None:
    plan = FaultPlan(
        [
            Fault(kind="status", route="/files", method="GET", times=1),
            Fault(kind="latency", route="/process.Process/*", skip=1, times=2, delay_sec=0.1),
        ]
    )
    assert plan.decide("POST", "/files") is None  # method does not match
    assert plan.decide("GET", "/files") == plan.faults[0]
    assert plan.decide("GET", "/files") is None  # budget spent
    assert plan.decide("POST", START) is None  # skipped once
    assert [plan.decide("POST", START) for _ in range(3)] == [plan.faults[1]] * 2 + [None]


def test_random_faults_are_seeded_and_filtered_by_kind() -> None:
    rules = [Fault(kind="rst", probability=0.3), Fault(kind="status", probability=0.5)]
    a = [FaultPlan(rules, seed=11).decide("POST", START) for _ in range(1)]
    draws1 = _draws(FaultPlan(rules, seed=11))
    draws2 = _draws(FaultPlan(rules, seed=11))
    assert draws1 == draws2
    assert draws1 != _draws(FaultPlan(rules, seed=12))
    assert 200 < draws1.count("rst") < 400  # p=0.3 of 1000
    assert a is not None
    only_app = FaultPlan(rules, seed=11)
    kinds = {only_app.decide("POST", START, kinds=frozenset({"status"})) for _ in range(50)}
    assert {f.kind for f in kinds if f is not None} == {"status"}


def _draws(plan: FaultPlan) -> list[str | None]:
    out = []
    for _ in range(1000):
        f = plan.decide("POST", START)
        out.append(None if f is None else f.kind)
    return out


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": "explode"},
        {"kind": "rst", "probability": 1.5},
        {"kind": "rst", "after_sec": -1},
        {"kind": "rst", "code": -1},
        {"kind": "rst", "times": -2},
    ],
)
def test_invalid_faults_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        Fault(**bad)  # type: ignore[arg-type]


def test_multipart_parser() -> None:
    body = (
        b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="/a/b.txt"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\nline1\r\n--not-boundary\r\n"
        b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="c"\r\n\r\n'
        b"\r\n--xyz--\r\n"
    )
    parts = parse_multipart(body, "xyz")
    assert [(p.name, p.filename, p.data) for p in parts] == [
        ("file", "/a/b.txt", b"line1\r\n--not-boundary"),
        ("file", "c", b""),
    ]
    with pytest.raises(MultipartError):
        parse_multipart(b"--xyz\r\nContent-Disposition: form-data\r\n\r\nno end", "xyz")


# --- frame-level faults, seen by a raw HTTP/2 client -------------------------------------------


@asynccontextmanager
async def h2_session(server: EnvdServer) -> AsyncIterator[tuple[H2Client, trio.Nursery]]:
    url = urlsplit(server.sandbox_url)
    assert url.hostname is not None
    assert url.port is not None
    client = await H2Client.connect(url.hostname, url.port)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.run)
        try:
            yield client, nursery
        finally:
            await client.aclose()


async def start_on(
    client: H2Client, sbx: Sbx, cmd: str, *, tag: str | None = None, keepalive: str = "0.1"
) -> tuple[int, StreamResult]:
    return await client.request(
        "POST", START, stream_headers(sbx, keepalive=keepalive), start_body(cmd, tag=tag)
    )


def events_of(body: bytes) -> tuple[list[wire.ProcessEvent], bool]:
    """Decoded events and whether the end-of-stream envelope came."""
    envs = connect.EnvelopeDecoder().feed(body)
    events = [wire.decode(e.payload, wire.StartResponse).event for e in envs if not e.end_stream]
    return [e for e in events if e is not None], any(e.end_stream for e in envs)


def _events(res: StreamResult) -> list[wire.ProcessEvent]:
    return events_of(bytes(res.body))[0]


async def running_tags(http: httpx.AsyncClient, server: EnvdServer, sbx: Sbx) -> list[str | None]:
    r = await unary(http, server.sandbox_url + "/process.Process/List", wire.ListRequest(), sbx)
    return [p.tag for p in wire.decode(r.content, wire.ListResponse).processes]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=30) as c:
        yield c


async def test_rst_stream_with_a_chosen_code_cuts_the_stream_not_the_process(
    http: httpx.AsyncClient,
) -> None:
    plan = FaultPlan([Fault(kind="rst", route=START, after_sec=0.3, code=INTERNAL_ERROR)])
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        async with h2_session(server) as (client, _):
            _, res = await start_on(client, sbx, "sleep 30", tag="cut")
            with trio.fail_after(20):
                await res.done.wait()
        assert res.reset_code == INTERNAL_ERROR
        assert res.status == 200  # the stream had started
        assert await running_tags(http, server, sbx) == ["cut"]
        assert server.statistics().faults_injected == {"rst": 1}


async def test_refused_stream_never_reaches_the_server(http: httpx.AsyncClient) -> None:
    plan = FaultPlan(
        [Fault(kind="rst", route=START, before_request=True, code=REFUSED_STREAM, times=1)]
    )
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        async with h2_session(server) as (client, _):
            _, res = await start_on(client, sbx, "touch /tmp/refused")
            with trio.fail_after(20):
                await res.done.wait()
            assert res.reset_code == REFUSED_STREAM
            assert res.status is None
            # The same connection still works for the next request.
            _, ok = await start_on(client, sbx, "echo fine")
            with trio.fail_after(20):
                await ok.done.wait()
        events, ended = events_of(ok.body)
        assert ended
        assert any(e.end is not None for e in events)
        missing = await http.get(
            server.sandbox_url + "/files", params={"path": "/tmp/refused"}, headers=sbx.headers()
        )
        assert missing.status_code == 404
        assert server.statistics().requests_by_path[START] == 1


async def test_graceful_goaway_lets_earlier_streams_finish(http: httpx.AsyncClient) -> None:
    plan = FaultPlan(
        [
            Fault(
                kind="goaway",
                route="/process.Process/List",
                before_request=True,
                code=NO_ERROR,
            )
        ]
    )
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        async with h2_session(server) as (client, _):
            sid1, _first = await start_on(client, sbx, "sleep 0.5; echo one", tag="early")
            await wait_until(lambda: server.statistics().streams_open == 1)
            sid3, listed = await client.request(
                "POST",
                "/process.Process/List",
                {**sbx.headers(), "content-type": "application/json"},
                b"{}",
            )
            with trio.fail_after(20):
                # The proxy closes the connection once stream 1 is finished.
                await client.closed.wait()
        assert client.goaway is not None
        assert client.goaway.last_stream_id == sid1
        assert sid1 < sid3
        assert client.goaway.error_code == NO_ERROR
        assert listed.status is None  # never answered: it never reached the server
        assert "/process.Process/List" not in server.statistics().requests_by_path
        # Stream 1 ran to completion on the server.
        late = await unary(
            http,
            server.sandbox_url + "/process.Process/SendSignal",
            wire.SendSignalRequest(
                process=wire.ProcessSelector(tag="early"), signal="SIGNAL_SIGKILL"
            ),
            sbx,
        )
        assert late.status_code == 200  # retained after exit: still selectable by tag
        assert server.statistics().streams_open == 0


async def test_abrupt_goaway_and_tcp_close(http: httpx.AsyncClient) -> None:
    plan = FaultPlan(
        [
            Fault(kind="goaway", route=START, after_sec=0.2, code=INTERNAL_ERROR, times=1),
            Fault(kind="tcp_close", route=START, after_sec=0.2, times=1),
        ]
    )
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        async with h2_session(server) as (client, _):
            sid, res = await start_on(client, sbx, "sleep 30")
            with trio.fail_after(20):
                await client.closed.wait()
        assert client.goaway is not None
        assert client.goaway.error_code == INTERNAL_ERROR
        assert client.goaway.last_stream_id == sid
        assert not res.ended
        async with h2_session(server) as (client2, _):
            _, res2 = await start_on(client2, sbx, "sleep 30")
            with trio.fail_after(20):
                await client2.closed.wait()
        assert client2.goaway is None  # closed without a GOAWAY
        assert not res2.ended
        assert res2.reset_code is None
        assert server.statistics().faults_injected == {"goaway": 1, "tcp_close": 1}


async def test_a_silent_stream_is_only_detected_by_a_read_timeout(
    http: httpx.AsyncClient,
) -> None:
    plan = FaultPlan([Fault(kind="hang", route=START, after_sec=0.3, times=1)])
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        async with h2_session(server) as (client, _):
            _, res = await start_on(client, sbx, "sleep 30", tag="silent", keepalive="0.05")
            await wait_until(lambda: server.statistics().faults_injected == {"hang": 1})
            size = len(res.body)
            # A neighbour on the same connection, not hung: its keepalives arrive while the
            # silent stream gets none (whether the silent one sent any in its first 0.3 s
            # depends on how busy the machine is).
            _, live = await start_on(client, sbx, "sleep 30", tag="live", keepalive="0.05")
            await wait_until(lambda: any(e.keepalive is not None for e in _events(live)))
            with trio.move_on_after(1.0) as idle:
                await res.done.wait()
            assert idle.cancelled_caught  # no end, no reset: only a timeout tells
            assert len(res.body) == size  # not even keepalives arrive
            assert not client.closed.is_set()
        assert res.status == 200  # the response had started: the hang came into it
        assert sorted(await running_tags(http, server, sbx)) == ["live", "silent"]


async def test_app_level_faults_handed_off_by_the_proxy(http: httpx.AsyncClient) -> None:
    plan = FaultPlan(
        [
            Fault(kind="status", route=START, status=503, retry_after=2, times=1),
            Fault(kind="latency", route=START, delay_sec=0.05, times=1),
            Fault(kind="no_end", route=START, after_sec=0.2, times=1),
        ]
    )
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        async with h2_session(server) as (client, _):
            _, busy = await start_on(client, sbx, "touch /tmp/busy")
            with trio.fail_after(20):
                await busy.done.wait()
            assert busy.status == 503
            assert busy.headers["retry-after"] == "2"
            _, slow = await start_on(client, sbx, "echo slow")
            _, cut = await start_on(client, sbx, "sleep 30", tag="no-end")
            with trio.fail_after(20):
                await slow.done.wait()
                await cut.done.wait()
        assert events_of(bytes(slow.body))[1]
        events, ended = events_of(bytes(cut.body))
        assert cut.ended
        assert not ended  # the stream ended without Connect's end-of-stream message
        assert all(e.end is None for e in events)
        assert await running_tags(http, server, sbx) == ["no-end"]
        assert server.statistics().faults_injected == {"status": 1, "latency": 1, "no_end": 1}


async def test_httpx_h2_client_sees_the_reset_code() -> None:
    plan = FaultPlan([Fault(kind="rst", route=START, after_sec=0.1, code=CANCEL)])
    async with (
        open_envd_server(faults=plan) as server,
        httpx.AsyncClient(http1=False, http2=True, timeout=30) as h2c,
    ):
        sbx = await create(h2c, server)
        with pytest.raises(httpx.RemoteProtocolError, match="error_code:8"):
            async with h2c.stream(
                "POST",
                server.sandbox_url + START,
                content=start_body("sleep 30"),
                headers=stream_headers(sbx),
            ) as r:
                async for _ in r.aiter_bytes():
                    pass


# --- HTTP/1.1: the app approximates frame faults ----------------------------------------------


async def test_http1_frame_faults_drop_or_silence_the_connection(http: httpx.AsyncClient) -> None:
    plan = FaultPlan(
        [
            Fault(kind="rst", route=START, after_sec=0.2, times=1),
            Fault(kind="hang", route="/health", before_request=True, times=1),
        ]
    )
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        with pytest.raises(httpx.RemoteProtocolError):
            async with http.stream(
                "POST",
                server.sandbox_url + START,
                content=start_body("sleep 30"),
                headers=stream_headers(sbx),
            ) as r:
                async for _ in r.aiter_bytes():
                    pass
        with pytest.raises(httpx.ReadTimeout):
            await http.get(server.sandbox_url + "/health", headers=sbx.headers(), timeout=0.5)
        assert server.statistics().faults_injected == {"rst": 1, "hang": 1}


async def test_server_exit_kills_every_sandbox_and_process(http: httpx.AsyncClient) -> None:
    marker = f"exit-marker-{uuid.uuid4().hex}"
    async with open_envd_server() as server:
        sbx = await create(http, server)
        async with http.stream(
            "POST",
            server.sandbox_url + START,
            content=start_body(f"sleep 300 # {marker}"),
            headers=stream_headers(sbx),
        ) as r:
            assert r.status_code == 200
            body = b""
            async for chunk in r.aiter_bytes():
                body += chunk
                events, ended = events_of(body)
                if events or ended:
                    break
            # The start event, not an error's end of stream: the process runs.
            assert events, body
            assert events[0].start is not None, events
            assert await host_pids_seen(marker)
    # Killed and reaped by the server's exit; on a loaded machine the kernel may still be
    # tearing a killed process down (its /proc entry) for a moment after its reap.
    assert await host_pids_gone(marker) == []


async def test_a_decided_fault_always_happens_even_after_the_reply(
    http: httpx.AsyncClient,
) -> None:
    # Faults timed after the response would have ended take the place of its end: a stream
    # loses its end event, a unary call loses its reply although the server did the work.
    plan = FaultPlan(
        [
            Fault(kind="rst", route=START, after_sec=60, code=INTERNAL_ERROR, times=1),
            Fault(kind="no_end", route=START, after_sec=60, times=1),
            Fault(kind="rst", route="/process.Process/SendSignal", code=CANCEL, times=1),
        ]
    )
    async with open_envd_server(faults=plan) as server:
        sbx = await create(http, server)
        async with h2_session(server) as (client, _):
            _, quick = await start_on(client, sbx, "echo quick", tag="q1")
            with trio.fail_after(20):
                await quick.done.wait()
            assert quick.reset_code == INTERNAL_ERROR
            events, ended = events_of(bytes(quick.body))
            assert b"".join(e.data.stdout or b"" for e in events if e.data) == b"quick\n"
            assert all(e.end is None for e in events)
            assert not ended

            _, quiet = await start_on(client, sbx, "true", tag="q2")
            with trio.fail_after(20):
                await quiet.done.wait()
            assert quiet.ended
            events, ended = events_of(bytes(quiet.body))
            assert all(e.end is None for e in events)
            assert not ended

            _, sleeper = await start_on(client, sbx, "sleep 60", tag="victim")
            await sleeper.first_data.wait()
            _, signal = await client.request(
                "POST",
                "/process.Process/SendSignal",
                {**sbx.headers(), "content-type": "application/json"},
                wire.encode(
                    wire.SendSignalRequest(
                        process=wire.ProcessSelector(tag="victim"), signal="SIGNAL_SIGKILL"
                    )
                ),
            )
            with trio.fail_after(20):
                await signal.done.wait()
                await sleeper.done.wait()
            assert signal.reset_code == CANCEL
            assert signal.body == b""  # the reply was lost...
            events, _ = events_of(bytes(sleeper.body))
            ends = [e.end for e in events if e.end is not None]
            assert [e.status for e in ends] == ["signal: killed"]  # ...but the signal was sent
        assert server.statistics().faults_injected == {"rst": 2, "no_end": 1}


async def test_server_survives_peers_dropping_connections_mid_upload(
    http: httpx.AsyncClient,
) -> None:
    async with open_envd_server(faults=FaultPlan()) as server:
        sbx = await create(http, server)
        body = b"x" * 3000  # 20 bodies fit in the initial flow-control window
        for _ in range(3):
            server.faults.add(Fault(kind="tcp_close", route="/files", after_sec=0.02, times=1))
            async with h2_session(server) as (client, _):
                results = [
                    await client.request(
                        "POST",
                        f"/files?path=/tmp/up{i}",
                        {**sbx.headers(), "content-type": "application/octet-stream"},
                        body,
                    )
                    for i in range(20)
                ]
                with trio.fail_after(30):
                    await client.closed.wait()
            assert not all(r.ended for _, r in results)
        assert server.statistics().faults_injected == {"tcp_close": 3}
        ok = await http.get(server.sandbox_url + "/health", headers=sbx.headers())
        assert ok.status_code == 204
