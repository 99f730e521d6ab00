"""The ``swebench`` protocol: SWE-bench's eval script, graded by swebench's ``get_eval_report``."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Final

import trio

from .._errors import SandboxError
from .._groups import open_private_nursery
from .._lru import Lru
from ..sandbox import Backend
from . import _result as R
from . import _swebench_api
from ._metadata import swebench_metadata
from ._patch import patch_text
from ._result import EvalArtifacts, EvalResult, Graded
from ._run import (
    EVAL_DIR,
    PLAIN_ENV,
    Phases,
    apply_then_run,
    evaluate_patch,
    make_result,
    not_applied_result,
    open_eval_sandbox,
    timeout_result,
)
from ._types import InstanceMetadata, SweBenchGrading

#: TestSpecs kept per protocol object (the most recently used): an episode checks its row
#: before the agent runs (``evaluability_check``) and grades it later with the same metadata.
SPEC_CACHE_SIZE: Final = 512


class SweBenchProtocol:
    """Grades like the SWE-bench harness; needs the optional ``swebench`` package.

    The eval script comes from the row (swebench 5.x rows) or from swebench 4.x's builder
    (classic rows). It runs in a fresh sandbox after the patch ladder, with stdout and stderr
    merged in order into one log, which swebench's ``get_eval_report`` grades.

    The ``TestSpec`` built for a row (by :meth:`evaluability_check` or a grading) is kept for
    the next use of equal metadata (at most :data:`SPEC_CACHE_SIZE`): building depends on
    nothing else, and swebench reads it only.
    """

    name = "swebench"

    def __init__(self) -> None:
        # instance id -> (the metadata it was built for, its TestSpec); checks run in threads.
        self._specs: Lru[str, tuple[InstanceMetadata, Any]] = Lru(SPEC_CACHE_SIZE)
        self._specs_lock = threading.Lock()

    def _cached_spec(self, md: InstanceMetadata) -> Any:
        """The TestSpec built before for metadata equal to ``md``, or None."""
        with self._specs_lock:
            hit = self._specs.get(md.instance_id)
            if hit is None or hit[0] != md:
                return None
            return hit[1]

    def get_metadata(self, row: Mapping[str, Any]) -> InstanceMetadata:
        return swebench_metadata(row, self.name)

    def unavailable_reason(self) -> str | None:
        return _swebench_api.unavailable_reason()

    def evaluability_check(self, md: InstanceMetadata) -> str | None:
        return self._check_and_spec(md)[0]

    async def grade(
        self, backend: Backend, md: InstanceMetadata, patch: str | bytes, *, timeout_sec: float
    ) -> Graded:
        g = md.grading
        return await evaluate_patch(
            lambda p, phases, art: self._evaluate(backend, md, p, timeout_sec, phases, art),
            patch,
            (*g.fail_to_pass, *g.pass_to_pass) if isinstance(g, SweBenchGrading) else (),
        )

    def _check_and_spec(self, md: InstanceMetadata) -> tuple[str | None, Any]:
        """Why ``md`` cannot be graded (:meth:`evaluability_check`), else the ``TestSpec``."""
        reason = _precheck(md)
        if reason is not None:
            return reason, None
        return self._spec(md)

    def _spec(self, md: InstanceMetadata) -> tuple[str | None, Any]:
        """``md``'s TestSpec (cached, or built and cached), or why swebench cannot build it."""
        spec = self._cached_spec(md)
        if spec is not None:
            return None, spec
        try:
            spec = _swebench_api.build_test_spec(md)
        except _swebench_api.SpecBuildError as exc:
            return (f"{exc.reason}:{exc.detail}" if exc.detail else exc.reason), None
        with self._specs_lock:
            self._specs.put(md.instance_id, (md, spec))
        return None, spec

    async def _evaluate(
        self,
        backend: Backend,
        md: InstanceMetadata,
        patch: bytes,
        timeout_sec: float,
        phases: Phases,
        art: EvalArtifacts,
    ) -> EvalResult:
        reason = _precheck(md)
        if reason is not None:
            return _unevaluable(md, phases, reason)
        g = md.grading
        base = g.base_commit.strip().lower() if isinstance(g, SweBenchGrading) else ""
        graded = _Graded()
        # The log is graded in a thread while the sandbox is being killed (the kill is the
        # sandbox context's exit): the nursery waits for both.
        # Usually built already (evaluability_check). If not, it is built in a thread (the
        # first build imports swebench, about a second) while the sandbox boots; a row it
        # cannot build for is unevaluable as before, only its sandbox booted for nothing.
        built = _Built(self._cached_spec(md))
        # A private nursery: the sandbox's errors (a failed boot, SandboxError) come out as
        # themselves, not in an exception group.
        async with open_private_nursery("grading the log") as nursery:
            if built.spec is None:
                nursery.start_soon(built.run, phases, self._spec, md)
            else:
                phases.durations["spec"] = 0.0
            try:
                async with open_eval_sandbox(backend, md, phases) as sb:
                    await built.done.wait()
                    if built.reason is not None:
                        return _unevaluable(md, phases, built.reason)
                    spec = built.spec
                    # Without the steps that cannot change the verdict (see run_script).
                    script = _swebench_api.run_script(spec.eval_script)
                    # The ladder and the eval script are one command: the script runs only once
                    # the ladder applied the patch. The checkout must be the row's base_commit
                    # (checked before any rung): the eval script resets only the test files to
                    # it, so on another commit a gold patch may not apply and an empty one pass.
                    t_run = time.monotonic()
                    staged = await apply_then_run(
                        sb,
                        md,
                        patch,
                        script,
                        expect_head=base or None,
                        script_path=f"{EVAL_DIR}/eval.sh",
                        log_path=f"{EVAL_DIR}/eval.log",
                        budget_sec=timeout_sec,
                        env=PLAIN_ENV,
                    )
                    outcome, run, log = staged.outcome, staged.run, staged.log
                    took = time.monotonic() - t_run
                    if run is None:  # the ladder alone ran
                        phases.durations["apply"] = took
                    else:  # the ladder's own share, as the sandbox timed it; the rest is the tests'
                        phases.durations["apply"] = share = staged.apply_sec or 0.0
                        phases.durations["tests"] = took - share
                    if outcome.wrong_head:
                        return make_result(
                            md,
                            phases,
                            reason=R.UNEVALUABLE,
                            grader="swebench",
                            infra=True,
                            detail=(
                                f"base_commit_mismatch:the eval sandbox's {md.workdir} checks out "
                                f"{outcome.head}, the row's base_commit is {base}"
                            ),
                        )
                    if not outcome.applied or run is None:
                        return not_applied_result(md, phases, outcome, grader="swebench")
                    art.eval_script = script
                    if run.reason != "time_budget":
                        nursery.start_soon(graded.run, phases, spec, md.instance_id, patch, log)
                    t_kill = time.monotonic()
            except SandboxError:
                # A failed boot of a row swebench cannot build for: unevaluable, as if it had
                # been built first (and nothing booted).
                await built.done.wait()
                if built.reason is not None:
                    return _unevaluable(md, phases, built.reason)
                raise
            phases.durations["kill"] = time.monotonic() - t_kill
        art.test_output = log
        if run.reason == "time_budget":
            return timeout_result(
                md,
                phases,
                rung=outcome.rung,
                grader="swebench",
                what="the eval script",
                timeout_sec=timeout_sec,
                log=log,
                exit_code=run.exit_code,
            )
        grade = graded.grade
        if grade is None:
            # A swebench parser crashing on this log: the grader failed, not the patch.
            return make_result(
                md,
                phases,
                reason=R.LOG_UNGRADABLE,
                rung=outcome.rung,
                grader="swebench",
                infra=True,
                detail=f"swebench's grading raised {graded.error}",
                log=log,
            )
        art.report = dict(grade.report)
        common: dict[str, Any] = {
            "rung": outcome.rung,
            "grader": "swebench",
            "log": log,
            "tests_status": grade.tests_status,
            "f2p": (grade.f2p_passed, grade.f2p_total),
            "p2p": (grade.p2p_passed, grade.p2p_total),
            "exit_code": _test_exit_code(log),
        }
        if not grade.gradable:
            why = grade.infra_reason or "no test output between the markers, or a bad marker"
            return make_result(
                md, phases, reason=R.LOG_UNGRADABLE, detail=f"swebench: {why}", **common
            )
        if grade.resolved:
            return make_result(md, phases, reason=R.RESOLVED, resolved=True, **common)
        return make_result(
            md,
            phases,
            reason=R.TESTS_FAILED,
            detail=(
                f"FAIL_TO_PASS {grade.f2p_passed}/{grade.f2p_total}, "
                f"PASS_TO_PASS {grade.p2p_passed}/{grade.p2p_total}"
            ),
            **common,
        )


