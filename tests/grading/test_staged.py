"""The apply ladder and the graded script as one command: its output read stage by stage
(sans-IO), the shell run for real on the host, and ``apply_then_run`` on the local and e2b
backends (against the envd test server), through the Sandbox protocol only."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import SandboxError
from trio_swe.grading import _run as run_module
from trio_swe.grading import get_metadata
from trio_swe.grading._patch import apply_script, touched_paths
from trio_swe.grading._run import APPLY_STATE_DIR, STAGED_SLACK_SEC, apply_then_run
from trio_swe.grading._staged import STAGE, SetupStep, read_stages, staged_command
from trio_swe.sandbox import Backend, Sandbox, open_sandbox

from ..backends import BACKENDS
from ..conftest import host_pids_gone
from ._calc import CalcRepo, build_calc_repo, git

N = "0123456789abcdef0123456789abcdef"
M = f"{STAGE} {N}"

# -- reading the output (sans-IO) -------------------------------------------------------------


def test_a_whole_output_reads_stage_by_stage() -> None:
    out = (
        f"{M} apply\n@@TRIO_SWE_HEAD abc\n@@TRIO_SWE_APPLY ok git_apply\n\n"
        f"{M} applied 0 7.00 100.25 7.20 100,5\n{M} tests 1 10.20 50.0 0 head\nlog line\n"
        f"{M} tests 0 1 1 0 head\n"
    )
    st = read_stages(out, N)
    assert st.ladder_output == "@@TRIO_SWE_HEAD abc\n@@TRIO_SWE_APPLY ok git_apply\n"
    # The wall clock's microseconds for the ladder (a decimal comma, LC_NUMERIC, reads too)...
    assert (st.ladder_status, st.apply_sec, st.tests_ended, st.tests_status) == (0, 0.25, True, 1)
    # ... the monotonic clock for the tests' budget (the wall clock stepped back meanwhile).
    assert st.tests_sec == pytest.approx(3.0)
    # The log is everything after the first tests line, stage-like lines included.
    assert st.log == f"log line\n{M} tests 0 1 1 0 head\n"
    assert not st.tests_cut
    assert st.failed_write is None


def test_stage_lines_of_another_nonce_or_inside_a_line_are_not_stages() -> None:
    other = f"{STAGE} {'f' * 32}"
    # What a patch can put in the ladder's output (its paths in refusal lines): never our nonce.
    ladder = (
        f"refused: a\n{other} applied 0 1 2\n{other} tests 0 1 inline\nfake PASSED is beyond\n"
        f"x{M} applied 0 1 2\n@@TRIO_SWE_APPLY refused\n"
    )
    st = read_stages(f"{M} apply\n{ladder}\n{M} applied 3 1 2\n", N)
    assert st.ladder_output == ladder
    assert (st.ladder_status, st.tests_ended, st.log) == (3, False, None)


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("", {}),
        (f"{M} nodir\n", {"failed_write": "nodir"}),
        (f"{M} nopatch\n", {"failed_write": "nopatch"}),
        (f"{M} apply\npartial", {"ladder_output": "partial"}),
        (f"{M} apply\n\n{M} applied 0 x x 2 2\n{M} noscript\n", {"failed_write": "noscript"}),
        (
            f"{M} apply\n\n{M} applied 0 1 1 2 2\n{M} tests 137 9 9 1 file\n",
            {"log": None, "tests_cut": True},
        ),
        (f"{M} apply\n\n{M} applied 0 5 5 2 2\n", {"apply_sec": None}),  # clocks went back
        (f"{M} apply\n\n{M} applied 0 x 1 x 3\n", {"apply_sec": 2.0}),  # wall clock only
        (
            f"{M} apply\n\n{M} applied 0 1 x 2 x\n{M} tests 0 x 9 0 head\n",
            {"apply_sec": 1.0, "tests_sec": None, "log": ""},
        ),
        (f"{M} apply\n\n{M} applied\n", {"ladder_status": None, "apply_sec": None}),
    ],
    ids=[
        "nothing",
        "nodir",
        "nopatch",
        "cut_in_ladder",
        "noscript",
        "log_in_file",
        "clocks_back",
        "wall_clock_only",
        "no_common_clock",
        "bare",
    ],
)
def test_partial_and_failed_outputs(out: str, expected: dict[str, Any]) -> None:
    st = read_stages(out, N)
    for name, value in expected.items():
        assert getattr(st, name) == value, name


def test_a_log_comes_inline_only_when_its_head_is_all_of_it() -> None:
    from trio_swe.grading._staged import INLINE_LOG_BYTES

    def log_of(text: str) -> str | None:
        return read_stages(
            f"{M} apply\n\n{M} applied 0 1 1 2 2\n{M} tests 0 2 2 0 head\n{text}", N
        ).log

    whole = "x" * INLINE_LOG_BYTES
    assert log_of(whole) == whole
    assert log_of(whole + "x") is None  # head's extra byte: the file may be longer
    # Undecodable bytes read as U+FFFD (3 bytes for 1): never taken for a shorter log.
    cut = (b"x" * (INLINE_LOG_BYTES - 1) + b"\xff\xfe").decode("utf-8", "replace")
    assert log_of(cut) is None
    small = (b"ok \xff\n").decode("utf-8", "replace")
    assert log_of(small) == small


_LADDER_AND_TESTS = (
    f"{M} apply\n\n{M} applied 0 7.00 100.0 7.20 100.25\n{M} tests 0 7.30 100.3 0 head\nlog\n"
)


def test_setup_lines_come_first_and_time_the_setup_stage() -> None:
    out = f"{M} setup one 1.00 50.0\n{M} setup two 1.50 50.5\n{M} setupok 2.00 51.25\n"
    st = read_stages(out + _LADDER_AND_TESTS, N, setups=2)
    assert (st.setup_ok, st.setup_name, st.setup_failed) == (True, "two", False)
    assert st.setup_sec == pytest.approx(1.25)  # the wall clock, as for the ladder
    assert (st.ladder_status, st.apply_sec, st.tests_status, st.log) == (0, 0.25, 0, "log\n")
    # Without setups the same output is read from its first stage line on: the ladder's.
    assert read_stages(_LADDER_AND_TESTS, N).setup_ok is False


def test_setup_lines_in_the_graded_log_are_not_stages() -> None:
    # What a graded script that learnt the nonce could print: after setupok, so never read.
    forged = f"{M} setup c 0 0\n{M} setupfail 1 0 0 0 head\n"
    setups = f"{M} setup a 1.00 50.0\n{M} setup b 1.50 50.5\n{M} setupok 2.00 51.0\n"
    st = read_stages(setups + _LADDER_AND_TESTS + forged, N, setups=2)
    assert (st.setup_ok, st.setup_name, st.setup_failed, st.setup_sec) == (True, "b", False, 1.0)
    assert st.log == "log\n" + forged


def test_a_failed_setup_ends_the_stages_with_its_log() -> None:
    out = f"{M} setup one 1.00 50.0\n{M} setupfail 3 2.00 51.0 0 head\nwhy\n{M} apply\n"
    st = read_stages(out, N, setups=2)
    assert (st.setup_name, st.setup_failed, st.setup_ok) == ("one", True, False)
    assert (st.setup_status, st.setup_cut, st.setup_sec) == (3, False, 1.0)
    # What follows its line is the log (stage-like lines included): no ladder ran.
    assert st.setup_log == f"why\n{M} apply\n"
    assert st.ladder_output is None


@pytest.mark.parametrize(
    ("out", "setups", "expected"),
    [
        ("", 2, {"setup_name": None, "failed_write": None}),
        (f"{M} nodir\n", 2, {"failed_write": "nodir"}),
        (f"{M} noasset\n", 2, {"failed_write": "noasset"}),
        (f"{M} setup a 1 1\n{M} noasset\n", 2, {"failed_write": "noasset", "setup_name": "a"}),
        # Cut inside the second script: the one that was running.
        (f"{M} setup a 1 1\n{M} setup b 2 2\n", 2, {"setup_name": "b", "setup_failed": False}),
        (
            f"{M} setup a 1 1\n{M} setupfail 137 3 3 1 head\n",
            2,
            {"setup_cut": True, "setup_status": 137, "setup_log": ""},
        ),
        (
            f"{M} setup a 1 1\n{M} setupfail 1 3 3 0 head\n" + "x" * (64 * 1024),
            2,
            {"setup_log": None},  # longer than inline: read from its file
        ),
        # One setup: a second setup line is no stage (only setupok or setupfail may follow).
        (
            f"{M} setup a 1 1\n{M} setup b 2 2\n{M} setupok 3 3\n",
            1,
            {"setup_name": "a", "setup_ok": True, "setup_sec": 2.0},
        ),
    ],
    ids=["nothing", "nodir", "noasset", "noasset_later", "cut", "killed", "log_in_file", "once"],
)
def test_partial_and_failed_setup_outputs(out: str, setups: int, expected: dict[str, Any]) -> None:
    st = read_stages(out, N, setups=setups)
    for name, value in expected.items():
        assert getattr(st, name) == value, name


def test_a_setups_name_must_be_one_word() -> None:
    bad = SetupStep("two words", "true", "/tmp/x.sh", "/tmp/x.log")
    with pytest.raises(ValueError, match="one word"):
        staged_command(
            nonce=N,
            dirs=(),
            patch=None,
            patch_path="/tmp/p",
            ladder="true",
            script="true",
            script_path="/tmp/s.sh",
            log_path="/tmp/s.log",
            budget_sec=1,
            setups=(bad,),
        )


# -- the shell, run on the host ----------------------------------------------------------------


def _host_run(
    tmp_path: Path,
    calc: CalcRepo,
    patch: bytes,
    script: str,
    *,
    budget: float = 60,
    save: str | None = None,
    restore: str | None = None,
    **kw: Any,
) -> tuple[str, subprocess.CompletedProcess[bytes], Path]:
    repo = calc.path
    state = tmp_path / "state"
    paths = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in touched_paths(patch))
    ladder = apply_script(
        workdir=str(repo),
        patch_path=str(tmp_path / "p.diff") if patch.strip() else None,
        list_path=str(tmp_path / "p.list"),
        state_dir=str(state),
        paths=paths,
        expect_head=calc.base,
        state_ready=True,
    )
    cmd = staged_command(
        nonce=N,
        dirs=(str(tmp_path / "eval"), str(state)),
        patch=patch if patch.strip() else None,
        patch_path=str(tmp_path / "p.diff"),
        ladder=ladder,
        script=script,
        script_path=str(tmp_path / "eval" / "eval.sh"),
        log_path=str(tmp_path / "eval" / "eval.log"),
        budget_sec=budget,
        save=save,
        restore=restore,
        **kw,
    )
    done = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, cwd=repo, stdin=subprocess.DEVNULL, timeout=120
    )
    return done.stdout.decode("utf-8", "replace"), done, tmp_path / "eval"


@pytest.fixture
def calc(tmp_path: Path) -> CalcRepo:
    return build_calc_repo(tmp_path / "src")


def test_applied_patch_runs_the_script_with_its_log_inline(tmp_path: Path, calc: CalcRepo) -> None:
    script = "echo out; echo err >&2; git diff --stat; exit 4"
    out, done, eval_dir = _host_run(tmp_path, calc, calc.gold.encode(), script)
    st = read_stages(out, N)
    assert done.returncode == 4
    assert st.ladder_status == 0
    assert "@@TRIO_SWE_APPLY ok git_apply" in (st.ladder_output or "")
    assert (eval_dir / "eval.sh").read_text() == script + "\n"
    assert st.log == (eval_dir / "eval.log").read_text()
    assert st.log is not None
    assert st.log.startswith("out\nerr\n")
    assert "calc/__init__.py" in st.log
    assert (st.tests_status, st.tests_ended) == (4, True)
    assert st.apply_sec is not None
    assert st.tests_sec is not None


@pytest.mark.parametrize("which", ["no_apply", "wrong_head", "symlink"])
def test_the_script_never_runs_unless_the_ladder_applied(
    tmp_path: Path, calc: CalcRepo, which: str
) -> None:
    patch = calc.gold
    if which == "no_apply":
        patch = calc.no_apply
    elif which == "wrong_head":
        (calc.path / "extra").write_text("x")
        git(calc.path, "add", "extra")
        git(calc.path, "commit", "-qm", "another commit")
    else:  # a directory of the tree is a symlink out of it: nothing is written through it
        outside = tmp_path / "outside"
        outside.mkdir()
        shutil.rmtree(calc.path / "calc")
        (calc.path / "calc").symlink_to(outside)
    marker = tmp_path / "ran"
    out, done, eval_dir = _host_run(tmp_path, calc, patch.encode(), f"touch {marker}\n")
    st = read_stages(out, N)
    assert not marker.exists()
    assert not (eval_dir / "eval.sh").exists()
    assert st.ladder_status == 3
    assert not st.tests_ended
    assert done.returncode == 0
    if which == "symlink":
        assert not list((tmp_path / "outside").iterdir())


def test_patch_bytes_arrive_exactly(tmp_path: Path, calc: CalcRepo) -> None:
    # Not UTF-8, quotes, backslashes, printf directives, control bytes: raw in a text diff.
    data = b"caf\xe9 'q' \"d\" \\b\\ %s %b \\0101\n\x01\x7f\xff\n"
    (calc.path / "odd.txt").write_bytes(data)
    git(calc.path, "add", "-N", "odd.txt")
    patch = subprocess.run(
        ["git", "-C", str(calc.path), "diff", "--", "odd.txt"], capture_output=True, check=True
    ).stdout
    git(calc.path, "rm", "-q", "--cached", "odd.txt")
    (calc.path / "odd.txt").unlink()
    assert b"\xe9" in patch
    assert b"'" in patch
    out, _, _ = _host_run(tmp_path, calc, patch, "exit 0\n")
    assert (tmp_path / "p.diff").read_bytes() == patch
    assert read_stages(out, N).ladder_status == 0
    assert (calc.path / "odd.txt").read_bytes() == data


def test_the_watchdog_kills_the_scripts_process_group(tmp_path: Path, calc: CalcRepo) -> None:
    marker = f"trio-swe-watchdog-{os.getpid()}-{time.monotonic_ns()}"
    script = f"bash -c 'exec -a {marker} sleep 300' &\nwait\n"
    t = time.monotonic()
    out, done, _ = _host_run(tmp_path, calc, calc.gold.encode(), script, budget=1)
    assert time.monotonic() - t < 60  # cut at the budget, far from the 300 s sleep
    st = read_stages(out, N)
    assert (done.returncode, st.tests_status, st.tests_ended) == (137, 137, True)
    assert st.tests_cut
    assert st.tests_sec is not None
    assert st.tests_sec >= 1
    alive = subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False)
    assert alive.stdout == b""  # the script's child died with its group


def _hooks(tmp_path: Path, calc: CalcRepo) -> tuple[str, str]:
    """SWE-bench Pro's: the graded test file archived before the ladder, put back after it."""
    archive = tmp_path / "graded.tar"
    return (
        f"cd {calc.path} && tar -cf {archive} --ignore-failed-read -- tests/test_calc.py",
        f"cd {calc.path} && rm -rf -- tests/test_calc.py && tar -xf {archive}",
    )


