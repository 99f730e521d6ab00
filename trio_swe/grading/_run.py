"""The I/O shared by every protocol: the fresh eval sandbox, the patch ladder, long commands."""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Final

import msgspec

from .._errors import SandboxError, SandboxFileNotFoundError, SandboxFileTooLargeError
from ..sandbox import (
    EXIT_TIME_BUDGET_EXCEEDED,
    Backend,
    ExecResult,
    Sandbox,
    exec_and_wait,
    image_for,
    open_sandbox,
)
from . import _result as R
from ._patch import (
    GIT_SAFE_ENV,
    apply_script,
    is_empty_patch,
    parse_head,
    parse_refusal,
    parse_verdict,
    patch_bytes,
    refused_paths,
    touched_paths,
    wrong_head,
)
from ._result import (
    EVAL_INFRASTRUCTURE,
    LOG_TAIL_CHARS,
    LOG_UNGRADABLE,
    TESTS_FAILED,
    TESTS_TIMEOUT,
    EvalArtifacts,
    EvalResult,
    Graded,
    log_tail,
)
from ._staged import SetupStep, Stages, read_stages, staged_command
from ._types import InstanceMetadata

#: Scratch directory of the grader inside the eval sandbox (outside the repository).
EVAL_DIR: Final = "/tmp/trio_swe_eval"
#: Budget of the apply ladder (four rungs on a large patch).
APPLY_TIMEOUT_SEC: Final = 120.0
#: Logs are read up to this size; past it, their head.
LOG_MAX_BYTES: Final = 256 * 1024 * 1024
#: Budget of setup commands (pre_commands, before_repo_set_cmd): they may install packages.
SETUP_BUDGET_SEC: Final = 600.0
#: Environment of every command in the eval sandbox: the repository's hooks and fsmonitor
#: never run (:data:`~._patch.GIT_SAFE_ENV`).
SAFE_ENV: Final[Mapping[str, str]] = dict(GIT_SAFE_ENV)
#: Environment of the graded commands: also no colours (parsers match plain ``PASSED`` lines).
PLAIN_ENV: Final[Mapping[str, str]] = {
    **SAFE_ENV,
    "PY_COLORS": "0",
    "NO_COLOR": "1",
    "TERM": "dumb",
}


