"""Fidelity: the official ``e2b`` SDK (sync client, in a worker thread) against the local server.

The SDK is the oracle for what envd and the REST API look like on the wire: if it works against
``trio_swe.testing``, so does anything written against E2B's real service.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
import trustme

from trio_swe.testing import EnvdServer, FaultPlan, open_envd_server

from ..conftest import host_pids_gone

e2b = pytest.importorskip("e2b")

T = TypeVar("T")


async def in_thread(fn: Callable[[], T]) -> T:
    return await trio.to_thread.run_sync(fn)


def params(server: EnvdServer, **extra: Any) -> dict[str, Any]:
    return {
        "api_key": server.api_key,
        "api_url": server.api_url,
        "sandbox_url": server.sandbox_url,
        "domain": server.domain,
        **extra,
    }


async def test_sdk_create_run_files_background_connect_kill(server: EnvdServer) -> None:
    marker = f"sdk-marker-{uuid.uuid4().hex}"

    def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        sb = e2b.Sandbox.create(
            template="base",
            timeout=120,
            envs={"SBX_VAR": "from-create"},
            metadata={"t": "1"},
            **params(server),
        )
        out["id"] = sb.sandbox_id
        r = sb.commands.run(
            "echo $SBX_VAR $CALL_VAR; pwd", envs={"CALL_VAR": "per-call"}, cwd="/tmp"
        )
        out["run"] = (r.exit_code, r.stdout)
        out["whoami"] = sb.commands.run("whoami", user="user").stdout.strip()
        try:
            sb.commands.run("echo bad >&2; exit 5")
        except e2b.CommandExitException as exc:
            out["exit"] = (exc.exit_code, exc.stderr)
        sb.files.write("/tmp/dir/hello.txt", "hello from sdk")
        out["read"] = sb.files.read("/tmp/dir/hello.txt")
        try:
            sb.files.read("/tmp/missing.txt")
        except e2b.FileNotFoundException:
            out["missing"] = True
        handle = sb.commands.run("sleep 0.5; echo bg-done", background=True)
        again = sb.commands.connect(handle.pid)
        res = again.wait()
        out["bg"] = (res.exit_code, res.stdout)
        # A long background command, killed through the SDK.
        long = sb.commands.run(f"sleep 300 # {marker}", background=True)
        out["listed"] = [p.pid for p in sb.commands.list()]
        out["long_pid"] = long.pid
        out["kill_cmd"] = sb.commands.kill(long.pid)
        info = sb.get_info()
        out["info"] = (info.sandbox_id, info.metadata)
        sb.set_timeout(200)
        out["running"] = sb.is_running()
        out["kill"] = sb.kill()
        out["kill_again"] = e2b.Sandbox.kill(sb.sandbox_id, **params(server))
        return out

    out = await in_thread(scenario)
    assert out["run"] == (0, "from-create per-call\n/tmp\n")
    assert out["whoami"] == "user"
    assert out["exit"][0] == 5
    assert "bad" in out["exit"][1]
    assert out["read"] == "hello from sdk"
    assert out["missing"] is True
    assert out["bg"] == (0, "bg-done\n")
    assert out["long_pid"] in out["listed"]
    assert out["kill_cmd"] is True
    assert out["info"] == (out["id"], {"t": "1"})
    assert out["running"] is True
    assert out["kill"] is True
    assert out["kill_again"] is False
    assert server.live_sandbox_ids() == []
    assert await host_pids_gone(marker) == []


_TLS_SCENARIO = """
import json, sys
import e2b
sb = e2b.Sandbox.create(timeout=60)
try:
    r = sb.commands.run("echo over-h2")
    sb.files.write("/tmp/t.txt", b"tls bytes")
    print(json.dumps([r.stdout, sb.files.read("/tmp/t.txt")]))
finally:
    sb.kill()
