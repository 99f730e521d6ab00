"""E2BBackend against trio_swe.testing's envd-compatible server: real HTTP/2, real processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from trio_swe import (
    ConfigError,
    InvalidArgumentError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotRunningError,
    open_sandbox,
)
from trio_swe.sandbox.e2b import E2BBackend, E2BSandboxStatistics
from trio_swe.sandbox.e2b._h2conn import ping_interval_for, ping_timeout_for
from trio_swe.testing import EnvdServer, Fault, FaultPlan, open_envd_server

from .helpers import e2b_backend_for, open_server_and_backend

Pair = tuple[EnvdServer, E2BBackend]


async def test_exec_files_and_users(server_backend: Pair) -> None:
    server, backend = server_backend
    async with open_sandbox(backend, "base", env={"GREETING": "hi"}) as sb:
        assert sb.id in server.live_sandbox_ids()
        res = await sb.exec('echo "$GREETING $EXTRA"; pwd; exit 3', env={"EXTRA": "there"})
        assert (res.exit_code, res.reason) == (3, "exit")
        assert res.output == "hi there\n/testbed\n"
        assert (await sb.exec("id -un", user="agent")).output == "agent\n"
        # The backend names its user and cwd on every call: root and the workdir, whatever
        # envd's default (E2B's, and the server's: `user` in /home/user).
        assert (await sb.exec("id -un; echo $HOME")).output == "root\n/root\n"
        assert (await sb.exec("id -un; echo $HOME", user="user")).output == "user\n/home/user\n"
        await sb.write_file("/tmp/by-user", "u", user="user")
        await sb.write_file("/tmp/by-root", "r")
        owners = await sb.exec("stat -c %U /tmp/by-user /tmp/by-root")
        assert owners.output == "user\nroot\n"
        assert (await sb.exec("pwd", cwd="/tmp")).output == "/tmp\n"
        await sb.write_file("/tmp/d/f.bin", bytes(range(256)) * 100)
        assert await sb.read_file("/tmp/d/f.bin") == bytes(range(256)) * 100
        await sb.write_file("/tmp/d/run.sh", "echo ran\n", mode=0o755)
        assert (await sb.exec("/tmp/d/run.sh")).output == "ran\n"
        with pytest.raises(SandboxFileNotFoundError):
            await sb.read_file("/tmp/d/missing")
        with pytest.raises(InvalidArgumentError):
            await sb.exec("true", user="bad user")
        with pytest.raises(InvalidArgumentError, match="refused") as info:
            await sb.exec("true", user="nobody")  # envd's refusal is not a transport fault
        assert not isinstance(info.value, SandboxError)
        stats = sb.statistics()
        assert stats.rpcs >= 8
        assert stats.retries == 0
    assert server.live_sandbox_ids() == []
    assert backend.statistics().live == 0


async def test_timeout_kills_the_command(server_backend: Pair) -> None:
    server, backend = server_backend
    async with open_sandbox(backend, "base") as sb:
        res = await sb.exec("echo started; sleep 30", timeout=1.0)
        assert (res.exit_code, res.reason) == (-1, "timeout")
        assert res.output == "started\n"
        assert 1.0 <= res.duration_sec < 25.0  # not the command's 30 s (no tighter: load)
        # The kill's reply can reach us before the server has reaped the process (it counts a
        # process until then): wait for that, under a hang guard, rather than assert at once.
        with trio.fail_after(30):
            while server.statistics().processes_running:  # noqa: ASYNC110 - server state
                await trio.sleep(0.05)


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1, 0.3, 1.0])
async def test_a_cancelled_exec_leaves_no_process(server_backend: Pair, delay: float) -> None:
    # Cancellation anywhere in exec (sending the Start, the shielded wait for envd's start,
    # the output) kills the command by tag before it completes: nothing keeps running.
    server, backend = server_backend
    async with open_sandbox(backend, "base") as sb:
        with trio.move_on_after(delay):
            await sb.exec("echo started; sleep 30", timeout=60)
            pytest.fail("the command should still be running")
        with trio.fail_after(30):  # a hang guard; the server counts a process until it reaps it
            while server.statistics().processes_running:  # noqa: ASYNC110 - server state
                await trio.sleep(0.05)
        assert (await sb.exec("echo after")).output == "after\n"  # the sandbox is fine


@pytest.mark.parametrize(
    ("h2c", "client", "keepalive"), [(True, "h2", 50.0), (False, "httpx", 15.0)]
)
async def test_keepalive_defaults_per_client(h2c: bool, client: str, keepalive: float) -> None:
    # envd's HTTP/2 (h2c here) goes over the h2 client, which finds dead connections by PING,
    # so it asks envd for the SDK's 50 s; HTTP/1.1 (httpx) cannot sync a connection and keeps
    # 15 s. An explicit interval wins on both.
    async with open_server_and_backend() as (server, _):
        for asked, want in ((None, keepalive), (2.0, 2.0)):
            async with (
                e2b_backend_for(server, h2c=h2c, keepalive_interval=asked) as backend,
                open_sandbox(backend, "base") as sb,
            ):
                assert sb._envd.keepalive_interval == want
                assert sb._envd.idle_timeout == 2.5 * want + 1.0
                assert sb._envd.headers_timeout <= 38.5
                assert sb._envd.start_timeout == min(2.5 * want + 1.0, 38.5)
                assert (await sb.exec("echo ok")).output == "ok\n"
                assert client in {pool.client for pool in backend.statistics().pools}


async def test_envd_over_http1_runs_a_lanes_streams_at_once() -> None:
    # envd on a plain http:// origin is HTTP/1.1 (one stream per connection): the streams a
    # lane carries need as many connections. Each command waits until all four have started.
    # (At most 10 s each: a command still alone then fails with 9.)
    barrier = (
        "touch /tmp/started-{i}; for _ in $(seq 100); do "
        "[ $(ls /tmp/started-* | wc -l) -ge 4 ] && exit 0; sleep 0.1; done; exit 9"
    )
    async with (
        open_envd_server() as server,
        e2b_backend_for(server, h2c=False) as backend,
        open_sandbox(backend, "base") as sb,
    ):
        codes: list[int] = []

        async def one(i: int) -> None:
            codes.append((await sb.exec(barrier.format(i=i))).exit_code)

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        assert codes == [0, 0, 0, 0]
        (pool,) = backend.statistics().pools
        assert pool.client == "httpx"
        assert pool.peak_streams >= 4


def test_connection_liveness_does_not_scale_with_long_keepalives() -> None:
    # PING after at most 30 s of silence, dead after at most 30 s more, whatever the keepalive.
    assert [(ping_interval_for(k), ping_timeout_for(k)) for k in (1.0, 5.0, 15.0, 50.0)] == [
        (10.0, 5.0),
        (15.0, 10.0),
        (30.0, 30.0),
        (30.0, 30.0),
    ]


async def test_signal_exit_is_a_result(server_backend: Pair) -> None:
    _, backend = server_backend
    async with open_sandbox(backend, "base") as sb:
        res = await sb.exec("kill -TERM $$")
        assert res.exit_code == 128 + 15


async def test_large_output_keeps_the_tail(server_backend: Pair) -> None:
    server, _ = server_backend
    async with (
        e2b_backend_for(server, max_output_bytes=1000) as backend,
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec("seq 1 20000")
        assert res.output_truncated
        assert res.output.endswith("19999\n20000\n")
        assert len(res.output) == 1000


async def test_killing_a_reclaimed_sandbox_is_fine(server_backend: Pair) -> None:
    server, backend = server_backend
    async with open_sandbox(backend, "base") as sb:
        assert await server.kill_sandbox(sb.id)
        with pytest.raises(SandboxNotRunningError):
            await sb.exec("true")
    # open_sandbox's kill met a 404 and did not raise; and again, explicitly:
    await sb.kill()


async def test_sandbox_dying_mid_command_is_an_infrastructure_error(server_backend: Pair) -> None:
    server, backend = server_backend
    async with (
        open_sandbox(backend, "base") as sb,
        trio.open_nursery() as nursery,
    ):

        async def reclaim() -> None:
            # Mid-command: once the server runs it (not after a guessed delay).
            while not server.statistics().processes_running:  # noqa: ASYNC110 - server state
                await trio.sleep(0.05)
            await server.kill_sandbox(sb.id)

        nursery.start_soon(reclaim)
        with pytest.raises(SandboxNotRunningError):
            await sb.exec("sleep 20")
        with pytest.raises(SandboxNotRunningError):
            await sb.read_file("/etc/hostname")


async def test_ttl_reclaim_then_exec_is_not_running() -> None:
    async with (
        open_server_and_backend() as (server, backend),
        open_sandbox(backend, "base", ttl_sec=1) as sb,
    ):
        await server.wait_sandbox_gone(sb.id)
        with pytest.raises(SandboxNotRunningError):
            await sb.exec("true")


async def test_many_streams_spread_over_capped_connections(server_backend: Pair) -> None:
    server, _ = server_backend
    async with (
        e2b_backend_for(server, streams_per_connection=8, max_connections=4) as backend,
        open_sandbox(backend, "base") as sb,
    ):
        results: list[int] = []

        async def one(i: int) -> None:
            results.append((await sb.exec(f"sleep 0.5; exit {i % 7}")).exit_code)

        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(one, i)
        assert sorted(results) == sorted(i % 7 for i in range(40))
        (pool,) = (p for p in backend.statistics().pools if p.peak_streams > 1)
        assert pool.peak_streams == 32  # 4 connections x 8 streams, the rest waited
        assert pool.connections_opened == 4
        assert pool.slot_waits > 0


@pytest.mark.parametrize(
    "fault",
    [
        Fault(kind="status", route="/process.Process/Start", status=503, times=2),
        Fault(kind="status", route="/process.Process/Start", status=429, retry_after=0.2, times=1),
        Fault(kind="status", route="/process.Process/Start", status=502, times=1),
        Fault(kind="rst", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="rst", route="/process.Process/Start", before_request=True, code=7, times=1),
        Fault(kind="goaway", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="goaway", route="/process.Process/Start", before_request=True, times=1),
        Fault(kind="tcp_close", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="tcp_close", route="/process.Process/Start", before_request=True, times=1),
        Fault(kind="no_end", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="hang", route="/process.Process/Start", after_sec=0.5, times=1),
        Fault(kind="latency", route="/process.Process/Start", delay_sec=0.5, times=1),
    ],
    ids=lambda f: (
        f"{f.kind}-{f.status if f.kind == 'status' else f.after_sec}"
        + ("-before" if f.before_request else "")
    ),
)
async def test_one_fault_on_start_runs_the_command_once(fault: Fault, tmp_path: object) -> None:
    async with (
        open_server_and_backend(FaultPlan([fault], seed=0)) as (server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        # A TCP close before the request leaves no proof that it did not arrive: only an
        # idempotent command may be started again then (see the next test).
        ambiguous = fault.kind == "tcp_close" and fault.before_request
        res = await sb.exec("echo x >> /tmp/log; echo out; sleep 1.5; exit 5", idempotent=ambiguous)
        assert (res.exit_code, res.reason) == (5, "exit")
        assert (await sb.read_file("/tmp/log")) == b"x\n"
        assert server.statistics().faults_injected == {fault.kind: fault.times or 1}


async def test_non_idempotent_command_is_started_again_only_after_a_fence() -> None:
    # A TCP close before the request leaves no proof that the Start did not arrive. The call's
    # record settles it (issue 27 item 6): fenced, so the first Start can never run, and a new
    # Start runs the command, once. This used to be SandboxUnreachableError.
    plan = FaultPlan(
        [Fault(kind="tcp_close", route="/process.Process/Start", before_request=True, times=1)]
    )
    async with (
        open_server_and_backend(plan) as (_, backend),
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec("echo x >> /tmp/log; echo out; exit 4")
        assert (res.exit_code, res.reason, res.output, res.output_truncated) == (
            4,
            "exit",
            "out\n",
            False,
        )
        assert await sb.read_file("/tmp/log") == b"x\n"
        st = sb.statistics()
        assert isinstance(st, E2BSandboxStatistics)
        assert st.settles == 1


async def test_idempotent_command_is_started_again_when_the_probe_finds_nothing() -> None:
    # A reset at once: the request reached the proxy but no process carries our tag afterwards.
    plan = FaultPlan([Fault(kind="rst", route="/process.Process/Start", after_sec=0.0, times=1)])
    async with (
        open_server_and_backend(plan) as (server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        res = await sb.exec("echo x >> /tmp/log; sleep 0.5", idempotent=True)
        assert res.ok
        assert await sb.read_file("/tmp/log") == b"x\n"
        assert server.statistics().faults_injected == {"rst": 1}


def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("E2B_API_KEY", "E2B_DOMAIN", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="E2B_API_KEY"):
        E2BBackend()
    monkeypatch.setenv("E2B_API_KEY", "k")
    b = E2BBackend()
    assert (b.api_url, b.envd_url("abc")) == ("https://api.e2b.app", "https://sandbox.e2b.app")
    assert E2BBackend(domain="example.org").envd_url("abc") == "https://49983-abc.example.org"
    monkeypatch.setenv("E2B_DEBUG", "true")
    monkeypatch.delenv("E2B_API_KEY")
    d = E2BBackend()
    assert (d.api_url, d.envd_url("x")) == ("http://localhost:3000", "http://localhost:49983")
    monkeypatch.setenv("E2B_SANDBOX_URL", "http://127.0.0.1:1/")
    assert E2BBackend().envd_url("x") == "http://127.0.0.1:1"
    assert os.environ["E2B_DEBUG"] == "true"


async def test_tls_http2_with_a_private_ca() -> None:
    async with open_server_and_backend(tls=True) as (server, _):
        assert server.ca_path is not None
        async with (
            e2b_backend_for(server, h2c=False, verify=server.ca_path) as backend,
            open_sandbox(backend, "base") as sb,
        ):
            assert (await sb.exec("echo tls")).output == "tls\n"


async def test_unknown_template_is_a_permanent_boot_error(tmp_path: Path) -> None:
    """Issue 9, item 10: a 404 from create is the same every time; not retried by episodes."""
    from trio_swe import PermanentBootError

    async with open_server_and_backend(templates={"base": str(tmp_path)}) as (server, backend):
        with pytest.raises(PermanentBootError, match="no-such-template"):
            async with open_sandbox(backend, "no-such-template"):
                pass
        assert server.live_sandbox_ids() == []
