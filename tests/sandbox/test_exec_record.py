"""The plain exec record's scripts (issue 27, item 6), run for real on this host.

The wrapper claims a record, runs the command exactly as ``/bin/sh -c`` would, and appends its
done marker; the settle script fences a record nobody claimed, or reports the claimed one. Both
run under every ``sh`` found here (dash and bash when present), in a temporary base directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from trio_swe import InvalidArgumentError, SandboxError
from trio_swe.sandbox import _launcher as L

SHELLS = [s for s in ("/bin/sh", shutil.which("dash"), shutil.which("bash")) if s]
USER = "tester"


@pytest.fixture(params=sorted(set(SHELLS)))
def sh(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def base(tmp_path: Path) -> str:
    return str(tmp_path / "rec")


def wrap(
    sh: str, base: str, nonce: str, cmd: str, cwd: str | None = None, **kw: object
) -> subprocess.CompletedProcess[str]:
    script = L.exec_record_wrapper(nonce, USER, base=base, **kw)  # type: ignore[arg-type]
    return subprocess.run(
        [sh, "-c", script, "/bin/sh", cmd],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd or base.rsplit("/", 1)[0],  # the test's own directory, for what commands write
    )


def settle(sh: str, base: str, nonce: str) -> tuple[str, int | None]:
    out = subprocess.run(
        [sh, "-c", L.exec_settle_script(nonce, USER, base=base)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out
    return L.parse_exec_settle(out.stdout, nonce=nonce)


def nonce() -> str:
    return uuid.uuid4().hex


def test_wrapper_runs_the_command_as_sh_c_and_records_its_status(sh: str, base: str) -> None:
    n = nonce()
    res = wrap(sh, base, n, 'echo "$0 [$*]"; echo err >&2; exit 7')
    assert (res.returncode, res.stdout, res.stderr) == (7, "/bin/sh []\n", "err\n")
    assert settle(sh, base, n) == ("done", 7)
    assert os.stat(L.exec_record_dir(USER, base)).st_mode & 0o777 == 0o700


def test_wrapper_leaves_the_environment_and_options_alone(sh: str, base: str) -> None:
    # Names the scripts might use, exported by the caller, reach the command unchanged, and the
    # wrapper's noclobber does not leak into it.
    env = {"PATH": os.environ["PATH"], "p": "P", "m": "M", "s": "S", "r": "R"}
    cmd = 'echo "$p$m$s$r"; echo x > f; echo y > f; cat f'
    res = subprocess.run(
        [sh, "-c", L.exec_record_wrapper(nonce(), USER, base=base), "/bin/sh", cmd],
        capture_output=True,
        text=True,
        env=env,
        cwd=base.rsplit("/", 1)[0],
        timeout=30,
    )
    assert (res.returncode, res.stdout) == (0, "PMSR\ny\n")


def test_a_record_runs_once(sh: str, base: str) -> None:
    n = nonce()
    assert wrap(sh, base, n, "echo once >> log; exit 3").returncode == 3
    again = wrap(sh, base, n, "echo twice >> log")
    assert again.returncode == L.EXEC_FENCED_STATUS
    assert "not run again" in again.stderr
    assert settle(sh, base, n) == ("done", 3)


def test_a_fenced_record_never_runs(sh: str, base: str, tmp_path: Path) -> None:
    n = nonce()
    assert settle(sh, base, n) == ("fenced", None)
    assert settle(sh, base, n) == ("fenced", None)  # replay-safe
    log = tmp_path / "log"
    late = wrap(sh, base, n, f"echo ran >> {log}")
    assert late.returncode == L.EXEC_FENCED_STATUS
    assert not log.exists()
    assert settle(sh, base, n) == ("fenced", None)


def test_running_then_done(sh: str, base: str) -> None:
    n = nonce()
    script = L.exec_record_wrapper(n, USER, base=base)
    proc = subprocess.Popen([sh, "-c", script, "/bin/sh", "sleep 0.6; exit 4"])
    try:
        rec = Path(L.exec_record_path(n, USER, base))
        deadline = time.monotonic() + 10
        while not (rec.exists() and rec.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert settle(sh, base, n) == ("running", None)
    finally:
        assert proc.wait(timeout=30) == 4
    assert settle(sh, base, n) == ("done", 4)


def test_a_wrapper_killed_before_its_marker_is_lost(sh: str, base: str) -> None:
    n = nonce()
    script = L.exec_record_wrapper(n, USER, base=base)
    proc = subprocess.Popen([sh, "-c", script, "/bin/sh", "sleep 30"], start_new_session=True)
    rec = Path(L.exec_record_path(n, USER, base))
    deadline = time.monotonic() + 10
    while not (rec.exists() and rec.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert settle(sh, base, n) == ("lost", None)


def test_unwritable_base_runs_the_command_without_record(sh: str, tmp_path: Path) -> None:
    base = str(tmp_path / "no" / "such" / "file" / "rec")
    (tmp_path / "no").write_text("a file, not a directory")
    n = nonce()
    res = wrap(sh, base, n, "exit 6", cwd=str(tmp_path))
    assert res.returncode == 6  # bookkeeping never stops the command
    assert settle(sh, base, n) == ("gone", None)


def test_finished_records_are_removed_by_a_later_wrapper(sh: str, base: str) -> None:
    old = [nonce() for _ in range(3)]
    for n in old:
        assert wrap(sh, base, n, "true").returncode == 0
    n = nonce()
    assert wrap(sh, base, n, "true", clean=tuple(old)).returncode == 0
    assert sorted(os.listdir(L.exec_record_dir(USER, base))) == [n]


def test_bad_names_and_replies_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        L.exec_record_wrapper("../x", USER)
    with pytest.raises(InvalidArgumentError):
        L.exec_settle_script(nonce(), "Bad User")
    n = nonce()
    with pytest.raises(SandboxError):
        L.parse_exec_settle("", nonce=n)
    with pytest.raises(SandboxError):
        L.parse_exec_settle(f"TRIO_SWE done {nonce()} 3\n", nonce=n)  # another call's marker
    with pytest.raises(SandboxError):
        L.parse_exec_settle("TRIO_SWE started 12\n", nonce=n)
