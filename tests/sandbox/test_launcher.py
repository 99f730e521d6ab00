"""The sans-IO detached-execution core: script builders and reply parsers.

The scripts are run for real, with plain subprocesses on this host in a temporary directory
(``base_dir``), under dash and under a PATH without flock(1) to exercise the fallback. Leak
checks look for this test's own processes only (by a unique token or the call's nonce).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_swe import InvalidArgumentError, SandboxError
from trio_swe.sandbox import _launcher as L

# Tools the scripts use; the no-flock PATH links all of them but flock.
_TOOLS = [
    "sh",
    "bash",
    "setsid",
    "ln",
    "readlink",
    "mv",
    "rm",
    "cat",
    "tail",
    "wc",
    "sleep",
    "grep",
    "sed",
    "sort",
    "tr",
    "env",
    "ls",
    "mkdir",
    "printf",
    "kill",
    "true",
]


@pytest.fixture
def base(tmp_path: Path) -> str:
    return str(tmp_path / "b")


@pytest.fixture(params=["flock", "noflock"])
def path_env(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "flock":
        return os.environ["PATH"]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in _TOOLS:
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    assert shutil.which("flock", path=str(bindir)) is None
    return str(bindir)


class Host:
    """Runs one call's scripts on the host, as ``Sandbox.exec`` would in a sandbox."""

    def __init__(self, plan: L.Plan, path: str) -> None:
        self.plan = plan
        self.path = path
        os.makedirs(plan.dir, exist_ok=True)
        Path(plan.cmd_path).write_bytes(plan.command_file)

    def run(self, script: str, timeout: float = 30) -> L.Reply:
        proc = subprocess.run(
            ["sh", "-c", script],
            capture_output=True,
            cwd="/",
            timeout=timeout,
            env={"PATH": self.path, "HOME": "/root"},
        )
        assert proc.returncode == 0, proc.stderr
        return L.parse_reply(proc.stdout.decode("utf-8", "replace"))

    def spawn(self) -> L.Reply:
        return self.run(L.spawn_script(self.plan))

    def wait(self, wait_sec: float = 10, **kw: object) -> L.Reply:
        return self.run(L.wait_script(self.plan, wait_sec=wait_sec, **kw))  # type: ignore[arg-type]

    def kill(self, remove: bool = True) -> L.Reply:
        return self.run(L.kill_script(self.plan, remove=remove))