class Phases:
    """Wall-clock seconds per grading phase."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self.durations: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.monotonic()
        try:
            yield
        finally:
            self.durations[name] = self.durations.get(name, 0.0) + time.monotonic() - t

    def total(self) -> dict[str, float]:
        return {**self.durations, "total": time.monotonic() - self._t0}


#: Exit statuses of a shell that could not find or run the command (not the tests' verdict).
_NOT_RUN_EXIT_CODES: Final = frozenset({126, 127})


def tests_did_not_run(result: EvalResult, graded_tests: Sequence[str]) -> bool:
    """Does ``result`` look like the environment could not run the tests at all?

    With the row's tests known: none of them appears in the parsed log with any status (a
    missing interpreter or test runner, a collection error that hits every test, a suite that
    never started). Without them (an exit-code grader): the shell could not run the command.
    Only failures are suspect; a result already marked as infrastructure stays as it is.
    """
    if result.resolved or result.infra_failure:
        return False
    if result.reason not in (TESTS_FAILED, LOG_UNGRADABLE):
        return False
    if graded_tests:
        return not any(_appears(t, result.tests_status) for t in graded_tests)
    return result.test_exit_code in _NOT_RUN_EXIT_CODES


def _appears(test: str, status: Mapping[str, str]) -> bool:
    """``test`` has a status, exactly or as a prefix (rows carry truncated parametrized ids)."""
    if test in status or test.split(" ")[0] in status:  # swebench's parsers cut at a space
        return True
    stem = test.strip()
    return bool(stem) and any(k.startswith(stem) for k in status)


async def confirm_environment(
    result: EvalResult,
    patch: str | bytes,
    graded_tests: Sequence[str],
    control: Callable[[], Awaitable[EvalResult]],
) -> EvalResult:
    """Turn a failure caused by the environment into ``eval_infrastructure``.

    When the tests did not run with ``patch`` (:func:`tests_did_not_run`), the same grading
    runs once more without it (``control``, a fresh sandbox): if the tests do not run then
    either, the environment cannot run them and the outcome says nothing about the patch. If
    they do, the patch broke them (e.g. a syntax error every test imports), and the reward of 0
    stands. A gold patch therefore never scores 0 because of the environment.
    """
    if not tests_did_not_run(result, graded_tests):
        return result
    durations = dict(result.durations)
    if is_empty_patch(patch):
        base = result  # the run itself was the control
    else:
        t = time.monotonic()
        base = await control()
        durations["control"] = spent = time.monotonic() - t
        durations["total"] = durations.get("total", 0.0) + spent
    if not tests_did_not_run(base, graded_tests):
        return msgspec.structs.replace(result, durations=durations)
    if graded_tests:
        why = (
            f"none of the row's {len(graded_tests)} graded tests ran (no status in the test "
            "log), with the patch and without it"
        )
    else:
        why = f"the test command could not run (exit status {result.test_exit_code})"
    return msgspec.structs.replace(
        result,
        reason=EVAL_INFRASTRUCTURE,
        infra_failure=True,
        reward=0.0,
        resolved=False,
        detail=f"{why}: the environment cannot run the tests ({result.reason}: {result.detail})",
        durations=durations,
    )


async def timed(evaluate: Callable[[Phases], Awaitable[EvalResult]]) -> EvalResult:
    """Run one grading, recording its phases in ``EvalResult.durations``.

    ``"total"`` includes killing the eval sandbox, which happens after the result is made.
    """
    phases = Phases()
    result = await evaluate(phases)
    return msgspec.structs.replace(result, durations=phases.total())


async def evaluate_patch(
    evaluate: Callable[[bytes, Phases, EvalArtifacts], Awaitable[EvalResult]],
    patch: str | bytes,
    graded_tests: Sequence[str],
) -> Graded:
    """The frame of every protocol's ``grade``: ``evaluate(patch, phases, artifacts)`` timed
    (:func:`timed`), and a failure whose tests did not run checked against the empty patch
    (:func:`confirm_environment`). ``evaluate`` fills ``artifacts`` with what it ran and saw;
    the graded run's are returned (the control run's are not the graded run's)."""
    data = patch_bytes(patch)
    artifacts = EvalArtifacts()

    async def grade(p: bytes, art: EvalArtifacts) -> EvalResult:
        return await timed(lambda phases: evaluate(p, phases, art))

    result = await confirm_environment(
        await grade(data, artifacts), data, graded_tests, lambda: grade(b"", EvalArtifacts())
    )
    return Graded(result=result, artifacts=artifacts)


@asynccontextmanager
async def open_eval_sandbox(
    backend: Backend, md: InstanceMetadata, phases: Phases
) -> AsyncIterator[Sandbox]:
    """A fresh sandbox from the instance image, killed on every way out; its boot time is
    ``phases.durations["boot"]``."""
    t_boot = time.monotonic()
    async with open_sandbox(
        backend,
        image_for(backend, md),
        workdir=md.workdir,
        metadata={"instance_id": md.instance_id[:128], "role": "eval"},
    ) as sb:
        phases.durations["boot"] = time.monotonic() - t_boot
        yield sb


async def run_long(
    sb: Sandbox,
    cmd: str,
    *,
    budget_sec: float,
    env: Mapping[str, str] | None = None,
    want_output: bool = False,
) -> ExecResult:
    """A long command (test suite, setup) as root, detached from the RPC stream.

    Overrunning ``budget_sec`` kills the command and gives ``reason == "time_budget"``.
    """
    return await exec_and_wait(
        sb,
        cmd,
        time_budget_sec=budget_sec,
        user="root",
        env={**SAFE_ENV, **(env or {})},
        want_output=want_output,
    )


