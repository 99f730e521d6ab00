"""A body shorter than the file is an error, never the file (issue 27, item 7).

E2B's server cut a 3 GiB file's body at 1 GiB, cleanly; ``read_file(max_bytes=None)`` returned
the 1 GiB as the file, though its ``Stat`` had given the size. The test server cuts at a cap too
(``serve_max_bytes``), small here.
"""

from __future__ import annotations

import pytest

from trio_swe import SandboxError, SandboxFileTooLargeError, open_sandbox

from .helpers import open_server_and_backend


async def test_a_body_cut_short_is_an_error() -> None:
    async with (
        open_server_and_backend(serve_max_bytes=1000) as (_server, backend),
        open_sandbox(backend, "base") as sb,
    ):
        await sb.write_file("/tmp/big", b"x" * 4000)
        await sb.write_file("/tmp/small", b"y" * 1000)
        with pytest.raises(SandboxError, match="got 1000 of the 4000 bytes"):
            await sb.read_file("/tmp/big", max_bytes=None)
        with pytest.raises(SandboxError, match="got 1000 of the 4000 bytes"):
            await sb.read_file("/tmp/big", max_bytes=4000)
        # Over the caller's cap: known from the stat, before any body.
        with pytest.raises(SandboxFileTooLargeError):
            await sb.read_file("/tmp/big", max_bytes=3999)
        # Up to the server's cap, whole.
        assert await sb.read_file("/tmp/small", max_bytes=None) == b"y" * 1000
        # special=True has no stat to compare with: bounded by max_bytes only.
        assert len(await sb.read_file("/tmp/big", max_bytes=None, special=True)) == 1000
