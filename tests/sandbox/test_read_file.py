"""``read_file`` is bounded on every backend (the ``backend`` fixture; issue 9, item 3).

``/dev/zero`` once took +3.7 GB in 20 s and never returned; a FIFO blocked forever. Now: only
regular files unless ``special=True``, a cap (``max_bytes``, 64 MiB by default) with a typed
error past it, and cancellation at any point.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from trio_swe import (
    InvalidArgumentError,
    SandboxFileNotFoundError,
    SandboxFileTimeoutError,
    SandboxFileTooLargeError,
    SandboxNotAFileError,
    open_sandbox,
)
from trio_swe.sandbox import DEFAULT_READ_MAX_BYTES, Backend


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir(exist_ok=True)
    (img / "hello.txt").write_text("hello\n")
    return img


async def test_read_file_is_bounded(backend: Backend, image: Path) -> None:
    assert DEFAULT_READ_MAX_BYTES == 64 * 1024 * 1024
    async with open_sandbox(backend, str(image)) as sb:
        r = await sb.exec(
            "(mkfifo /tmp/fifo || mknod /tmp/fifo p) && head -c 3000 /dev/zero > /tmp/big && : > /tmp/empty && "
            "ln -s /testbed/hello.txt /tmp/link && ln -s /dev/zero /tmp/zero-link"
        )
        if not r.ok and backend.name == "docker" and "not found" in r.output:
            pytest.skip(f"the docker test image lacks a tool: {r.output.strip()}")
        assert r.ok, r.output
        with trio.fail_after(60):
            # Not regular files: refused without being opened (a FIFO would block).
            for path, kind in (("/dev/zero", "device"), ("/tmp/fifo", "fifo"), ("/tmp", "dir")):
                with pytest.raises(SandboxNotAFileError) as err:
                    await sb.read_file(path)
                assert err.value.path == path
                assert kind[:3] in err.value.kind or err.value.kind == "special file", err.value
            with pytest.raises(SandboxNotAFileError):
                await sb.read_file("/tmp/zero-link")  # a symlink to one is no better
            # Over the cap: a typed error naming the size.
            with pytest.raises(SandboxFileTooLargeError) as too_large:
                await sb.read_file("/tmp/big", max_bytes=2999)
            assert too_large.value.max_bytes == 2999
            assert too_large.value.size in (3000, None)
            assert await sb.read_file("/tmp/big", max_bytes=3000) == bytes(3000)
            assert await sb.read_file("/tmp/big", max_bytes=None) == bytes(3000)
            assert await sb.read_file("/tmp/empty", max_bytes=0) == b""
            assert await sb.read_file("/tmp/link") == b"hello\n"
            with pytest.raises(SandboxFileNotFoundError):
                await sb.read_file("/tmp/missing")
            for bad in (-1, 1.5, True, "10"):
                with pytest.raises(InvalidArgumentError, match="max_bytes"):
                    await sb.read_file("/tmp/big", max_bytes=bad)  # type: ignore[arg-type]
            # special=True reads a device too, still bounded (docker's archive API has no
            # device contents to give).
            if backend.name != "docker":
                with pytest.raises(SandboxFileTooLargeError):
                    await sb.read_file("/dev/zero", special=True, max_bytes=1 << 20)
        assert (await sb.exec("echo still here")).output == "still here\n"


async def test_reading_a_fifo_with_special_is_cancellable(tmp_path: Path) -> None:
    """On the local backend: a FIFO with no writer blocks, and cancelling ends it cleanly."""
    from trio_swe.sandbox.local import LocalBackend

    image = tmp_path / "image"
    image.mkdir()
    async with open_sandbox(LocalBackend(), str(image)) as sb:
        # Two FIFOs: a server may leave the abandoned read's reader blocked on the first one
        # (envd does), which would let a write to it through.
        assert (await sb.exec("mkfifo /tmp/fifo /tmp/fifo2")).ok
        with trio.move_on_after(1.0) as scope:
            await sb.read_file("/tmp/fifo", special=True)
        assert scope.cancelled_caught
        assert sb.statistics().live_processes == 0
        # With a writer, it is read like a file.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sb.exec, "printf piped > /tmp/fifo")
            assert await sb.read_file("/tmp/fifo", special=True) == b"piped"


async def test_reads_and_writes_that_block_end_in_a_typed_timeout(
    backend: Backend, image: Path
) -> None:
    """A file that blocks (a FIFO without a writer or a reader; ``/proc/kmsg``, regular and
    empty by its stat, whose read waits for kernel messages) ends in ``SandboxFileTimeoutError``
    at the call's ``timeout``, and the sandbox goes on working (issue 27, item 3)."""
    async with open_sandbox(backend, str(image)) as sb:
        # Two FIFOs: a server may leave the abandoned read's reader blocked on the first one
        # (envd does), which would let a write to it through.
        assert (await sb.exec("mkfifo /tmp/fifo /tmp/fifo2")).ok
        with trio.fail_after(60):
            with pytest.raises(SandboxFileTimeoutError) as err:
                await sb.read_file("/tmp/fifo", special=True, timeout=0.5)
            assert (err.value.path, err.value.op, err.value.timeout) == ("/tmp/fifo", "read", 0.5)
            with pytest.raises(SandboxFileTimeoutError) as err:
                await sb.write_file("/tmp/fifo2", b"nobody reads this", timeout=0.5)
            assert err.value.op == "write"
            # Root in the sandbox may read /proc/kmsg (a 0-byte regular file that blocks).
            if (await sb.exec("test -r /proc/kmsg && test -f /proc/kmsg")).ok:
                with pytest.raises(SandboxFileTimeoutError):
                    await sb.read_file("/proc/kmsg", timeout=0.5)
            for bad in (0, -1, True, "1"):
                with pytest.raises(InvalidArgumentError, match="timeout"):
                    await sb.read_file("/testbed/hello.txt", timeout=bad)  # type: ignore[arg-type]
            assert await sb.read_file("/testbed/hello.txt", timeout=None) == b"hello\n"
            assert (await sb.exec("echo still here")).output == "still here\n"
