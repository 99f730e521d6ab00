"""``trio-swe report``'s refusals, as a process: exit 2 and a message naming what is wrong."""

from __future__ import annotations

from pathlib import Path

import trio

from .runs import TRIO_SWE, env


async def _report(tmp_path: Path, *args: str) -> tuple[int, str]:
    done = await trio.run_process(
        [TRIO_SWE, "report", *args],
        env=env(tmp_path),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_a_missing_or_foreign_file_is_refused(tmp_path: Path) -> None:
    code, out = await _report(tmp_path, str(tmp_path / "nope.msgpack"))
    assert code == 2
    assert "does not exist" in out
    foreign = tmp_path / "rows.jsonl"
    foreign.write_text('{"instance_id": "x"}\n')
    code, out = await _report(tmp_path, str(foreign), "-o", str(tmp_path / "r.html"))
    assert code == 2
    assert "holds no results" in out
    assert not (tmp_path / "r.html").exists()