def host_pids_with(token: str) -> list[int]:
    """Live (non-zombie) host pids whose command line or environment contains ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                if f.read().rsplit(b") ", 1)[1][:1] in b"ZX":
                    continue
            blob = b""
            for name in ("cmdline", "environ"):
                with open(f"/proc/{entry}/{name}", "rb") as f:
                    blob += f.read()
        except (OSError, IndexError):
            continue
        if token.encode() in blob:
            found.append(int(entry))
    return found


@pytest.fixture
def token() -> Iterator[str]:
    tok = f"tok{uuid.uuid4().hex}"
    yield tok
    for pid in host_pids_with(tok):  # never leave our own processes behind, even on failure
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def plan(cmd: str, base: str, tmp_path: Path, **kw: object) -> L.Plan:
    return L.make_plan(cmd, workdir=str(tmp_path), base_dir=base, **kw)  # type: ignore[arg-type]


# -- pure parts --------------------------------------------------------------------------------


def test_parse_reply_header_fields_and_tail() -> None:
    r = L.parse_reply("TRIO_SWE done abc 7 12\nline1\nline2\n")
    assert (r.state, r.fields, r.tail) == ("done", ("abc", "7", "12"), "line1\nline2\n")
    # Noise before the header (a backend banner) is skipped; "TRIO_SWE" mid-line is not a header.
    r = L.parse_reply("motd x TRIO_SWE gone\nTRIO_SWE running\n")
    assert (r.state, r.fields, r.tail) == ("running", (), "")
    for bad in ("", "hello\n", "TRIO_SWE\n", "TRIO_SWE bogus 1\n", "xTRIO_SWE done\n"):
        with pytest.raises(SandboxError):
            L.parse_reply(bad)


def test_parse_marker_and_done() -> None:
    assert L.parse_marker("n1", "0", nonce="n1") == 0
    assert L.parse_marker("n1", "255", nonce="n1") == 255
    with pytest.raises(SandboxError, match="another call"):
        L.parse_marker("n2", "0", nonce="n1")
    # Digits beyond ASCII pass str.isdigit(): "²" made int() raise ValueError, "١٢" read as 12.
    for bad in ("", "-1", "x", "1.5", "²", "١٢"):
        with pytest.raises(SandboxError):
            L.parse_marker("n1", bad, nonce="n1")
    for size in ("²", "١٢"):
        with pytest.raises(SandboxError):
            L.parse_done(L.parse_reply(f"TRIO_SWE done n1 0 {size}\n"), nonce="n1")
    reply = L.parse_reply("TRIO_SWE done n1 3 99\n")
    assert L.parse_done(reply, nonce="n1") == (3, 99)
    with pytest.raises(SandboxError):
        L.parse_done(L.parse_reply("TRIO_SWE done n1 3\n"), nonce="n1")
    assert L.parse_killed(L.parse_reply("TRIO_SWE killed 0 5\nabc")) == (0, 5)


def test_make_plan_validates_and_isolates(tmp_path: Path) -> None:
    a = L.make_plan("true", workdir="/w")
    b = L.make_plan("true", workdir="/w")
    assert a.tag != b.tag
    assert a.nonce != b.nonce
    assert a.dir != b.dir
    assert a.dir == f"{L.BASE_DIR}/{a.tag}"
    c = L.make_plan("true", workdir="/w", tag="run", user="agent")
    d = L.make_plan("true", workdir="/w", tag="run", user="agent")
    assert c.dir == d.dir == f"{L.BASE_DIR}.agent/run"
    assert c.nonce != d.nonce
    assert c.cmd_path != d.cmd_path  # same tag: the command files still never collide
    bad: list[dict[str, object]] = [
        {"tag": "../x"},
        {"tag": "a b"},
        {"tag": ""},
        {"tag": "$(id)"},
        {"user": "Root;"},
        {"env": {"A B": "x"}},
        {"env": {"A": "x\x00"}},
        {"env": {L.RUN_ENV: "x"}},
        {"workdir": "relative"},
        {"workdir": "/a\nb"},
    ]
    for kw in bad:
        kw.setdefault("workdir", "/w")
        with pytest.raises(InvalidArgumentError):
            L.make_plan("true", **kw)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="NUL"):
        L.make_plan("echo \x00", workdir="/w")
    with pytest.raises(InvalidArgumentError):
        L.make_plan("echo \ud800", workdir="/w")
    for bad_budget in (-1, float("nan"), "3", True):
        with pytest.raises(InvalidArgumentError):
            L.check_budget(bad_budget, "x")  # type: ignore[arg-type]


def test_scripts_fill_every_placeholder() -> None:
    plain = L.make_plan("true", workdir="/w", env={"A": "b"})
    for script in (
        L.spawn_script(plain),
        L.wait_script(plain, wait_sec=1),
        L.kill_script(plain, remove=True),
        L.cleanup_script(plain),
    ):
        assert re.search(r"@[A-Z_]+@", script) is None
    # A value that looks like a placeholder is kept literally (one-pass substitution).
    odd = L.make_plan("true", workdir="/we@DIR@ird@NONCE@")
    assert "( cd /we@DIR@ird@NONCE@ )" in L.spawn_script(odd)


# -- the scripts, run for real ------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 7, 255])
def test_spawn_wait_reports_exit_status(
    code: int, base: str, tmp_path: Path, path_env: str
) -> None:
    h = Host(plan(f"echo out; echo err >&2; exit {code}", base, tmp_path), path_env)
    started = h.spawn()
    assert started.state == "started"
    assert started.fields[0].isdigit()
    reply = h.wait()
    status, size = L.parse_done(reply, nonce=h.plan.nonce)
    assert (status, size) == (code, len("out\nerr\n"))
    # The tail comes only for failures by default; "always" forces it.
    assert reply.tail == ("" if code == 0 else "out\nerr\n")
    assert h.wait(tail_when="always").tail == "out\nerr\n"
    assert h.wait(tail_when="never").tail == ""
    assert not os.path.exists(os.path.join(h.plan.dir, "done.tmp"))  # renamed, not left
    subprocess.run(["sh", "-c", L.cleanup_script(h.plan)], check=True)
    assert not os.path.exists(h.plan.dir)


def test_signal_death_and_multiline_status(base: str, tmp_path: Path) -> None:
    h = Host(plan("kill -9 $$", base, tmp_path), os.environ["PATH"])
    h.spawn()
    reply = h.wait()
    assert L.parse_done(reply, nonce=h.plan.nonce)[0] == 137
    assert "Killed" not in reply.tail  # no shell job report in the output
    h2 = Host(plan("false\nexit 5\necho never", base, tmp_path), os.environ["PATH"])
    h2.spawn()
    assert L.parse_done(h2.wait(), nonce=h2.plan.nonce)[0] == 5


def test_command_sees_sigint_default_stdin_null_and_env(base: str, tmp_path: Path) -> None:
    """sh ignores SIGINT in background jobs; the launcher must not pass that on."""
    cmd = 'grep -E "^SigIgn" /proc/self/status; read x; echo "read=$?"; echo "run=${TRIO_SWE_RUN}"'
    h = Host(plan(cmd, base, tmp_path), os.environ["PATH"])
    h.spawn()
    tail = h.wait(tail_when="always").tail
    sigign = int(tail.split()[1], 16)
    assert not sigign & (1 << (signal.SIGINT - 1)), tail
    assert not sigign & (1 << (signal.SIGQUIT - 1)), tail
    assert "read=1" in tail  # stdin is /dev/null: EOF at once
    assert f"run={h.plan.nonce}" in tail


def test_a_setsid_without_f_falls_back_once(base: str, tmp_path: Path, path_env: str) -> None:
    """An old setsid refuses ``-f`` (util-linux before 2.31, busybox): the spawn starts the
    launcher with ``&`` instead, once, and the refusal is not in the command's output."""
    bindir = tmp_path / "oldsetsid"
    bindir.mkdir()
    calls = tmp_path / "setsid-calls"
    real = shutil.which("setsid", path=path_env)
    assert real is not None
    old = bindir / "setsid"
    old.write_text(
        "#!/bin/sh\n"
        f'echo "call $1" >> {calls}\n'
        'if [ "$1" = -f ]; then echo "setsid: invalid option -- \'f\'" >&2; exit 1; fi\n'
        f'exec {real} "$@"\n'
    )
    old.chmod(0o755)
    count = tmp_path / "count"
    h = Host(plan(f"echo ran >> {count}; echo out; exit 3", base, tmp_path), f"{bindir}:{path_env}")
    assert h.spawn().state == "started"
    reply = h.wait(tail_when="always")
    assert L.parse_done(reply, nonce=h.plan.nonce) == (3, len("out\n"))
    assert reply.tail == "out\n"
    assert count.read_text() == "ran\n"
    assert calls.read_text() == "call -f\ncall bash\n"
    assert h.spawn().state == "replay"