def test_the_graded_files_are_saved_before_the_ladder_and_restored_after_it(
    tmp_path: Path, calc: CalcRepo
) -> None:
    save, restore = _hooks(tmp_path, calc)
    before = (calc.path / "tests" / "test_calc.py").read_text()
    # The cheat edits the graded tests (it applies); the script sees them as they were.
    script = "cat tests/test_calc.py; git diff --stat"
    out, _, _ = _host_run(tmp_path, calc, calc.cheat.encode(), script, save=save, restore=restore)
    st = read_stages(out, N)
    assert (st.ladder_status, st.tests_status, st.failed_write) == (0, 0, None), out
    assert st.log is not None
    assert st.log.startswith(before)
    assert "tests/test_calc.py" not in st.log.split(before, 1)[1]  # not in the diff


@pytest.mark.parametrize("which", ["save", "restore"])
def test_a_failed_hook_ends_the_command_with_its_output(
    tmp_path: Path, calc: CalcRepo, which: str
) -> None:
    save, restore = _hooks(tmp_path, calc)
    failing = "echo cannot archive >&2; exit 2"
    marker = tmp_path / "ran"
    out, done, eval_dir = _host_run(
        tmp_path,
        calc,
        calc.gold.encode(),
        f"touch {marker}\n",
        save=failing if which == "save" else save,
        restore=failing if which == "restore" else restore,
    )
    st = read_stages(out, N)
    assert st.failed_write == f"no{which}"
    assert st.hook_output == "cannot archive\n"
    assert not marker.exists()
    assert not (eval_dir / "eval.sh").exists()
    assert done.returncode == 0
    # A failed save: the ladder never ran (the tree is untouched).
    assert (st.ladder_output is None) == (which == "save")
    assert (git(calc.path, "status", "--porcelain") == "") == (which == "save")


