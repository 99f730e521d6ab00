"""DockerBackend: the sans-IO pieces on bytes, then a real dockerd (tests/dockerenv.py).

Each real test checks afterwards that no container of this process is left.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from trio_swe import (
    BackendUnavailableError,
    ConfigError,
    InvalidArgumentError,
    ResourceLimits,
    SandboxBootError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotAFileError,
    SandboxPermissionError,
    open_sandbox,
)
from trio_swe.sandbox.docker import DockerBackend, PullProgress
from trio_swe.sandbox.docker._wire import (
    FrameDecoder,
    apply_pull_event,
    container_body,
    endpoint_from,
    first_member,
    is_stale,
    negotiate,
    resolve_link,
    split_reference,
)

from ..dockerenv import DockerEnv

# -- sans-IO ----------------------------------------------------------------------------------


def _frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def test_frames_are_demultiplexed_across_any_chunking() -> None:
    wire = _frame(1, b"out1") + _frame(2, b"err") + _frame(1, b"") + _frame(1, b"x" * 70000)
    for _ in range(20):
        dec = FrameDecoder()
        cuts = sorted(random.sample(range(1, len(wire)), 5))
        got = []
        for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True):
            got += dec.feed(wire[a:b])
        assert got == [(1, b"out1"), (2, b"err"), (1, b""), (1, b"x" * 70000)]
        assert dec.pending == 0
    dec = FrameDecoder()
    dec.feed(wire[:10])
    assert dec.pending == 10  # a cut stream is noticed
    with pytest.raises(SandboxError, match="malformed"):
        FrameDecoder().feed(b"HTTP/1.1 200 OK\r\n")


def test_endpoint_is_found_as_the_cli_finds_it() -> None:
    assert endpoint_from(None).uds == "/var/run/docker.sock"
    assert endpoint_from("unix:///tmp/d.sock").uds == "/tmp/d.sock"
    tcp = endpoint_from("tcp://127.0.0.1:2375")
    assert (tcp.uds, tcp.base_url) == (None, "http://127.0.0.1:2375")
    for bad in ("unix://rel.sock", "ssh://host", "npipe:////./pipe/docker"):
        with pytest.raises(ConfigError, match="DOCKER_HOST"):
            endpoint_from(bad)


def test_version_negotiation() -> None:
    assert negotiate({"ApiVersion": "1.41", "MinAPIVersion": "1.12"}) == "1.41"
    assert negotiate({"ApiVersion": "1.50", "MinAPIVersion": "1.24"}) == "1.43"  # capped
    with pytest.raises(SandboxError, match=r"1\.20"):
        negotiate({"ApiVersion": "1.20"})
    with pytest.raises(SandboxError, match="unreadable"):
        negotiate({"Version": "x"})


def test_stale_owner_rules() -> None:
    alive = {(10, "500")}

    def is_alive(pid: int, ticks: str) -> bool:
        return (pid, ticks) in alive

    kw = {"host": "h", "boot_id": "b", "alive": is_alive}
    assert not is_stale("h/b/10/500", **kw)  # type: ignore[arg-type]
    assert is_stale("h/b/10/499", **kw)  # type: ignore[arg-type]  # pid reused
    assert is_stale("h/b/11/500", **kw)  # type: ignore[arg-type]  # gone
    assert is_stale("h/old-boot/10/500", **kw)  # type: ignore[arg-type]
    assert not is_stale("other/b/11/500", **kw)  # type: ignore[arg-type]  # another machine's
    assert not is_stale("garbage", **kw)  # type: ignore[arg-type]


def test_references_and_pull_events() -> None:
    assert split_reference("127.0.0.1:5000/a/b:v1") == ("127.0.0.1:5000/a/b", "v1")
    assert split_reference("127.0.0.1:5000/a/b") == ("127.0.0.1:5000/a/b", "latest")
    assert split_reference("a/b@sha256:00") == ("a/b", "sha256:00")
    p = PullProgress(image="x")
    apply_pull_event(
        p, {"status": "Downloading", "id": "l1", "progressDetail": {"current": 5, "total": 10}}
    )
    apply_pull_event(p, {"status": "Pull complete", "id": "l2"})
    assert (p.current, p.total) == (5, 10)
    apply_pull_event(p, {"status": "Status: Downloaded newer image for x"})
    assert p.done
    with pytest.raises(SandboxError, match="manifest unknown"):
        apply_pull_event(
            p, {"error": "manifest unknown", "errorDetail": {"message": "manifest unknown"}}
        )


def test_container_body_carries_limits_network_labels() -> None:
    body = container_body(
        image="img",
        workdir="/testbed",
        env={"A": "1"},
        labels={"trio_swe.sandbox": "1"},
        network_mode="none",
        limits=ResourceLimits(memory_bytes=1 << 30, cpus=1.5, pids=256),
        ulimits=[("nofile", 100, 200)],
    )
    host = body["HostConfig"]
    assert (host["Memory"], host["MemorySwap"], host["NanoCpus"], host["PidsLimit"]) == (
        1 << 30, 1 << 30, 1_500_000_000, 256,
    )  # fmt: skip
    assert host["NetworkMode"] == "none"
    assert body["NetworkDisabled"] is True
    assert host["Ulimits"] == [{"Name": "nofile", "Soft": 100, "Hard": 200}]
    assert body["Env"] == ["A=1"]
    assert body["Labels"] == {"trio_swe.sandbox": "1"}


def test_archive_members_and_links() -> None:
    from trio_swe.sandbox.docker._wire import file_archive

    assert first_member(file_archive("f", b"abc", mode=0o600, uid=1, gid=1)).data == b"abc"
    with pytest.raises(SandboxError, match="unreadable"):
        first_member(b"not a tar" * 100)
    assert resolve_link("/a/b/c", "../d") == "/a/d"
    assert resolve_link("/a/b/c", "/etc/x") == "/etc/x"


# -- a real daemon ------------------------------------------------------------------------------


@pytest.fixture
def dk(docker_env: DockerEnv) -> Iterator[DockerEnv]:
    yield docker_env
    assert docker_env.own_containers() == [], "a container was left behind"


def _backend(env: DockerEnv, **kw: object) -> DockerBackend:
    return DockerBackend(host=env.docker_host, base_image=env.base_image, **kw)  # type: ignore[arg-type]


async def test_swe_image_boots_without_network_with_limits(dk: DockerEnv) -> None:
    limits = ResourceLimits(memory_bytes=256 << 20, cpus=0.5, pids=64)
    async with (
        _backend(dk) as backend,
        open_sandbox(
            backend, dk.swe_image, limits=limits, metadata={"instance_id": "calc-1"}
        ) as sb,
    ):
        r = await sb.exec(
            "python3 -c 'import socket; print(socket.if_nameindex())'; git log --oneline | wc -l;"
            " cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes"
            " /sys/fs/cgroup/cpu/cpu.cfs_quota_us"
        )
        assert r.ok, r
        assert r.output.split("\n")[:5] == ["[(1, 'lo')]", "2", "64", str(256 << 20), "50000"]
        info = json.loads(dk.docker("inspect", sb.id))[0]
        assert info["Config"]["Labels"]["trio_swe.meta.instance_id"] == "calc-1"
        assert info["Config"]["Labels"]["trio_swe.owner"].split("/")[2] == str(os.getpid())
        assert backend.statistics().api_version == "1.41"
    # network=True still gets none: the backend's network_mode is "none" unless asked.
    async with _backend(dk) as backend, open_sandbox(backend, dk.base_image, network=True) as sb:
        r = await sb.exec("python3 -c 'import socket; print(len(socket.if_nameindex()))'")
        assert r.output == "1\n"


async def test_exec_files_users_and_timeouts(dk: DockerEnv) -> None:
    async with _backend(dk) as backend, open_sandbox(backend, dk.base_image) as sb:
        r = await sb.exec("printf out; printf err >&2; exit 7", env={"X": "y"})
        assert (r.exit_code, sorted(r.output)) == (7, sorted("outerr"))
        r = await sb.exec("kill -TERM $$")
        assert r.exit_code == 128 + signal.SIGTERM
        # A timeout kills everything the command started, background children included.
        r = await sb.exec("sleep 1234 & sleep 1235; wait", timeout=1)
        assert (r.exit_code, r.reason) == (-1, "timeout")
        r = await sb.exec("ps -eo args | grep -c '^sleep 123[45]'; true")
        assert r.output == "0\n"
        # Files: parents made as the writer, ownership and mode kept, symlinks followed.
        await sb.write_file("/tmp/a/b/c.txt", "é\n", user="agent", mode=0o640)
        r = await sb.exec("stat -c '%U %a' /tmp/a/b /tmp/a/b/c.txt; ln -s b/c.txt /tmp/a/l")
        assert r.output == "agent 755\nagent 640\n"
        assert await sb.read_file("/tmp/a/l") == "é\n".encode()
        with pytest.raises(SandboxFileNotFoundError):
            await sb.read_file("/tmp/a/missing")
        with pytest.raises(SandboxNotAFileError, match="a directory, not a regular file"):
            await sb.read_file("/tmp/a")
        with pytest.raises(InvalidArgumentError, match="nosuchuser"):
            await sb.exec("id", user="nosuchuser")
        big = os.urandom(3 << 20)
        await sb.write_file("/tmp/big", big)
        assert await sb.read_file("/tmp/big") == big
        # A user's write is the user's own (the kernel checks it: the archive API wrote
        # /etc/passwd for agent), the same bytes whatever their size, and leaves no stage.
        await sb.write_file("/tmp/a/big", big, user="agent")
        assert await sb.read_file("/tmp/a/big", user="agent") == big
        with pytest.raises(SandboxPermissionError):
            await sb.write_file("/etc/passwd", b"agent::0:0::/:/bin/sh\n", user="agent")
        for delay in (0.005, 0.02, 0.05, 0.1, 0.2):  # cancelled at points along the write
            with trio.move_on_after(delay):
                await sb.write_file("/tmp/a/cut", big, user="agent")
        r = await sb.exec("grep -c '^agent:' /etc/passwd; ls -a /tmp | grep -c trio_swe-write")
        assert r.output == "1\n0\n"
        assert (await sb.exec("echo s > /tmp/secret && chmod 600 /tmp/secret")).ok
        with pytest.raises(SandboxPermissionError):
            await sb.read_file("/tmp/secret", user="agent")


async def test_cancellation_at_random_points_leaves_no_container(dk: DockerEnv) -> None:
    rng = random.Random(1234)
    async with _backend(dk) as backend:
        for _ in range(8):
            with trio.move_on_after(rng.uniform(0.0, 1.5)):
                async with open_sandbox(backend, dk.swe_image) as sb:
                    await sb.exec("sleep 30")
        assert dk.own_containers() == []
        assert backend.statistics().live == 0


async def test_boot_limit_and_bad_images(dk: DockerEnv) -> None:
    async with _backend(dk, boot_timeout_sec=0.01) as backend:
        with pytest.raises(SandboxBootError, match="not up within"):
            async with open_sandbox(backend, dk.base_image):
                pass
    async with _backend(dk) as backend:
        with pytest.raises(SandboxBootError, match="nope"):
            async with open_sandbox(backend, f"{dk.registry}/nope:x"):
                pass
    async with DockerBackend(host=dk.docker_host) as backend:
        with pytest.raises(SandboxBootError, match="base_image"):
            async with open_sandbox(backend, "/tmp"):
                pass
    async with DockerBackend(host="unix:///nonexistent/docker.sock") as backend:
        with pytest.raises(BackendUnavailableError, match="nonexistent"):
            async with open_sandbox(backend, dk.base_image):
                pass


async def test_missing_image_is_pulled_with_progress(dk: DockerEnv) -> None:
    ref = f"{dk.registry}/trio-swe-test/pulled:{os.getpid()}"
    dk.docker("tag", dk.swe_image_b, ref)
    dk.docker("push", "-q", ref)
    dk.docker("rmi", ref)
    seen: list[tuple[str, int, int]] = []
    async with _backend(
        dk, on_pull_progress=lambda p: seen.append((p.status, p.current, p.total))
    ) as backend:
        async with open_sandbox(backend, ref) as sb:
            assert (await sb.read_file("/testbed/README")) == b"instance b\n"
        assert backend.statistics().pulls == 1
    assert seen
    assert seen[-1][0].startswith("Status:")
    dk.docker("rmi", ref)


async def test_docker_host_from_the_environment(
    dk: DockerEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", dk.docker_host)
    async with DockerBackend() as backend, open_sandbox(backend, dk.base_image) as sb:
        assert (await sb.exec("true")).ok


_CRASHER = textwrap.dedent(
    """\
    import os, sys, trio
    from trio_swe import open_sandbox
    from trio_swe.sandbox.docker import DockerBackend

    async def main():
        async with DockerBackend(host=sys.argv[1]) as b, open_sandbox(b, sys.argv[2]) as sb:
            print(sb.id, flush=True)
            await trio.sleep_forever()

    trio.run(main)
    """
)


async def test_containers_of_a_killed_process_are_swept(dk: DockerEnv, tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(_CRASHER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = await trio.lowlevel.open_process(
        [sys.executable, str(script), dk.docker_host, dk.base_image],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    out = b""
    while not out.endswith(b"\n"):
        chunk = await proc.stdout.receive_some(4096)
        assert chunk, "the crashing process died before booting"
        out += chunk
    cid = out.decode().strip()
    proc.send_signal(signal.SIGKILL)
    await proc.wait()
    await proc.stdout.aclose()
    assert cid in {c for c in dk.docker("ps", "-aq", "--no-trunc").split()}
    async with _backend(dk) as backend, open_sandbox(backend, dk.base_image):
        assert backend.statistics().swept >= 1
    assert cid not in {c for c in dk.docker("ps", "-aq", "--no-trunc").split()}