async def read_text(sb: Sandbox, path: str) -> str:
    """A file from the sandbox as text; ``""`` only if it does not exist (the command never
    got to write it), never for an infrastructure failure. Backends return files whole, so a
    SWE-bench log keeps its head, where the start marker is; past :data:`LOG_MAX_BYTES` only
    the head is kept.
    """
    try:
        data = await sb.read_file(path, user="root", max_bytes=LOG_MAX_BYTES)
    except SandboxFileNotFoundError:
        return ""
    except SandboxFileTooLargeError:
        head = f"{path}.head"
        r = await sb.exec(
            f"head -c {LOG_MAX_BYTES} -- {shlex.quote(path)} > {shlex.quote(head)}",
            user="root",
            timeout=APPLY_TIMEOUT_SEC,
        )
        if not r.ok:
            raise SandboxError(f"cannot cut {path} to its head: {r.output[-300:]}") from None
        data = await sb.read_file(head, user="root", max_bytes=LOG_MAX_BYTES)
    return data.decode("utf-8", "replace")


class ApplyOutcome:
    """What the ladder did; ``refused`` says why no rung was even tried; ``head`` is the
    checkout's commit when the caller asked to check it (``wrong_head``: it was not the
    expected one, and nothing was applied)."""

    def __init__(
        self,
        applied: bool,
        rung: str | None,
        log: str,
        refused: str | None = None,
        *,
        head: str | None = None,
        wrong_head: bool = False,
    ) -> None:
        self.applied = applied
        self.rung = rung
        self.log = log
        self.refused = refused
        self.head = head
        self.wrong_head = wrong_head


def not_applied_result(
    md: InstanceMetadata, phases: Phases, outcome: ApplyOutcome, *, grader: str | None
) -> EvalResult:
    """Reward 0 for a patch no rung applied, or one refused before any rung ran."""
    if outcome.refused is not None:
        return make_result(
            md,
            phases,
            reason=R.PATCH_REFUSED,
            applied=False,
            grader=grader,
            detail=outcome.refused,
        )
    return make_result(
        md,
        phases,
        reason=R.PATCH_APPLY_FAILED,
        applied=False,
        grader=grader,
        detail="no rung of the apply ladder applied the patch",
        log=outcome.log,
    )


def timeout_result(
    md: InstanceMetadata,
    phases: Phases,
    *,
    rung: str | None,
    grader: str,
    what: str,
    timeout_sec: float,
    log: str,
    exit_code: int,
) -> EvalResult:
    """Reward 0, ``tests_timeout``: ``what`` (the graded command) outlived its budget."""
    return make_result(
        md,
        phases,
        reason=TESTS_TIMEOUT,
        rung=rung,
        grader=grader,
        detail=f"{what} outlived its {timeout_sec:g} s budget",
        log=log,
        exit_code=exit_code,
    )


def make_result(
    md: InstanceMetadata,
    phases: Phases,
    *,
    reason: str,
    resolved: bool = False,
    applied: bool = True,
    rung: str | None = None,
    grader: str | None = None,
    infra: bool = False,
    detail: str = "",
    log: str = "",
    tests_status: Mapping[str, str] | None = None,
    f2p: tuple[int, int] | None = None,
    p2p: tuple[int, int] | None = None,
    exit_code: int | None = None,
) -> EvalResult:
    """An :class:`EvalResult`; the reward is 1.0 exactly when ``resolved``."""
    return EvalResult(
        reward=1.0 if resolved else 0.0,
        resolved=resolved,
        applied_cleanly=applied,
        reason=reason,
        protocol=md.protocol,
        instance_id=md.instance_id,
        grader=grader,
        apply_method=rung,
        infra_failure=infra,
        detail=detail,
        tests_status=dict(tests_status or {}),
        f2p_passed=f2p[0] if f2p else None,
        f2p_total=f2p[1] if f2p else None,
        p2p_passed=p2p[0] if p2p else None,
        p2p_total=p2p[1] if p2p else None,
        test_exit_code=exit_code,
        log_tail=log_tail(log, LOG_TAIL_CHARS),
        durations=phases.total(),
    )