def test_replayed_spawn_runs_once(base: str, tmp_path: Path, path_env: str) -> None:
    count = tmp_path / "count"
    h = Host(plan(f"echo x >> {count}", base, tmp_path), path_env)
    assert h.spawn().state == "started"
    assert h.spawn().state == "replay"
    assert h.wait().state == "done"
    assert h.spawn().state == "replay"  # even after it finished
    assert count.read_text() == "x\n"


def test_spawn_refuses_a_command_file_not_whole(base: str, tmp_path: Path, path_env: str) -> None:
    """A late partial duplicate of the command file's write: the spawn claims nothing and asks for
    the file again; once whole, the call runs normally."""
    h = Host(plan("echo ran; exit 48", base, tmp_path), path_env)
    cmd = Path(h.plan.cmd_path)
    cmd.write_bytes(h.plan.command_file[:-3])
    assert h.spawn().state == "nocmd"
    cmd.unlink()
    assert h.spawn().state == "nocmd"
    # No spawn claimed, no copy left (a spawnlock is made where flock exists).
    assert set(os.listdir(h.plan.dir)) <= {"spawnlock"}
    cmd.write_bytes(h.plan.command_file)
    assert h.spawn().state == "started"
    assert L.parse_done(h.wait(tail_when="always"), nonce=h.plan.nonce)[0] == 48