def _precheck(md: InstanceMetadata) -> str | None:
    """Why ``md`` cannot be graded, found without swebench (no TestSpec built), or None."""
    if md.mismatch:
        return md.mismatch
    g = md.grading
    if not isinstance(g, SweBenchGrading):
        return "protocol_row_mismatch:not_swebench_metadata"
    if not md.image:
        return "missing_image"
    if not g.fail_to_pass and not g.pass_to_pass:
        return "no_graded_tests"  # vacuously RESOLVED_FULL for any patch
    return None


def _unevaluable(md: InstanceMetadata, phases: Phases, reason: str) -> EvalResult:
    return make_result(
        md, phases, reason=R.UNEVALUABLE, grader="swebench", infra=True, detail=reason
    )


class _Built:
    """The TestSpec for a grading: given (cached), or built in a thread (``done`` then)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self.reason: str | None = None
        self.done = trio.Event()
        if spec is not None:
            self.done.set()

    async def run(self, phases: Phases, build: Any, md: InstanceMetadata) -> None:
        try:
            with phases.phase("spec"):
                self.reason, self.spec = await trio.to_thread.run_sync(build, md)
        finally:
            self.done.set()


class _Graded:
    """swebench's verdict on a log, made in a thread (``error`` when swebench raised)."""

    def __init__(self) -> None:
        self.grade: Any = None
        self.error = ""

    async def run(
        self, phases: Phases, spec: Any, instance_id: str, patch: bytes, log: str
    ) -> None:
        with phases.phase("parse"):
            try:
                self.grade = await trio.to_thread.run_sync(
                    _swebench_api.grade_log, spec, instance_id, patch_text(patch), log
                )
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"


def _test_exit_code(log: str) -> int | None:
    """swebench 5.x's recorded test exit code (``>>>>> Test Exit Code: N``), if present."""
    marker = ">>>>> Test Exit Code:"
    for line in reversed(log.splitlines()):
        if line.startswith(marker):
            try:
                return int(line[len(marker) :].strip())
            except ValueError:
                return None
    return None