#: The ladder's files in the eval sandbox: the patch, and its state (snapshot, ``apply.log``).
PATCH_PATH: Final = f"{EVAL_DIR}/patch.diff"
APPLY_STATE_DIR: Final = f"{EVAL_DIR}/apply"
#: The whole command's budget is the tests' own plus this (the ladder and the shell steps,
#: normally well under a second): a hanging suite is cut this much later than on its own.
STAGED_SLACK_SEC: Final = 15.0
#: A ladder that took longer than this may have eaten into the tests' budget: if the command
#: then overran, the outcome says nothing about the patch (an infrastructure failure).
_LADDER_FAIR_SEC: Final = 10.0


class AppliedRun:
    """What :func:`apply_then_run` did: the ladder's outcome, then (only when it applied) the
    graded script's result and whole log. ``run.reason == "time_budget"`` when the script
    outlived its budget. ``apply_sec``: the ladder's own time, measured in the sandbox (None
    when it has no clock). ``hook_failed``: ``("save" | "restore", its output)`` when a hook
    of :func:`apply_then_run` failed (then nothing after it ran). ``setup_failed``: ``(detail,
    log)`` when a setup script failed or outlived its budget (then nothing after it ran: no
    patch, no ladder). ``setup_sec``: the setup scripts' time, measured in the sandbox (0.0
    without any; None when it has no clock)."""

    def __init__(
        self,
        outcome: ApplyOutcome,
        run: ExecResult | None,
        log: str,
        apply_sec: float | None,
        hook_failed: tuple[str, str] | None = None,
        *,
        setup_failed: tuple[str, str] | None = None,
        setup_sec: float | None = 0.0,
    ) -> None:
        self.outcome = outcome
        self.run = run
        self.log = log
        self.apply_sec = apply_sec
        self.hook_failed = hook_failed
        self.setup_failed = setup_failed
        self.setup_sec = setup_sec


