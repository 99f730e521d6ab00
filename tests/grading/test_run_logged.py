"""``run_logged``: a graded script's whole log, inline in the wait's reply when it is small.

On the local backend and on the e2b backend (against the envd test server), through the Sandbox
protocol only. The log must be exactly the log file's content whichever way it came back, and
the script on disk must be the script given (a here-document must not expand or cut it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe.grading._run import INLINE_LOG_BYTES, read_text, run_logged
from trio_swe.sandbox import Backend, Sandbox, open_sandbox

from ..backends import BACKENDS

SCRIPT_PATH = "/tmp/trio_swe_eval/eval.sh"
LOG_PATH = "/tmp/trio_swe_eval/eval.log"


@pytest.fixture(params=["local", "e2b"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    (tmp_path / "image").mkdir()
    async with BACKENDS[request.param](tmp_path) as b:
        yield b


class _CountingReads:
    """Forwards to a real sandbox, counting its ``read_file`` calls."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb
        self.reads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sb, name)

    async def read_file(self, path: str, **kw: Any) -> bytes:
        self.reads.append(path)
        return await self._sb.read_file(path, **kw)


async def _run(backend: Backend, image: Path, script: str) -> tuple[Any, str, str, str, list[str]]:
    with trio.fail_after(120):  # a hang guard only
        async with open_sandbox(backend, str(image)) as real:
            sb = _CountingReads(real)
            run, log = await run_logged(
                sb,
                script,
                script_path=SCRIPT_PATH,
                log_path=LOG_PATH,
                budget_sec=60,
            )
            reads = list(sb.reads)
            on_disk = (await real.read_file(LOG_PATH, max_bytes=None)).decode("utf-8", "replace")
            written = (await real.read_file(SCRIPT_PATH)).decode()
            assert await read_text(real, LOG_PATH) == on_disk
    return run, log, on_disk, written, reads


# Quoting traps for the here-document: an EOF line of its own, an inner here-document,
# expansions that must stay literal in the file, a line that looks like our delimiter.
TRICKY = """#!/bin/bash
set -uxo pipefail
echo "out $HOME `echo sub`"
echo err >&2
cat <<'EOF'
inner $x \\n
EOF
TRIO_SWE_SCRIPT_
printf 'caf\\xc3\\xa9 \\xff\\n'
exit 3"""


async def test_a_small_log_comes_back_inline_and_whole(backend: Backend, tmp_path: Path) -> None:
    run, log, on_disk, written, reads = await _run(backend, tmp_path / "image", TRICKY)
    assert run.exit_code == 3  # the script's own status
    assert written == TRICKY + "\n"
    assert log == on_disk
    assert reads == []  # no read of the log: it came in the wait's reply
    # stdout and stderr in order, set -x traces included; expansions happened at run time only.
    lines = log.splitlines()
    assert lines.index("+ echo err") < lines.index("err") < lines.index("inner $x \\n")
    assert "TRIO_SWE_SCRIPT_" in log
    assert "caf\u00e9 \ufffd" in log  # invalid UTF-8 replaced, as read_text does


async def test_a_large_log_is_read_from_its_file(backend: Backend, tmp_path: Path) -> None:
    script = f"head -c {INLINE_LOG_BYTES + 1} /dev/zero | tr '\\0' x\necho\necho end\n"
    run, log, on_disk, _, reads = await _run(backend, tmp_path / "image", script)
    assert run.exit_code == 0
    assert log == on_disk
    assert log.endswith("x\nend\n")
    assert len(log) == INLINE_LOG_BYTES + 6
    assert reads == [LOG_PATH]


async def test_a_log_of_exactly_the_inline_size_comes_inline(
    backend: Backend, tmp_path: Path
) -> None:
    script = f"head -c {INLINE_LOG_BYTES} /dev/zero | tr '\\0' y\n"
    run, log, on_disk, _, reads = await _run(backend, tmp_path / "image", script)
    assert (run.exit_code, log, reads) == (0, on_disk, [])
    assert len(log) == INLINE_LOG_BYTES


async def test_an_empty_log(backend: Backend, tmp_path: Path) -> None:
    run, log, on_disk, _, _ = await _run(backend, tmp_path / "image", "exit 0\n")
    assert (run.exit_code, log, on_disk) == (0, "", "")