def test_restore_runs_only_once_the_ladder_applied(tmp_path: Path, calc: CalcRepo) -> None:
    marker = tmp_path / "restored"
    out, _, _ = _host_run(
        tmp_path, calc, calc.no_apply.encode(), "exit 0\n", restore=f"touch {marker}"
    )
    assert read_stages(out, N).ladder_status == 3
    assert not marker.exists()


def _steps(tmp_path: Path, calc: CalcRepo, *bodies: str) -> tuple[SetupStep, ...]:
    """Setup scripts as scaleswe writes them: ``set -e`` in the workdir."""
    eval_dir = tmp_path / "eval"
    return tuple(
        SetupStep(
            f"s{i}",
            f"set -e\ncd {calc.path}\n{body}",
            f"{eval_dir}/s{i}.sh",
            f"{eval_dir}/s{i}.log",
        )
        for i, body in enumerate(bodies)
    )


def test_setups_run_in_order_before_the_patch_and_the_script_sees_them(
    tmp_path: Path, calc: CalcRepo
) -> None:
    order = tmp_path / "order"
    steps = _steps(
        tmp_path,
        calc,
        f"echo one >> {order}; echo out-one",
        # The patch is not applied yet; the exports are not set yet.
        f"git status --porcelain > {tmp_path}/tree; echo two:${{TRIO_SWE_X:-unset}} >> {order}",
    )
    asset = tmp_path / "assets" / "run.sh"
    script = f"cat {order}; echo script:$TRIO_SWE_X; cat {asset}"
    out, done, eval_dir = _host_run(
        tmp_path,
        calc,
        calc.gold.encode(),
        script,
        setups=steps,
        setup_budget_sec=60,
        assets=((str(asset), b"echo 'asset' \\ \xff\n"),),
        exports=(("TRIO_SWE_X", "on"),),
    )
    st = read_stages(out, N, setups=2)
    assert (st.setup_ok, st.setup_name, st.ladder_status, st.tests_status) == (True, "s1", 0, 0)
    assert st.setup_sec is not None
    assert (tmp_path / "tree").read_text() == ""
    assert (eval_dir / "s0.log").read_text() == "out-one\n"
    assert st.log is not None
    assert st.log.startswith("one\ntwo:unset\nscript:on\necho 'asset'")
    assert asset.read_bytes() == b"echo 'asset' \\ \xff\n"
    assert asset.stat().st_mode & 0o777 == 0o755
    assert done.returncode == 0