def test_a_rewrite_of_the_command_file_never_reaches_the_run(
    base: str, tmp_path: Path, path_env: str
) -> None:
    """The launcher runs its own copy: the command file cut short while the command runs (a late
    duplicate write truncating it) changes nothing. bash reads a script file as it goes, so the
    run of the file itself would end at the cut with status 0."""
    gate = tmp_path / "gate"
    h = Host(
        plan(f"while [ ! -e {gate} ]; do sleep 0.01; done\necho second\nexit 48", base, tmp_path),
        path_env,
    )
    assert h.spawn().state == "started"
    Path(h.plan.cmd_path).write_bytes(b"")  # truncated while the command runs
    gate.touch()
    reply = h.wait(tail_when="always")
    assert L.parse_done(reply, nonce=h.plan.nonce)[0] == 48
    assert reply.tail == "second\n"


def test_same_tag_other_call_is_busy_and_untouched(base: str, tmp_path: Path, token: str) -> None:
    first = Host(plan(f"sleep 30 # {token}", base, tmp_path, tag="shared"), os.environ["PATH"])
    assert first.spawn().state == "started"
    second = Host(plan("echo nope", base, tmp_path, tag="shared"), os.environ["PATH"])
    reply = second.spawn()
    assert (reply.state, reply.fields) == ("busy", (first.plan.nonce,))
    # The second call's kill must not touch the first call.
    assert second.kill().state == "notmine"
    assert not os.path.exists(second.plan.cmd_path)
    assert first.wait(wait_sec=0.1).state == "running"
    killed = first.kill()
    assert killed.state == "killed"
    assert L.parse_killed(killed)[0] == 0
    assert host_pids_with(token) == []
    assert not os.path.exists(first.plan.dir)


def test_workdir_missing_and_dir_missing(base: str, tmp_path: Path) -> None:
    p = L.make_plan("true", workdir=str(tmp_path / "nope"), base_dir=base)
    h = Host(p, os.environ["PATH"])
    assert h.spawn().state == "noworkdir"
    assert not os.path.lexists(os.path.join(p.dir, "spawned"))  # refused before the lock
    shutil.rmtree(p.dir)
    assert h.spawn().state == "gone"
    assert h.wait().state == "gone"
    os.makedirs(p.dir)
    assert h.wait().state == "unspawned"


def test_kill_sweeps_daemons_scrubbed_env_and_group(
    base: str, tmp_path: Path, token: str, path_env: str
) -> None:
    loop = "while :; do sleep 0.2; done"
    cmd = (
        f'setsid sh -c "{loop} # {token}-setsid" &\n'
        f'env -i sh -c "{loop} # {token}-scrubbed" &\n'
        f"( setsid sh -c \"sh -c '{loop} # {token}-daemon' &\" ) &\n"
        f'sh -c "{loop} # {token}-fg"\n'
    )
    h = Host(plan(cmd, base, tmp_path), path_env)
    h.spawn()
    # Wait (boundedly, inside the "sandbox") until each of the four runs. Each by its own
    # marker: a count of the token's processes could reach 4 with the double fork's short-lived
    # middle shell before the daemon existed, and fall back to 3 a moment later. The trailing
    # NUL ends the marker where the process's own argument ends: the middle shell's command
    # line carries "-daemon'" inside a longer argument.
    names = [f"{token}-{kind}\0" for kind in ("setsid", "scrubbed", "daemon", "fg")]
    for _ in range(200):
        if all(host_pids_with(name) for name in names):
            break
        h.wait(wait_sec=0.02)
    else:
        pytest.fail(f"not all four started: { {n: host_pids_with(n) for n in names} }")
    reply = h.kill()
    assert reply.state == "killed"
    assert L.parse_killed(reply)[0] == 0
    assert host_pids_with(token) == []
    assert not os.path.exists(h.plan.dir)
    assert h.kill().state == "gone"  # replay-safe


