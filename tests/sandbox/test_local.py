"""The local backend: real bubblewrap sandboxes, real processes, real git repositories."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from trio_swe import (
    BackendUnavailableError,
    InvalidArgumentError,
    SandboxBootError,
    SandboxFileNotFoundError,
    SandboxNotRunningError,
    open_sandbox,
)
from trio_swe.sandbox.local import LocalBackend, LocalSandbox

from ..conftest import GitRepoFactory, git, host_pids_gone, host_pids_with


def host_mounts_with(fragment: str) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if fragment in line]


def _until_running(pattern: str, count: int = 1) -> str:
    """Shell that waits until ``count`` daemons named ``pattern`` run in sessions of their own.

    The exec's process group is killed when it returns, so a daemon that has not reached
    ``setsid`` by then dies with it: the exec must not return before the daemons are out.
    """
    return f"until [ \"$(pgrep -f '^{pattern}' | wc -l)\" -ge {count} ]; do :; done"


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir()
    (img / "hello.txt").write_text("hello\n")
    return img


async def test_exec_exit_codes_users_and_env(image: Path) -> None:
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        for code in (0, 1, 7, 255):
            result = await sb.exec(f"exit {code}")
            assert (result.exit_code, result.reason) == (code, "exit")
        result = await sb.exec("cat hello.txt; pwd")
        assert result.output == "hello\n/testbed\n"
        killed = await sb.exec("kill -9 $$")
        assert (killed.exit_code, killed.reason) == (137, "signal")
        who = await sb.exec("id -un; echo $HOME", user="agent")
        assert who.output == "agent\n/home/agent\n"
        literal = 'it\'s "quoted" $(touch /tmp/pwned) `x` \n newline ü'
        echoed = await sb.exec('printf %s "$V"; test ! -e /tmp/pwned', env={"V": literal})
        assert echoed.output == literal
        assert echoed.exit_code == 0
        in_tmp = await sb.exec("pwd", cwd="/tmp")
        assert in_tmp.output == "/tmp\n"


async def test_bad_arguments_are_refused_before_running(image: Path) -> None:
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        with pytest.raises(InvalidArgumentError, match="environment variable name"):
            await sb.exec("true", env={"BAD NAME": "x"})
        with pytest.raises(InvalidArgumentError, match="unknown user"):
            await sb.exec("true", user="nobody2")
        with pytest.raises(InvalidArgumentError, match="absolute path"):
            await sb.read_file("relative/path")
        with pytest.raises(InvalidArgumentError, match="newline"):
            await sb.write_file("/tmp/a\nb", b"x")


async def test_files_round_trip_and_missing_file_raises(image: Path) -> None:
    payload = bytes(range(256)) * 100
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        await sb.write_file("/tmp/deep/dir/blob.bin", payload, mode=0o640)
        assert await sb.read_file("/tmp/deep/dir/blob.bin") == payload
        mode = await sb.exec("stat -c %a /tmp/deep/dir/blob.bin")
        assert mode.output.strip() == "640"
        await sb.write_file("/home/agent/note.txt", "by agent", user="agent")
        owner = await sb.exec("stat -c %U /home/agent/note.txt")
        assert owner.output.strip() == "agent"
        assert await sb.read_file("/testbed/hello.txt") == b"hello\n"
        await sb.write_file("/tmp/empty", b"")
        assert await sb.read_file("/tmp/empty") == b""
        with pytest.raises(SandboxFileNotFoundError):
            await sb.read_file("/testbed/missing.txt")


async def test_writes_never_reach_the_image_and_sandboxes_are_isolated(image: Path) -> None:
    backend = LocalBackend()
    async with open_sandbox(backend, str(image)) as a, open_sandbox(backend, str(image)) as b:
        await a.exec("echo from-a > hello.txt && echo new > only-a.txt && rm -f gone.txt")
        assert (await b.exec("cat hello.txt")).output == "hello\n"
        assert (await b.exec("test -e only-a.txt")).exit_code == 1
        assert (await a.exec("cat hello.txt")).output == "from-a\n"
        assert a.statistics().workspace_mode in ("overlay", "copy")
    assert (image / "hello.txt").read_text() == "hello\n"
    assert sorted(os.listdir(image)) == ["hello.txt"]


async def test_copy_workspace_mode(image: Path, tmp_path: Path) -> None:
    backend = LocalBackend(workspace="copy", state_dir=tmp_path / "state")
    async with open_sandbox(backend, str(image)) as sb:
        await sb.exec("echo changed > hello.txt")
        assert sb.statistics().workspace_mode == "copy"
    assert (image / "hello.txt").read_text() == "hello\n"
    assert backend.statistics().workspace_mode == "copy"


async def test_git_image_at_commit(make_git_repo: GitRepoFactory) -> None:
    repo, first = make_git_repo({"pkg/mod.py": "VALUE = 1\n"})
    (repo / "pkg/mod.py").write_text("VALUE = 2\n")
    git(repo, "commit", "-qam", "second")
    async with open_sandbox(LocalBackend(), f"{repo}@{first}") as sb:
        assert (await sb.exec("cat pkg/mod.py")).output == "VALUE = 1\n"
        head = await sb.exec("git rev-parse HEAD && git status --porcelain", user="agent")
        assert head.output == f"{first}\n"
    with pytest.raises(SandboxBootError, match="git"):
        async with open_sandbox(LocalBackend(), f"{repo}@no-such-commit"):
            pass


async def test_checkouts_of_many_commits_keep_no_lock(make_git_repo: GitRepoFactory) -> None:
    """A checkout is built under a lock per image; the lock goes when its boot is done (a run
    of days meets thousands of images)."""
    repo, first = make_git_repo({"v.txt": "0\n"})
    commits = [first]
    for i in range(1, 4):
        (repo / "v.txt").write_text(f"{i}\n")
        git(repo, "commit", "-qam", f"commit {i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    backend = LocalBackend()
    async with trio.open_nursery() as nursery:  # two boots of each image at once
        for commit in commits * 2:
            nursery.start_soon(_read_version, backend, f"{repo}@{commit}")
    assert len(backend._images._locks) == 0
    assert backend.statistics().created == 8


async def _read_version(backend: LocalBackend, image: str) -> None:
    async with open_sandbox(backend, image) as sb:
        assert (await sb.exec("cat v.txt")).ok


async def test_kill_removes_daemons_mounts_and_state(image: Path, tmp_path: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    state = tmp_path / "state"
    backend = LocalBackend(state_dir=state)
    async with open_sandbox(backend, str(image)) as sb:
        # `exec -a` names each daemon by the marker; every daemon is one process from fork to
        # sleep, so no transient forked copy of a shell is ever counted.
        spawn = await sb.exec(
            f"setsid bash -c 'exec -a {marker}-a sleep 1000' </dev/null >/dev/null 2>&1 & "
            f"(setsid nohup bash -c 'exec -a {marker}-b sleep 1001' </dev/null >/dev/null 2>&1 &)"
            f"; {_until_running(f'{marker}-[ab]', 2)}; echo started",
            timeout=30,
        )
        assert spawn.output == "started\n"
        daemons = await sb.exec(f"pgrep -f '^{marker}-[ab]' | wc -l")
        assert daemons.output.strip() == "2"
        assert len(host_pids_with(marker)) == 2
    assert await host_pids_gone(marker) == []
    assert host_mounts_with(str(state)) == []
    assert [p.name for p in state.iterdir() if p.name.startswith("sb-")] == []
    with pytest.raises(SandboxNotRunningError):
        await sb.exec("true")
    await sb.kill()  # killing twice is fine
    # The state directory went to the trash at once; closing the backend waits for its removal.
    await backend.aclose()
    assert backend.statistics().removals_pending == 0
    assert list((state / "trash").iterdir()) == []


async def test_exec_timeout_kills_the_command(image: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        result = await sb.exec(f"sleep 1000; echo never {marker}", timeout=0.3)
        assert (result.exit_code, result.reason) == (-1, "timeout")
        # Killed (it would sleep 1000 s): gone once the kernel has torn it down.
        assert await host_pids_gone(marker) == []


async def test_network_off(image: Path) -> None:
    async with open_sandbox(LocalBackend(), str(image), network=False) as sb:
        devices = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        assert devices.output.split() == ["lo"]


async def test_keyboard_interrupt_kills_sandbox(image: Path, tmp_path: Path) -> None:
    marker = f"marker-{uuid.uuid4().hex}"
    state = tmp_path / "state"
    with pytest.raises(KeyboardInterrupt):
        async with open_sandbox(LocalBackend(state_dir=state), str(image)) as sb:
            await sb.exec(
                f"setsid bash -c 'exec -a {marker} sleep 1000' </dev/null >/dev/null 2>&1 & "
                + _until_running(marker),
                timeout=30,
            )
            assert len(host_pids_with(marker)) == 1
            raise KeyboardInterrupt
    assert await host_pids_gone(marker) == []
    assert [p.name for p in state.iterdir() if p.name.startswith("sb-")] == []


async def test_cancellation_at_random_points_leaves_nothing(image: Path, tmp_path: Path) -> None:
    """100 sandboxes cancelled at random moments, four at a time on one backend."""
    state = tmp_path / "state"
    backend = LocalBackend(state_dir=state)
    marker = f"marker-{uuid.uuid4().hex}"

    async def cancel_repeatedly(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(25):
            with trio.move_on_after(rng.uniform(0, 0.15)):
                async with open_sandbox(backend, str(image)) as sb:
                    await sb.exec(
                        f"setsid sh -c 'sleep 1000; : {marker}' </dev/null >/dev/null 2>&1 &"
                    )
                    await sb.exec(f"sleep 1000; : {marker}")

    async with trio.open_nursery() as nursery:
        for seed in range(1234, 1238):
            nursery.start_soon(cancel_repeatedly, seed)
    assert await host_pids_gone(marker) == []
    assert await host_pids_gone(str(state)) == []
    assert host_mounts_with(str(state)) == []
    assert [p.name for p in state.iterdir() if p.name.startswith("sb-")] == []
    stats = backend.statistics()
    assert stats.live == 0
    assert stats.created == stats.killed
    await backend.aclose()
    assert list((state / "trash").iterdir()) == []


async def test_missing_bwrap_names_the_package(
    image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BackendUnavailableError, match="bubblewrap"):
        async with open_sandbox(LocalBackend(), str(image)):
            pass


async def test_extra_path_and_ro_binds(image: Path, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho mytool-ran\n")
    (tools / "mytool").chmod(0o755)
    shim = tmp_path / "activate"
    shim.write_text("echo activated\n")
    backend = LocalBackend(
        extra_path=[str(tools)], ro_binds={"/opt/miniconda3/bin/activate": str(shim)}
    )
    async with open_sandbox(backend, str(image)) as sb:
        assert (await sb.exec("mytool")).output == "mytool-ran\n"
        assert (await sb.exec(". /opt/miniconda3/bin/activate")).output == "activated\n"
        assert (await sb.exec("echo x > /opt/miniconda3/bin/activate")).exit_code != 0


async def test_tmp_is_shared_sticky_and_agent_writable(image: Path) -> None:
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        assert (await sb.exec("stat -c %a /tmp")).output.strip() == "1777"
        assert (await sb.exec("mkdir /tmp/mine && touch /tmp/mine/f", user="agent")).ok


async def test_sandbox_outlives_idle_worker_threads(image: Path) -> None:
    """trio forks from worker threads that exit after ~10 s idle; the sandbox must not care."""
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        result = await sb.exec("sleep 12; echo alive", timeout=30)
        assert result.output == "alive\n"


async def test_sandbox_dies_with_its_owner_process(image: Path, tmp_path: Path) -> None:
    """Even SIGKILL of the owning Python process leaves no sandbox process behind."""
    marker = f"marker-{uuid.uuid4().hex}"
    daemon_cmd = (
        f"setsid bash -c 'exec -a {marker} sleep 1000' </dev/null >/dev/null 2>&1 & "
        + _until_running(marker)
    )
    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, trio\n"
        "from trio_swe import open_sandbox\n"
        "from trio_swe.sandbox.local import LocalBackend\n"
        "async def main():\n"
        f"    async with open_sandbox(LocalBackend(), {str(image)!r}) as sb:\n"
        # One process carries the marker from fork to sleep (exec, setsid and exec -a keep the
        # pid), so the test never catches a transient forked copy of a shell.
        f"        await sb.exec({daemon_cmd!r}, timeout=30)\n"
        "        print('up', flush=True)\n"
        "        await trio.sleep_forever()\n"
        "trio.run(main)\n"
    )
    owner = await trio.lowlevel.open_process([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert owner.stdout is not None
        seen = b""
        while not seen.endswith(b"\n"):
            seen += await owner.stdout.receive_some(16)
        assert seen == b"up\n"
        [daemon] = host_pids_with(marker)
        daemon_fd = os.pidfd_open(daemon)
        try:
            owner.kill()
            await owner.wait()
            with trio.fail_after(30):  # a pidfd turns readable when its process exits
                await trio.lowlevel.wait_readable(daemon_fd)
        finally:
            os.close(daemon_fd)
    finally:  # never leave the owner (and its sandbox) behind, even when an assert fails
        if owner.returncode is None:
            owner.kill()
        await owner.wait()
        if owner.stdout is not None:
            await owner.stdout.aclose()
    assert await host_pids_gone(marker) == []


async def test_start_process_streams_and_forgets_closed_processes(image: Path) -> None:
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        assert isinstance(sb, LocalSandbox)
        for _ in range(5):
            proc = await sb.start_process(["/bin/sh", "-c", "cat; echo err >&2"], stdin=True)
            assert proc.stdin is not None
            assert proc.stdout is not None
            assert proc.stderr is not None
            await proc.stdin.send_all(b"ping")
            await proc.stdin.aclose()
            assert await proc.stdout.receive_some(100) == b"ping"
            assert await proc.stderr.receive_some(100) == b"err\n"
            assert await proc.wait() == 0
            await proc.aclose()
        assert sb.statistics().live_processes == 0
        sleeper = await sb.start_process(["sleep", "1000"])
        sleeper.send_signal(15)
        assert await sleeper.wait() == -15
        await sleeper.aclose()


async def test_read_file_returns_large_files_whole(image: Path) -> None:
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        await sb.exec(
            "head -c 9437184 /dev/urandom > /tmp/big && sha256sum /tmp/big > /tmp/big.sum"
        )
        data = await sb.read_file("/tmp/big")
        assert len(data) == 9 * 1024 * 1024
        expected = (await sb.read_file("/tmp/big.sum")).split()[0].decode()
        assert hashlib.sha256(data).hexdigest() == expected


async def test_state_removal_runs_before_the_process_exits(image: Path, tmp_path: Path) -> None:
    """The kill moves the state directory to the trash and removes it in the background; a
    process that exits right after its last kill still leaves nothing behind."""
    state = tmp_path / "state"
    script = tmp_path / "owner.py"
    script.write_text(
        "import trio\n"
        "from trio_swe import open_sandbox\n"
        "from trio_swe.sandbox.local import LocalBackend\n"
        "async def main():\n"
        f"    backend = LocalBackend(state_dir={str(state)!r})\n"
        "    for _ in range(3):\n"
        f"        async with open_sandbox(backend, {str(image)!r}) as sb:\n"
        # Many files in the overlay's upper layer and in root's home: a removal that takes a
        # while, still queued or running when the process starts to exit.
        "            r = await sb.exec('mkdir -p d ~/d && for i in $(seq 300); do : > d/$i;"
        " : > ~/d/$i; done', timeout=60)\n"
        "            assert r.ok, r.output\n"
        "trio.run(main)\n"
    )
    with trio.fail_after(120):  # a hang guard only
        done = await trio.run_process(
            [sys.executable, str(script)], capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    assert [p.name for p in state.iterdir() if p.name.startswith("sb-")] == []
    assert list((state / "trash").iterdir()) == []


def _pid_of_nobody() -> int:
    return int(Path("/proc/sys/kernel/pid_max").read_text())  # pids stay below it


async def test_trash_of_a_dead_process_is_swept_at_start(image: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    dead_pid = _pid_of_nobody()
    stale = state / "trash" / f"sb-{dead_pid}-0-abcdef"
    (stale / "upper").mkdir(parents=True)
    (stale / "upper" / "f").write_text("left by a SIGKILLed owner")
    mine = state / "trash" / f"sb-{os.getpid()}-99-abcdef"
    mine.mkdir()  # this process's own (a removal in flight): not the sweep's to take
    backend = LocalBackend(state_dir=state)
    async with open_sandbox(backend, str(image)):
        pass
    await backend.aclose()
    assert sorted(p.name for p in (state / "trash").iterdir()) == [mine.name]


async def test_passwd_and_group_are_shared_files_rewritten_if_removed(
    image: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    backend = LocalBackend(state_dir=state)
    for attempt in range(2):
        async with open_sandbox(backend, str(image)) as a, open_sandbox(backend, str(image)) as b:
            for sb in (a, b):
                users = await sb.exec("getent passwd agent root | cut -d: -f1; id -gn agent")
                assert users.output == "agent\nroot\nagent\n"
            (shared,) = [p for p in (state / "shared").iterdir() if p.name.startswith("passwd-")]
            assert "\nagent:x:" in shared.read_text()
        if attempt == 0:  # removed behind the backend's back: the next boot writes it again
            for p in (state / "shared").iterdir():
                p.unlink()
    await backend.aclose()