def test_a_failed_setup_ends_the_command_with_its_log(tmp_path: Path, calc: CalcRepo) -> None:
    marker = tmp_path / "ran"
    steps = _steps(tmp_path, calc, "echo first", "echo why; false; echo never", f"touch {marker}")
    out, done, eval_dir = _host_run(
        tmp_path, calc, calc.gold.encode(), f"touch {marker}\n", setups=steps, setup_budget_sec=60
    )
    st = read_stages(out, N, setups=3)
    assert (st.setup_name, st.setup_failed, st.setup_status, st.setup_cut) == ("s1", True, 1, False)
    assert st.setup_log == "why\n"
    assert st.setup_sec is not None
    # Nothing after it ran: no later setup, no patch written, no ladder, no script.
    assert not marker.exists()
    assert st.ladder_output is None
    assert not (tmp_path / "p.diff").exists()
    assert not (eval_dir / "eval.sh").exists()
    assert git(calc.path, "status", "--porcelain") == ""
    assert done.returncode == 0


async def test_a_setup_over_its_budget_is_killed_with_its_group(
    tmp_path: Path, calc: CalcRepo
) -> None:
    marker = f"trio-swe-setup-watchdog-{os.getpid()}-{time.monotonic_ns()}"
    steps = _steps(tmp_path, calc, f"echo started\nbash -c 'exec -a {marker} sleep 300' &\nwait")
    out, done, eval_dir = _host_run(
        tmp_path, calc, calc.gold.encode(), "exit 0\n", setups=steps, setup_budget_sec=1
    )
    st = read_stages(out, N, setups=1)
    assert (st.setup_failed, st.setup_cut, st.setup_status) == (True, True, 137)
    assert st.setup_log == "started\n"
    assert st.setup_sec is not None
    assert st.setup_sec >= 1
    assert st.ladder_output is None
    assert not (eval_dir / "eval.sh").exists()
    assert done.returncode == 0
    assert await host_pids_gone(marker) == []  # the script's child died with its group


