"""The ``scaleswe`` protocol: SWE-bench Pro run scripts, ``eval_cmd`` or a Scale-SWE f2p script.

Order in the fresh eval sandbox: grader assets, ``before_repo_set_cmd`` (SWE-bench Pro), then
``pre_commands`` (their failure is an infrastructure outcome, ``setup_failed``), the patch
ladder, then exactly one grader by priority: ``swepro``, ``eval_cmd``, ``f2p_script``. All of it
is one detached command (:func:`~._run.apply_then_run`), the setup scripts its first stage.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from collections.abc import Mapping
from typing import Any, Final

import msgspec
import trio

from ..sandbox import Backend, Sandbox
from . import _result as R
from . import _swebench_api
from ._harness import tests_status_report
from ._metadata import scaleswe_metadata
from ._result import EvalArtifacts, EvalResult, Graded
from ._run import (
    APPLY_TIMEOUT_SEC,
    EVAL_DIR,
    PLAIN_ENV,
    AppliedRun,
    Phases,
    apply_then_run,
    evaluate_patch,
    make_result,
    not_applied_result,
    open_eval_sandbox,
    read_text,
    timeout_result,
)
from ._testlog import parse_pytest_summary, selectable, split_counts
from ._types import InstanceMetadata, ScaleSweGrading, SweProSpec

#: Where Scale-SWE's F2P ids expect the script (``test_fail_to_pass.py::test_x``).
F2P_FILE: Final = "test_fail_to_pass.py"
SWEPRO_DIR: Final = f"{EVAL_DIR}/swepro"
_PYTEST_TESTS = re.compile(r"^\s*(?:async\s+)?def\s+test|^\s*class\s+Test", re.MULTILINE)


class _SweProResult(msgspec.Struct):
    name: str
    status: str


class _SweProOutput(msgspec.Struct):
    tests: list[_SweProResult] = msgspec.field(default_factory=list)


class ScaleSweProtocol:
    """Grades with the row's own grader; needs nothing beyond the sandbox."""

    name = "scaleswe"

    def get_metadata(self, row: Mapping[str, Any]) -> InstanceMetadata:
        return scaleswe_metadata(row, self.name)

    def unavailable_reason(self) -> str | None:
        return None

    def evaluability_check(self, md: InstanceMetadata) -> str | None:
        if md.mismatch:
            return md.mismatch
        g = md.grading
        if not isinstance(g, ScaleSweGrading):
            return "protocol_row_mismatch:not_scaleswe_metadata"
        if g.grader is None:
            return R.NO_GRADER
        if g.swepro is not None:
            sp = g.swepro
            if not (sp.fail_to_pass or sp.pass_to_pass):
                return "swepro_no_graded_tests"
            for what, inline, path in (
                ("run_script", sp.run_script, sp.run_script_path),
                ("parser_script", sp.parser_script, sp.parser_script_path),
            ):
                if inline is None and not (path and os.path.isfile(path)):
                    return f"swepro_{what}_missing:{path}"
        elif g.eval_cmd and g.log_parser:
            return _swebench_api.has_parser(g.log_parser)
        return None

    async def grade(
        self, backend: Backend, md: InstanceMetadata, patch: str | bytes, *, timeout_sec: float
    ) -> Graded:
        g = md.grading
        graded = await evaluate_patch(
            lambda p, phases, art: self._evaluate(backend, md, p, timeout_sec, phases, art),
            patch,
            _graded_tests(g) if isinstance(g, ScaleSweGrading) else (),
        )
        if graded.artifacts.report is None and isinstance(g, ScaleSweGrading):
            # swebench's per-instance report, from the statuses (swebench makes its own).
            f2p = g.swepro.fail_to_pass if g.swepro is not None else g.fail_to_pass
            p2p = g.swepro.pass_to_pass if g.swepro is not None else g.pass_to_pass
            graded.artifacts.report = tests_status_report(graded.result, f2p, p2p)
        return graded

    async def _evaluate(
        self,
        backend: Backend,
        md: InstanceMetadata,
        patch: bytes,
        timeout_sec: float,
        phases: Phases,
        art: EvalArtifacts,
    ) -> EvalResult:
        reason = self.evaluability_check(md)
        g = md.grading
        if reason is not None or not isinstance(g, ScaleSweGrading):
            return make_result(
                md,
                phases,
                reason=R.NO_GRADER if reason == R.NO_GRADER else R.UNEVALUABLE,
                infra=True,
                detail=reason or "",
            )
        grader = g.grader
        try:
            assets = await _read_swepro_assets(g.swepro) if g.swepro is not None else None
        except OSError as exc:  # the row's host script vanished or is unreadable
            return make_result(
                md, phases, reason=R.UNEVALUABLE, grader=grader, infra=True, detail=str(exc)
            )
        setups = _setups(md, g)
        async with open_eval_sandbox(backend, md, phases) as sb:
            if g.swepro is None:
                script, files = _exit_code_script(md, g)
                return await _grade_exit_code(
                    sb, md, phases, patch, grader or "", script, files, timeout_sec, g, setups, art
                )
            assert assets is not None
            return await _grade_swepro(
                sb, md, g.swepro, phases, patch, timeout_sec, setups, assets, grader, art
            )