"""


async def test_sdk_over_tls_http2_through_the_fault_proxy(
    session_ca: tuple[trustme.CA, Path],
) -> None:
    # A fresh interpreter: the SDK reads SSL_CERT_FILE once, when it builds its process-wide pool.
    ca, _ = session_ca
    async with open_envd_server(tls=True, ca=ca, faults=FaultPlan()) as server:
        assert server.sandbox_url.startswith("https://")
        proc = await trio.run_process(
            [sys.executable, "-c", _TLS_SCENARIO],
            env={**os.environ, **server.sdk_env()},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        assert json.loads(proc.stdout) == ["over-h2\n", "tls bytes"]
        stats = server.statistics()
        # RPCs and uploads went over HTTP/2 through the proxy (downloads use HTTP/1.1).
        assert stats.proxy.h2_connections >= 1
        assert stats.proxy.streams >= 2
        assert stats.live_sandboxes == 0


async def test_sdk_debug_mode_uses_the_lazy_debug_sandbox(server: EnvdServer) -> None:
    def scenario() -> str:
        sb = e2b.Sandbox.create(debug=True, sandbox_url=server.sandbox_url)
        return sb.commands.run("echo debug").stdout

    assert await in_thread(scenario) == "debug\n"
    assert server.live_sandbox_ids() == ["debug_sandbox_id"]


async def test_sdk_command_timeout_kills_the_process(server: EnvdServer) -> None:
    marker = f"sdk-timeout-{uuid.uuid4().hex}"

    def scenario() -> type[BaseException]:
        sb = e2b.Sandbox.create(timeout=60, **params(server))
        try:
            sb.commands.run(f"sleep 300 # {marker}", timeout=1)
        except Exception as exc:
            return type(exc)
        raise AssertionError("the command did not time out")

    assert issubclass(await in_thread(scenario), e2b.TimeoutException)
    # envd's deadline kills it; the kill and the kernel's teardown finish after the SDK's error.
    assert await host_pids_gone(marker) == []


async def test_sdk_sees_503_with_retry_after_as_a_typed_error() -> None:
    from trio_swe.testing import Fault

    plan = FaultPlan(
        [Fault(kind="status", route="/process.Process/Start", status=429, retry_after=1, times=1)]
    )
    async with open_envd_server(faults=plan, fault_proxy=False) as server:

        def scenario() -> tuple[type[BaseException], str]:
            sb = e2b.Sandbox.create(timeout=60, **params(server))
            try:
                sb.commands.run("echo never")
            except Exception as exc:
                first: type[BaseException] = type(exc)
            else:
                raise AssertionError("no fault")
            return first, sb.commands.run("echo second").stdout

        first, second = await in_thread(scenario)
        assert issubclass(first, e2b.RateLimitException)
        assert second == "second\n"
        assert server.statistics().faults_injected == {"status": 1}


async def test_sdk_filesystem_calls(server: EnvdServer) -> None:
    def scenario() -> dict[str, Any]:
        sb = e2b.Sandbox.create(timeout=60, **params(server))
        out: dict[str, Any] = {}
        out["mkdir"] = sb.files.make_dir("/tmp/fs/sub")
        out["mkdir_again"] = sb.files.make_dir("/tmp/fs/sub")
        sb.files.write("/tmp/fs/sub/a.txt", "abc")
        sb.files.write("/tmp/fs/b.txt", "b")
        out["exists"] = (sb.files.exists("/tmp/fs/b.txt"), sb.files.exists("/tmp/fs/nope"))
        info = sb.files.get_info("/tmp/fs/sub/a.txt")
        out["info"] = (info.name, info.type, info.size, info.owner)
        out["list1"] = sorted(e.name for e in sb.files.list("/tmp/fs"))
        out["list2"] = sorted(e.path for e in sb.files.list("/tmp/fs", depth=2))
        moved = sb.files.rename("/tmp/fs/b.txt", "/tmp/fs/c.txt")
        out["moved"] = (moved.path, sb.files.read("/tmp/fs/c.txt"))
        sb.files.remove("/tmp/fs/sub")
        out["after_remove"] = sb.files.exists("/tmp/fs/sub")
        try:
            sb.files.get_info("/tmp/fs/sub/a.txt")
        except e2b.FileNotFoundException:
            out["gone"] = True
        out["user_home"] = sb.files.list(".", user="user") == []
        sb.kill()
        return out

    out = await in_thread(scenario)
    assert out["mkdir"] is True
    assert out["mkdir_again"] is False
    assert out["exists"] == (True, False)
    assert out["info"] == ("a.txt", e2b.FileType.FILE, 3, "user")  # the default user wrote it
    assert out["list1"] == ["b.txt", "sub"]
    assert out["list2"] == ["/tmp/fs/b.txt", "/tmp/fs/sub", "/tmp/fs/sub/a.txt"]
    assert out["moved"] == ("/tmp/fs/c.txt", "b")
    assert out["after_remove"] is False
    assert out["gone"] is True
    assert out["user_home"] is True


async def test_sdk_list_and_connect_by_id(server: EnvdServer) -> None:
    def scenario() -> tuple[list[tuple[str, dict[str, str]]], str]:
        sb = e2b.Sandbox.create(metadata={"episode": "7"}, **params(server))
        listed = [
            (i.sandbox_id, i.metadata) for i in e2b.Sandbox.list(**params(server)).next_items()
        ]
        again = e2b.Sandbox.connect(sb.sandbox_id, **params(server))
        out = again.commands.run("echo via-connect").stdout
        sb.kill()
        return listed, out

    listed, out = await in_thread(scenario)
    assert len(listed) == 1
    assert listed[0][1] == {"episode": "7"}
    assert out == "via-connect\n"


async def test_sdk_stdin_send_stream_and_close(server: EnvdServer) -> None:
    def scenario() -> str:
        sb = e2b.Sandbox.create(**params(server))
        handle = sb.commands.run("cat", background=True, stdin=True)
        sb.commands.send_stdin(handle.pid, "one,")
        sb.commands.stream_input(handle.pid, ["two,", b"three"])
        sb.commands.close_stdin(handle.pid)
        out = handle.wait().stdout
        sb.kill()
        return out

    assert await in_thread(scenario) == "one,two,three"


async def test_sdk_sees_envd_documented_errors(server: EnvdServer) -> None:
    """What envd does where the server once differed (issue 9 item 13, found with the SDK)."""

    def scenario() -> dict[str, Any]:
        sb = e2b.Sandbox.create(timeout=60, **params(server))
        out: dict[str, Any] = {}
        for cmd in ("exit 3", "kill -9 $$"):
            try:
                sb.commands.run(cmd)
            except e2b.CommandExitException as exc:
                out[cmd] = (exc.exit_code, exc.error)
        try:
            sb.commands.run("pwd", cwd="/no/such/dir")
        except e2b.InvalidArgumentException as exc:
            out["cwd"] = type(exc).__name__
        sb.files.write("/tmp/plain", "x")
        try:
            sb.files.make_dir("/tmp/plain")
        except e2b.SandboxException as exc:
            out["mkdir_over_file"] = type(exc).__name__
        out["mkdir_over_dir"] = sb.files.make_dir("/tmp")  # False: it already exists
        try:
            sb.files.list("/tmp/no-such-dir")
        except e2b.NotFoundException as exc:
            out["list_missing"] = type(exc).__name__
        sb.files.remove("/tmp/no-such-path")  # envd: success
        out["remove_missing"] = True
        sb.kill()
        return out

    out = await in_thread(scenario)
    assert out["exit 3"] == (3, "exit status 3")
    assert out["kill -9 $$"][1] == "signal: killed"
    assert out["cwd"] == "InvalidArgumentException"
    assert out["mkdir_over_file"] in ("InvalidArgumentException", "SandboxException")
    assert out["mkdir_over_dir"] is False
    assert out["list_missing"] in ("NotFoundException", "FileNotFoundException")
    assert out["remove_missing"] is True


async def test_sdk_sees_e2b_default_user_home_and_file_ownership(server: EnvdServer) -> None:
    """E2B's own defaults, as a real sandbox shows them (issue 27 item 9): the default user is
    ``user``, a command runs in its home ``/home/user`` (a relative ``cwd`` too), ``HOME`` is
    that home, a relative ``files.write`` path lands there, what ``user`` writes ``user`` owns,
    and ``files.list`` entries carry path, size, mode, permissions and owner. ``root`` keeps
    its own: ``/root``."""

    def scenario() -> dict[str, Any]:
        sb = e2b.Sandbox.create(timeout=60, **params(server))

        def probe(fn: Callable[[], T]) -> T | str:
            # Each check answers on its own: a server that differs shows every difference.
            try:
                return fn()
            except Exception as exc:
                return type(exc).__name__

        def owned() -> str:
            sb.files.write("/tmp/own/f.txt", "owned", user="user")  # absolute: ownership only
            return sb.commands.run("stat -c %U:%G /tmp/own /tmp/own/f.txt", user="root").stdout

        def entry() -> tuple[Any, ...]:
            e = {x.name: x for x in sb.files.list("/tmp/own")}["f.txt"]
            return (e.path, e.size, e.mode, e.permissions, e.owner, e.group)

        out: dict[str, Any] = {
            "default_user": probe(lambda: sb.commands.run("whoami").stdout),
            "default_cwd": probe(lambda: sb.commands.run("pwd").stdout),
            "home_of_user": probe(lambda: sb.commands.run("echo $HOME", user="user").stdout),
            "relative_write": probe(lambda: sb.files.write("notes/rel.txt", "relative").path),
            "read_back": probe(lambda: sb.files.read("/home/user/notes/rel.txt")),
            "relative_cwd": probe(lambda: sb.commands.run("pwd", cwd="notes").stdout),
            "owner": probe(owned),
            "list_entry": probe(entry),
            "root": probe(lambda: sb.commands.run("whoami; pwd; echo $HOME", user="root").stdout),
        }
        sb.kill()
        return out

    assert await in_thread(scenario) == {
        "default_user": "user\n",
        "default_cwd": "/home/user\n",
        "home_of_user": "/home/user\n",
        "relative_write": "/home/user/notes/rel.txt",
        "read_back": "relative",
        "relative_cwd": "/home/user/notes\n",
        "owner": "user:user\nuser:user\n",
        "list_entry": ("/tmp/own/f.txt", 5, 0o644, "-rw-r--r--", "user", "user"),
        "root": "root\n/root\n/root\n",
    }