# -- apply_then_run on real backends -----------------------------------------------------------


@pytest.fixture(params=["local", "e2b"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    calc = build_calc_repo(tmp_path / "src")
    calc.path.rename(tmp_path / "image")  # the e2b test server boots this directory
    async with BACKENDS[request.param](tmp_path) as b:
        yield b


class _Counting:
    """Forwards to a real sandbox, counting the RPCs made."""

    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sb, name)

    async def exec(self, cmd: str, **kw: Any) -> Any:
        self.calls.append("exec")
        return await self._sb.exec(cmd, **kw)

    async def write_file(self, path: str, data: Any, **kw: Any) -> None:
        self.calls.append("write_file")
        await self._sb.write_file(path, data, **kw)

    async def read_file(self, path: str, **kw: Any) -> bytes:
        self.calls.append(f"read_file {path}")
        return await self._sb.read_file(path, **kw)


def _md(tmp_path: Path) -> Any:
    image = tmp_path / "image"
    base = git(image, "rev-parse", "HEAD").strip()
    row = {"instance_id": "calc-1", "image_url": str(image), "workdir": "/testbed"}
    return get_metadata({**row, "eval_cmd": "true"}, "scaleswe"), base


async def _apply_then_run(
    backend: Backend, tmp_path: Path, patch: str, script: str, *, budget: float = 60, **kw: Any
) -> tuple[Any, list[str], str]:
    md, base = _md(tmp_path)
    with trio.fail_after(120):  # a hang guard only
        async with open_sandbox(backend, str(tmp_path / "image")) as real:
            sb = _Counting(real)
            staged = await apply_then_run(
                sb,
                md,
                patch.encode(),
                script,
                expect_head=kw.get("expect_head", base),
                script_path="/tmp/trio_swe_eval/eval.sh",
                log_path="/tmp/trio_swe_eval/eval.log",
                budget_sec=budget,
                **{k: v for k, v in kw.items() if k != "expect_head"},
            )
            calls = list(sb.calls)
            tree = (await real.exec("git status --porcelain; ls /tmp/trio_swe_eval")).output
    return staged, calls, tree


async def test_an_applied_patch_and_its_tests_in_three_round_trips(
    backend: Backend, tmp_path: Path
) -> None:
    gold = _gold(tmp_path)
    staged, calls, tree = await _apply_then_run(
        backend, tmp_path, gold, "git diff --stat\necho done >&2\nexit 5"
    )
    assert staged.outcome.applied
    assert staged.outcome.rung == "git_apply"
    assert staged.run is not None
    assert (staged.run.exit_code, staged.run.reason) == (5, "exit")
    assert "calc/__init__.py" in staged.log
    assert staged.log.endswith("done\n")
    # The command's write, its spawn, one wait: nothing else before the result.
    assert calls == ["write_file", "exec", "exec"]
    assert " M calc/__init__.py" in tree


async def test_a_patch_that_does_not_apply_runs_no_tests(backend: Backend, tmp_path: Path) -> None:
    staged, calls, tree = await _apply_then_run(
        backend, tmp_path, _no_apply(), "touch /tmp/trio_swe_eval/ran\n"
    )
    assert (staged.outcome.applied, staged.run) == (False, None)
    assert "+ patch_fuzz" in staged.outcome.log  # every rung was tried; the log is read back
    assert calls[-1] == f"read_file {APPLY_STATE_DIR}/apply.log"
    assert "ran" not in tree.split()
    assert "eval.sh" not in tree.split()
    assert "calc" not in tree  # the tree is as it was


async def test_another_commit_applies_nothing(backend: Backend, tmp_path: Path) -> None:
    staged, _, tree = await _apply_then_run(
        backend, tmp_path, _gold(tmp_path), "touch /tmp/trio_swe_eval/ran\n", expect_head="1" * 40
    )
    assert staged.outcome.wrong_head
    assert not staged.outcome.applied
    assert staged.run is None
    assert staged.outcome.head == git(tmp_path / "image", "rev-parse", "HEAD").strip()
    assert "ran" not in tree.split()
    assert "calc" not in tree


async def test_a_large_log_is_read_from_its_file(backend: Backend, tmp_path: Path) -> None:
    script = "head -c 70000 /dev/zero | tr '\\0' x\necho\necho end\n"
    staged, calls, _ = await _apply_then_run(backend, tmp_path, _gold(tmp_path), script)
    assert staged.log == "x" * 70000 + "\nend\n"
    assert calls[-1] == "read_file /tmp/trio_swe_eval/eval.log"


async def test_a_hanging_script_is_cut_at_its_budget(backend: Backend, tmp_path: Path) -> None:
    t = trio.current_time()
    staged, _, _ = await _apply_then_run(
        backend, tmp_path, _gold(tmp_path), "sleep 300\n", budget=1
    )
    assert staged.run is not None
    assert staged.run.reason == "time_budget"
    assert trio.current_time() - t < 1 + STAGED_SLACK_SEC + 60  # the watchdog, not the backstop


async def test_an_empty_patch_is_checked_against_the_commit_and_runs(
    backend: Backend, tmp_path: Path
) -> None:
    staged, _, _ = await _apply_then_run(backend, tmp_path, " \n", "echo ran\n")
    assert (staged.outcome.applied, staged.outcome.rung, staged.log) == (True, "empty", "ran\n")


async def test_a_failed_patch_write_is_an_infrastructure_error(
    backend: Backend, tmp_path: Path
) -> None:
    # /tmp/trio_swe_eval/patch.diff is a directory: printf cannot write the patch.
    md, base = _md(tmp_path)
    async with open_sandbox(backend, str(tmp_path / "image")) as sb:
        await sb.exec("mkdir -p /tmp/trio_swe_eval/patch.diff")
        with pytest.raises(SandboxError, match="could not write the patch"):
            await apply_then_run(
                sb,
                md,
                _gold(tmp_path).encode(),
                "true",
                expect_head=base,
                script_path="/tmp/trio_swe_eval/eval.sh",
                log_path="/tmp/trio_swe_eval/eval.log",
                budget_sec=60,
            )


def _gold(tmp_path: Path) -> str:
    text = (tmp_path / "image" / "calc" / "__init__.py").read_text()
    return (
        "diff --git a/calc/__init__.py b/calc/__init__.py\n--- a/calc/__init__.py\n"
        "+++ b/calc/__init__.py\n" + _hunk(text)
    )


def _hunk(text: str) -> str:
    lines = text.splitlines(keepends=True)
    return f"@@ -1,{len(lines)} +1,{len(lines) + 1} @@\n+# fixed\n" + "".join(
        " " + line for line in lines
    )


def _no_apply() -> str:
    return (
        "diff --git a/calc/__init__.py b/calc/__init__.py\n"
        "--- a/calc/__init__.py\n+++ b/calc/__init__.py\n"
        "@@ -1,3 +1,3 @@\n-def nothing_like_this(a, b):\n+def add(a, b):\n     return 42\n \n"
    )


async def test_a_failed_save_is_reported_and_applies_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    md, base = _md(tmp_path)
    with trio.fail_after(120):  # a hang guard only
        async with open_sandbox(backend, str(tmp_path / "image")) as sb:
            staged = await apply_then_run(
                sb,
                md,
                _gold(tmp_path).encode(),
                "touch /tmp/trio_swe_eval/ran\n",
                expect_head=base,
                script_path="/tmp/trio_swe_eval/eval.sh",
                log_path="/tmp/trio_swe_eval/eval.log",
                budget_sec=60,
                save="cd /testbed && tar -cf /tmp/trio_swe_eval/g.tar -- no/such/file",
                restore="true",
            )
            tree = (await sb.exec("git status --porcelain; ls /tmp/trio_swe_eval")).output
    assert staged.hook_failed is not None
    assert staged.hook_failed[0] == "save"
    assert "no/such/file" in staged.hook_failed[1]
    assert (staged.outcome.applied, staged.run) == (False, None)
    assert "calc" not in tree
    assert "ran" not in tree.split()


async def test_setups_and_assets_travel_in_the_same_three_round_trips(
    backend: Backend, tmp_path: Path
) -> None:
    order = "/tmp/trio_swe_eval/order"
    setups = (
        ("first", f"set -e\ncd /testbed\necho one > {order}\ngit status --porcelain >> {order}"),
        ("second", f"set -e\necho two:${{TRIO_SWE_X:-unset}} >> {order}"),
    )
    asset = "/tmp/trio_swe_eval/assets/run.sh"
    staged, calls, tree = await _apply_then_run(
        backend,
        tmp_path,
        _gold(tmp_path),
        f"cat {order}; echo script:$TRIO_SWE_X; cat {asset}; stat -c %a {asset}",
        setups=setups,
        assets={asset: "echo asset\n"},
        env={"TRIO_SWE_X": "on"},
    )
    assert (staged.setup_failed, staged.hook_failed) == (None, None)
    assert staged.run is not None
    assert staged.run.exit_code == 0
    # Before the patch (a clean tree), in order, without the graded script's environment.
    assert staged.log == "one\ntwo:unset\nscript:on\necho asset\n755\n"
    assert staged.setup_sec is not None
    assert staged.apply_sec is not None
    assert calls == ["write_file", "exec", "exec"]
    assert " M calc/__init__.py" in tree


async def test_a_failed_setup_is_reported_and_applies_nothing(
    backend: Backend, tmp_path: Path
) -> None:
    # A log larger than one reply carries: read back from its file, whole.
    fail = "set -e\nhead -c 70000 /dev/zero | tr '\\0' x\necho\nfalse\necho never"
    staged, calls, tree = await _apply_then_run(
        backend,
        tmp_path,
        _gold(tmp_path),
        "touch /tmp/trio_swe_eval/ran\n",
        setups=(("pre_commands", fail), ("later", "touch /tmp/trio_swe_eval/later")),
    )
    assert staged.setup_failed == ("pre_commands exited with status 1", "x" * 70000 + "\n")
    assert calls[-1] == "read_file /tmp/trio_swe_eval/pre_commands.log"
    assert (staged.outcome.applied, staged.run) == (False, None)
    assert staged.setup_sec is not None
    assert "calc" not in tree  # the ladder never ran
    for name in ("ran", "later", "patch.diff", "eval.sh"):
        assert name not in tree.split()


async def test_a_setup_over_its_budget_is_cut(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "SETUP_BUDGET_SEC", 1.0)
    t = trio.current_time()
    staged, _, tree = await _apply_then_run(
        backend,
        tmp_path,
        _gold(tmp_path),
        "touch /tmp/trio_swe_eval/ran\n",
        setups=(("before_repo_set_cmd", "echo waiting\nsleep 300"),),
    )
    assert staged.setup_failed == ("before_repo_set_cmd outlived its 1 s budget", "waiting\n")
    assert (staged.outcome.applied, staged.run) == (False, None)
    assert "calc" not in tree
    assert "ran" not in tree.split()
    assert trio.current_time() - t < 60  # the watchdog, not the 300 s sleep


async def test_a_setup_that_kills_the_command_is_a_failed_setup(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_module, "SETUP_BUDGET_SEC", 1.0)  # the orphaned watchdog's sleep
    staged, _, tree = await _apply_then_run(
        backend,
        tmp_path,
        _gold(tmp_path),
        "touch /tmp/trio_swe_eval/ran\n",
        setups=(("pre_commands", "echo going\nkill -KILL $PPID"),),
    )
    # Its status is the command's, as when each setup was a detached command of its own.
    assert staged.setup_failed == ("pre_commands exited with status 137", "going\n")
    assert (staged.outcome.applied, staged.run) == (False, None)
    assert "calc" not in tree


async def test_a_process_a_setup_starts_outlives_it(backend: Backend, tmp_path: Path) -> None:
    # A service started by pre_commands (a database, say) is still there for the tests.
    pid = "/tmp/trio_swe_eval/service.pid"
    staged, _, _ = await _apply_then_run(
        backend,
        tmp_path,
        _gold(tmp_path),
        f'kill -0 "$(cat {pid})" && echo alive; kill -KILL "$(cat {pid})"',
        setups=(("pre_commands", f"sleep 300 >/dev/null 2>&1 &\necho $! > {pid}"),),
    )
    assert staged.setup_failed is None
    assert staged.log == "alive\n"