def _exit_code_script(md: InstanceMetadata, g: ScaleSweGrading) -> tuple[str, dict[str, str]]:
    """The graded script of ``eval_cmd`` / ``f2p_script``, and the files it needs written after
    the patch (the f2p script, over whatever the patch put there)."""
    cd = f"cd {shlex.quote(md.workdir)} || exit 97\n"
    if g.eval_cmd:
        return f"{cd}{g.eval_cmd}\n", {}
    assert g.f2p_script is not None
    if _PYTEST_TESTS.search(g.f2p_script):
        # Run by pytest: Scale-SWE's scripts end in a bare ``pytest.main(...)`` whose status
        # is thrown away, so ``python script.py`` would exit 0 when tests fail. Ids may hold
        # spaces (quoted) or be cut short (their function is run).
        wanted = dict.fromkeys(selectable(t) for t in (F2P_FILE, *g.pass_to_pass))
        ids = " ".join(shlex.quote(t) for t in wanted)
        run = f"python -m pytest -rA -p no:cacheprovider {ids}"
    else:
        run = f"python {F2P_FILE}"
    return f"{cd}{run}\n", {f"{md.workdir}/{F2P_FILE}": g.f2p_script}


async def _read_swepro_assets(sp: SweProSpec) -> tuple[str, str]:
    async def text(inline: str | None, path: str | None) -> str:
        if inline is not None:
            return inline
        assert path is not None
        return await trio.Path(path).read_text(encoding="utf-8")

    return await text(sp.run_script, sp.run_script_path), await text(
        sp.parser_script, sp.parser_script_path
    )


def _setups(md: InstanceMetadata, g: ScaleSweGrading) -> tuple[tuple[str, str], ...]:
    """The setup scripts, in the order they run: each ``set -e`` in the workdir."""
    bodies: list[tuple[str, str]] = []
    if g.swepro is not None and g.swepro.before_repo_set_cmd.strip():
        bodies.append(("before_repo_set_cmd", g.swepro.before_repo_set_cmd))
    if g.pre_commands:
        bodies.append(("pre_commands", "\n".join(g.pre_commands)))
    return tuple((name, f"set -e\ncd {shlex.quote(md.workdir)}\n{body}\n") for name, body in bodies)


def _timed(phases: Phases, staged: AppliedRun, took: float) -> None:
    """The phases of one staged command: ``setup`` and ``apply`` by the sandbox's clocks,
    ``tests`` the rest of its wall time (``apply`` the rest when no script ran)."""
    if staged.setup_failed is not None:  # nothing after the setups ran
        phases.durations["setup"] = took if staged.setup_sec is None else staged.setup_sec
        return
    setup = phases.durations["setup"] = staged.setup_sec or 0.0
    if staged.run is None:
        phases.durations["apply"] = max(took - setup, 0.0)
        return
    apply = phases.durations["apply"] = staged.apply_sec or 0.0
    phases.durations["tests"] = took - setup - apply


def _setup_failed_result(
    md: InstanceMetadata, phases: Phases, grader: str | None, failed: tuple[str, str]
) -> EvalResult:
    return make_result(
        md,
        phases,
        reason=R.SETUP_FAILED,
        grader=grader,
        infra=True,
        detail=failed[0],
        log=failed[1],
    )