async def apply_then_run(
    sb: Sandbox,
    md: InstanceMetadata,
    patch: bytes,
    script: str,
    *,
    expect_head: str | None,
    script_path: str,
    log_path: str,
    budget_sec: float,
    env: Mapping[str, str] | None = None,
    files: Mapping[str, str | bytes] | None = None,
    save: str | None = None,
    restore: str | None = None,
    setups: Sequence[tuple[str, str]] = (),
    assets: Mapping[str, str | bytes] | None = None,
) -> AppliedRun:
    """The apply ladder and the graded script in one detached command (:func:`staged_command`):
    the patch, the ladder and the script travel in the command, the ladder's verdict gates the
    script in the sandbox, and a small log comes back in the same reply. Three round trips
    (command write, spawn, wait) instead of five. ``files`` (path -> content) are written
    once the patch applied, before the script runs (a grader's own test file). ``save`` and
    ``restore`` are shell run before the ladder and once it applied (before ``files``): e.g.
    graded test files archived, then put back over the patch; a failure of either ends the
    command (``AppliedRun.hook_failed``; a failed ``save`` leaves the patch unapplied).

    The ladder is :func:`~._patch.apply_script`'s: a patch that
    :func:`~._patch.refused_paths` refuses is never written; ``expect_head`` is checked before
    any rung; the script runs only after an ``ok`` verdict, and the verdict is read from the
    ladder's own output, which must agree with its exit status (else :class:`SandboxError`: an
    infrastructure failure, never a reward). The script's budget is ``budget_sec`` of its own
    run, measured by the sandbox's clock (by ours when the sandbox has none): a run over it is
    ``reason == "time_budget"``, also when it ended before the whole command's budget
    (``budget_sec`` + :data:`STAGED_SLACK_SEC`, the ladder's and the shell's share) cut it.
    A ladder slow enough to have eaten into the script's budget followed by a cut is a
    :class:`SandboxError`, not a timeout of the tests.

    ``setups`` (name, script) run first, in order, with bash, :data:`SETUP_BUDGET_SEC` each (written to ``EVAL_DIR/<name>.sh``, their output to
    ``<name>.log``; with :data:`SAFE_ENV`, ``env`` being the ladder's and the script's), after
    ``assets`` (path -> content, mode 0755) are written. The first that fails ends the command
    (``AppliedRun.setup_failed``: ``"<name> exited with status N"`` or ``"<name> outlived its
    N s budget"``, and its whole log), before the patch is written.
    """
    empty = is_empty_patch(patch)
    if not empty:
        refused = refused_paths(patch)
        if refused:
            detail = "; ".join(refused[:5]) + (
                f" (and {len(refused) - 5} more)" if len(refused) > 5 else ""
            )
            return AppliedRun(
                ApplyOutcome(False, None, "", refused=f"patch refused: {detail}"), None, "", 0.0
            )
    state = APPLY_STATE_DIR
    paths = b"".join(p.encode("utf-8", "surrogateescape") + b"\x00" for p in touched_paths(patch))
    ladder = apply_script(
        workdir=md.workdir,
        patch_path=None if empty else PATCH_PATH,
        list_path=f"{EVAL_DIR}/patch.paths",
        state_dir=state,
        paths=paths,
        expect_head=expect_head,
        state_ready=True,
    )
    nonce = uuid.uuid4().hex
    steps = tuple(
        SetupStep(name, body, f"{EVAL_DIR}/{name}.sh", f"{EVAL_DIR}/{name}.log")
        for name, body in setups
    )
    setup_budget = SETUP_BUDGET_SEC  # read per call (a test may lower it)
    # With setups, the command runs with the setups' environment (SAFE_ENV) and exports the
    # rest of ``env`` after them, for the ladder and the script.
    extra = {k: v for k, v in (env or {}).items() if SAFE_ENV.get(k) != v} if steps else {}
    cmd = staged_command(
        nonce=nonce,
        dirs=(EVAL_DIR, APPLY_STATE_DIR),
        patch=None if empty else patch,
        patch_path=PATCH_PATH,
        ladder=ladder,
        script=script,
        script_path=script_path,
        log_path=log_path,
        budget_sec=budget_sec,
        files=tuple((path, _bytes(data)) for path, data in (files or {}).items()),
        save=save,
        restore=restore,
        assets=tuple((path, _bytes(data)) for path, data in (assets or {}).items()),
        setups=steps,
        setup_budget_sec=setup_budget,
        exports=tuple(extra.items()),
    )
    t = time.monotonic()
    run = await run_long(
        sb,
        cmd,
        budget_sec=budget_sec + STAGED_SLACK_SEC + len(steps) * setup_budget,
        env=None if steps else env,
        want_output=True,
    )
    wall = time.monotonic() - t
    overrun = run.reason == "time_budget"
    st = read_stages(run.output, nonce, setups=len(steps))
    if st.failed_write == "noasset":
        raise SandboxError("the graded command could not write the grader's assets or setups")
    if steps and not st.setup_ok and st.setup_name is not None:
        return await _setup_failed(sb, st, run, overrun, wall, setup_budget)
    setup_sec = st.setup_sec if steps else 0.0
    if st.failed_write == "nosave":
        return AppliedRun(
            ApplyOutcome(False, None, ""),
            None,
            "",
            0.0,
            hook_failed=("save", st.hook_output),
            setup_sec=setup_sec,
        )
    if st.ladder_output is None:
        why = {"nodir": "could not make its directories", "nopatch": "could not write the patch"}
        raise SandboxError(
            "the graded command failed before the apply ladder: "
            + why.get(st.failed_write or "", "no stage ran")
        )
    ladder_out, status = st.ladder_output, st.ladder_status
    if status is None and not overrun:
        raise SandboxError(
            f"the graded command ended inside the apply ladder: {run.output[-300:]!r}"
        )
    # Without the sandbox's clocks: our own, less the setups' share where it is known.
    rest = wall - (setup_sec or 0.0)
    apply_sec = st.apply_sec if status is not None else rest
    head = parse_head(ladder_out)
    if wrong_head(ladder_out):
        return AppliedRun(
            ApplyOutcome(False, None, ladder_out, head=head, wrong_head=True),
            None,
            "",
            apply_sec,
            setup_sec=setup_sec,
        )
    applied, rung = parse_verdict(ladder_out)
    # The shell ran the script only on status 0: both must agree (a ladder cut by the
    # command's budget has no status, and applied nothing that counts).
    if applied != (status == 0) and not (status is None and not applied):
        raise SandboxError(
            f"the apply ladder's verdict ({'ok ' + str(rung) if applied else 'not applied'}) "
            f"and its exit status ({status}) disagree: {ladder_out[-300:]!r}"
        )
    script_refused = parse_refusal(ladder_out)
    if script_refused is not None:
        outcome = ApplyOutcome(
            False, None, ladder_out, refused=f"patch refused: {script_refused}", head=head
        )
        return AppliedRun(outcome, None, "", apply_sec, setup_sec=setup_sec)
    if not applied:
        log = await read_text(sb, f"{APPLY_STATE_DIR}/apply.log")
        if status is None:
            log += f"\n(apply ladder exceeded the command's {budget_sec + STAGED_SLACK_SEC:g} s)"
        return AppliedRun(
            ApplyOutcome(False, None, log, head=head), None, "", apply_sec, setup_sec=setup_sec
        )
    outcome = ApplyOutcome(True, rung, "", head=head)
    if st.failed_write == "norestore":
        return AppliedRun(
            outcome,
            None,
            "",
            apply_sec,
            hook_failed=("restore", st.hook_output),
            setup_sec=setup_sec,
        )
    if st.failed_write == "noscript":
        raise SandboxError(f"the graded command could not write {script_path} or its files")
    if overrun and not st.tests_ended and (apply_sec is None or apply_sec > _LADDER_FAIR_SEC):
        spent = "an unknown time" if apply_sec is None else f"{apply_sec:.0f} s"
        raise SandboxError(
            f"the apply ladder took {spent}, so the graded script may have had less than its "
            f"{budget_sec:g} s when the command was cut: the run says nothing of the patch"
        )
    if not st.tests_ended:
        # Cut by the command's budget, or the script took its shell down with it: the log
        # file is what it wrote.
        log = await read_text(sb, log_path)
        return AppliedRun(
            outcome, _as_overrun(run) if overrun else run, log, apply_sec, setup_sec=setup_sec
        )
    log = st.log if st.log is not None and not overrun else await read_text(sb, log_path)
    took = st.tests_sec if st.tests_sec is not None else rest
    code = st.tests_status
    result = msgspec.structs.replace(
        run, exit_code=run.exit_code if code is None else code, output=""
    )
    if overrun or st.tests_cut or took > budget_sec:
        result = _as_overrun(result)
    return AppliedRun(outcome, result, log, apply_sec, setup_sec=setup_sec)