def test_kill_before_spawn_prevents_a_late_spawn(base: str, tmp_path: Path) -> None:
    count = tmp_path / "count"
    h = Host(plan(f"echo x >> {count}", base, tmp_path), os.environ["PATH"])
    reply = h.kill(remove=False)
    assert reply.state == "killed"
    assert h.spawn().state == "busy"  # the kill holds the lock: a late spawn does nothing
    h.kill(remove=True)
    assert h.spawn().state == "gone"
    assert not count.exists()


def test_kill_after_finish_reports_done(base: str, tmp_path: Path) -> None:
    h = Host(plan("echo bye; exit 4", base, tmp_path), os.environ["PATH"])
    h.spawn()
    h.wait()
    reply = h.kill()
    assert L.parse_done(reply, nonce=h.plan.nonce) == (4, 4)
    assert reply.tail == "bye\n"


def test_wait_reports_lost_launcher(base: str, tmp_path: Path, path_env: str) -> None:
    h = Host(plan("kill -9 $PPID; exit 0", base, tmp_path), path_env)
    h.spawn()
    assert h.wait().state == "lost"


def test_wait_returns_on_timeout_while_running(base: str, tmp_path: Path, token: str) -> None:
    h = Host(plan(f"sleep 30 # {token}", base, tmp_path), os.environ["PATH"])
    h.spawn()
    assert h.wait(wait_sec=0.05).state == "running"
    h.kill()


# -- quoting ------------------------------------------------------------------------------------

CANARY = f"/tmp/trio_swe_canary_{uuid.uuid4().hex}"
_PAYLOADS = [
    '$(touch "$CANARY")',
    '`touch "$CANARY"`',
    "'; touch \"$CANARY\"; '",
    '"; touch "$CANARY"; "',
    '\ntouch "$CANARY"\n',
    "${CANARY:?}$(touch ${CANARY})",
]
_nasty = st.text(
    alphabet=st.sampled_from(list("ab '\"$`\\;|&<>(){}*?!#~=\n\t-é漢🙂")), min_size=0, max_size=12
)
_values = st.one_of(_nasty, st.sampled_from(_PAYLOADS))
_dirnames = st.one_of(_nasty, st.sampled_from(_PAYLOADS)).filter(
    lambda s: s not in ("", ".", "..") and "\n" not in s and "/" not in s
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=_values, dirname=_dirnames)
def test_env_and_workdir_reach_the_command_literally(
    value: str, dirname: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "w" / dirname
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"CANARY": CANARY, "V": value}
    p = L.make_plan('printf "%s" "$V" > ../value; pwd -P > ../pwd', workdir=str(workdir), env=env)
    script = tmp_path / "cmd.sh"
    script.write_bytes(p.command_file)
    subprocess.run(["bash", str(script)], check=True, cwd="/", timeout=10)
    assert (workdir.parent / "value").read_text() == value
    assert (workdir.parent / "pwd").read_text() == os.path.realpath(workdir) + "\n"
    assert not os.path.exists(CANARY)


@settings(max_examples=30, deadline=None)
@given(tag=st.one_of(_values, st.text(max_size=70)))
def test_tags_are_safe_or_refused(tag: str) -> None:
    try:
        p = L.make_plan("true", workdir="/w", tag=tag)
    except InvalidArgumentError:
        return
    assert p.tag == tag
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", tag)
    assert shlex_split_ok(L.spawn_script(p))


def shlex_split_ok(script: str) -> bool:
    """The script still parses as shell (no quote imbalance from a value)."""
    return subprocess.run(["sh", "-n", "-c", script], check=False).returncode == 0