def _graded_files_hooks(workdir: str, files: tuple[str, ...]) -> tuple[str | None, str | None]:
    """Shell that archives the graded test files before the ladder (missing ones skipped), and
    shell that puts them back once it applied (dropping ones the patch created): the patch
    must not change the graded tests. (None, None) without files."""
    if not files:
        return None, None
    wd = shlex.quote(workdir)
    archive = f"{EVAL_DIR}/graded.tar"
    names = " ".join(shlex.quote(f) for f in files)
    return (
        f"cd {wd} && tar -cf {archive} --ignore-failed-read -- {names}",
        f"cd {wd} && rm -rf -- {names} && tar -xf {archive}",
    )


async def _grade_exit_code(
    sb: Sandbox,
    md: InstanceMetadata,
    phases: Phases,
    patch: bytes,
    grader: str,
    script: str,
    files: Mapping[str, str],
    timeout_sec: float,
    g: ScaleSweGrading,
    setups: tuple[tuple[str, str], ...],
    art: EvalArtifacts,
) -> EvalResult:
    """``eval_cmd`` / ``f2p_script``: the ladder, then (only when it applied) ``files`` and the
    graded script, in one command (:func:`~._run.apply_then_run`). Exit status 0 means solved.

    The log is parsed for per-test statuses (the row's swebench parser, else pytest's ``-rA``
    summary), which give the F2P/P2P split; the verdict stays the exit status.
    """
    t = time.monotonic()
    staged = await apply_then_run(
        sb,
        md,
        patch,
        script,
        expect_head=None,
        script_path=f"{EVAL_DIR}/{grader}.sh",
        log_path=f"{EVAL_DIR}/{grader}.log",
        budget_sec=timeout_sec,
        env=PLAIN_ENV,
        files=files,
        setups=setups,
    )
    _timed(phases, staged, time.monotonic() - t)
    outcome, r, log = staged.outcome, staged.run, staged.log
    if staged.setup_failed is not None:
        return _setup_failed_result(md, phases, g.grader, staged.setup_failed)
    if r is None:  # the ladder alone ran
        return not_applied_result(md, phases, outcome, grader=grader)
    rung = outcome.rung
    art.eval_script, art.test_output = script, log
    if r.reason == "time_budget":
        return timeout_result(
            md,
            phases,
            rung=rung,
            grader=grader,
            what=grader,
            timeout_sec=timeout_sec,
            log=log,
            exit_code=r.exit_code,
        )
    with phases.phase("parse"):
        status = await trio.to_thread.run_sync(_parse_test_log, g, grader, log)
    f2p: tuple[str, ...] = g.fail_to_pass
    if grader == "f2p_script" and not f2p:
        f2p = tuple(t for t in status if t.startswith(f"{F2P_FILE}::"))
    solved = r.exit_code == 0
    return make_result(
        md,
        phases,
        reason=R.RESOLVED if solved else R.TESTS_FAILED,
        resolved=solved,
        rung=rung,
        grader=grader,
        detail="" if solved else f"{grader} exited with status {r.exit_code}",
        log=log,
        exit_code=r.exit_code,
        tests_status=status,
        f2p=split_counts(status, f2p),
        p2p=split_counts(status, g.pass_to_pass),
    )


def _parse_test_log(g: ScaleSweGrading, grader: str, log: str) -> dict[str, str]:
    if grader == "eval_cmd" and g.log_parser:
        return _swebench_api.parse_log(g.log_parser, log)
    return parse_pytest_summary(log)


def _graded_tests(g: ScaleSweGrading) -> tuple[str, ...]:
    """The tests whose absence from the log means the environment ran none (see _run)."""
    if g.swepro is not None:
        return (*g.swepro.fail_to_pass, *g.swepro.pass_to_pass)
    if g.eval_cmd:
        return (*g.fail_to_pass, *g.pass_to_pass)
    if g.f2p_script and _PYTEST_TESTS.search(g.f2p_script):
        return (*(g.fail_to_pass or (f"{F2P_FILE}::",)), *g.pass_to_pass)
    return ()