async def _setup_failed(
    sb: Sandbox, st: Stages, run: ExecResult, overrun: bool, wall: float, budget_sec: float
) -> AppliedRun:
    """The :class:`AppliedRun` of a setup script that failed, was killed at its budget, or was
    running when the command was cut (``st.setup_name``: that script)."""
    name = st.setup_name
    log_path = f"{EVAL_DIR}/{name}.log"
    status = st.setup_status
    if st.setup_failed:
        log = st.setup_log if st.setup_log is not None else await read_text(sb, log_path)
        cut = st.setup_cut
    else:
        # The command's budget cut it (in case the sandbox's watchdog did not), or the script
        # took the command's shell down with it: its status is the command's.
        log, cut, status = await read_text(sb, log_path), overrun, run.exit_code
    if cut:
        detail = f"{name} outlived its {budget_sec:g} s budget"
    else:
        detail = f"{name} exited with status {status}"
    return AppliedRun(
        ApplyOutcome(False, None, ""),
        None,
        "",
        None,
        setup_failed=(detail, log),
        setup_sec=st.setup_sec if st.setup_sec is not None else wall,
    )


def _bytes(data: str | bytes) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _as_overrun(run: ExecResult) -> ExecResult:
    return msgspec.structs.replace(run, exit_code=EXIT_TIME_BUDGET_EXCEEDED, reason="time_budget")