async def _grade_swepro(
    sb: Sandbox,
    md: InstanceMetadata,
    sp: SweProSpec,
    phases: Phases,
    patch: bytes,
    timeout_sec: float,
    setups: tuple[tuple[str, str], ...],
    assets: tuple[str, str],
    grader: str | None,
    art: EvalArtifacts,
) -> EvalResult:
    """SWE-bench Pro: its assets written and its setups run, the ladder with the selected test
    files saved before it and put back after it, then the run script on them, in one command
    (:func:`~._run.apply_then_run`); then the parser -> JSON, F2P | P2P <= PASSED."""
    out, err, res = (f"{SWEPRO_DIR}/{n}" for n in ("stdout.log", "stderr.log", "result.json"))
    tests = shlex.quote(",".join(sp.selected_test_files))
    cmd = (
        f"cd {shlex.quote(md.workdir)} && bash {SWEPRO_DIR}/run_script.sh {tests} > {out} 2> {err}"
    )
    save, restore = _graded_files_hooks(md.workdir, sp.selected_test_files)
    t = time.monotonic()
    staged = await apply_then_run(
        sb,
        md,
        patch,
        cmd,
        expect_head=None,
        script_path=f"{EVAL_DIR}/swepro.sh",
        log_path=f"{EVAL_DIR}/swepro.log",
        budget_sec=timeout_sec,
        env=PLAIN_ENV,
        save=save,
        restore=restore,
        setups=setups,
        assets={f"{SWEPRO_DIR}/run_script.sh": assets[0], f"{SWEPRO_DIR}/parser.py": assets[1]},
    )
    _timed(phases, staged, time.monotonic() - t)
    outcome, r = staged.outcome, staged.run
    if staged.setup_failed is not None:
        return _setup_failed_result(md, phases, grader, staged.setup_failed)
    if staged.hook_failed is not None:
        return make_result(
            md,
            phases,
            reason=R.SETUP_FAILED,
            grader="swepro",
            infra=True,
            detail=f"could not {staged.hook_failed[0]} the graded test files",
            log=staged.hook_failed[1],
        )
    if r is None:  # the ladder alone ran
        return not_applied_result(md, phases, outcome, grader="swepro")
    rung = outcome.rung
    stdout = await read_text(sb, out)
    stderr = await read_text(sb, err)
    if stderr:
        stdout += f"\n--- run_script.sh stderr ---\n{stderr}"
    art.eval_script = f"cd {shlex.quote(md.workdir)}\nbash run_script.sh {tests}\n"
    art.test_output = stdout
    if r.reason == "time_budget":
        return timeout_result(
            md,
            phases,
            rung=rung,
            grader="swepro",
            what="run_script.sh",
            timeout_sec=timeout_sec,
            log=stdout,
            exit_code=r.exit_code,
        )
    with phases.phase("parse"):
        p = await sb.exec(
            f"cd {shlex.quote(md.workdir)} && python3 {SWEPRO_DIR}/parser.py {out} {err} {res}",
            user="root",
            timeout=APPLY_TIMEOUT_SEC,
        )
        raw = await read_text(sb, res)
    try:
        parsed = msgspec.json.decode(raw or '{"tests": []}', type=_SweProOutput)
    except msgspec.DecodeError as exc:
        return make_result(
            md,
            phases,
            reason=R.LOG_UNGRADABLE,
            rung=rung,
            grader="swepro",
            detail=f"parser.py (exit {p.exit_code}) wrote no valid result.json: {exc}",
            log=stdout + p.output,
            exit_code=r.exit_code,
        )
    status = {t.name: t.status for t in parsed.tests}
    passed = {name for name, s in status.items() if s == "PASSED"}
    f2p, p2p = set(sp.fail_to_pass), set(sp.pass_to_pass)
    solved = bool(f2p | p2p) and (f2p | p2p) <= passed
    return make_result(
        md,
        phases,
        reason=R.RESOLVED if solved else R.TESTS_FAILED,
        resolved=solved,
        rung=rung,
        grader="swepro",
        detail="" if solved else f"{len((f2p | p2p) - passed)} required tests did not pass",
        log=stdout,
        tests_status=status,
        f2p=(len(f2p & passed), len(f2p)),
        p2p=(len(p2p & passed), len(p2p)),
        exit_code=r.exit_code,
    )
