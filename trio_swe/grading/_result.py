"""``EvalResult``: what grading one patch produced; ``Graded``: it, with what the grading ran
and saw (the eval script, the whole test output, the per-instance report)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

#: The reasons an :class:`EvalResult` can carry.
RESOLVED: Final = "resolved"
TESTS_FAILED: Final = "tests_failed"
PATCH_APPLY_FAILED: Final = "patch_apply_failed"
#: The patch writes where no patch may (``.git/``, outside the work tree); no rung ran.
PATCH_REFUSED: Final = "patch_refused"
TESTS_TIMEOUT: Final = "tests_timeout"
NO_GRADER: Final = "no_grader"
UNEVALUABLE: Final = "unevaluable"
#: The log had no gradable test output (markers missing, suite never ran, spoofed exit code).
LOG_UNGRADABLE: Final = "log_ungradable"
#: Setup in the eval sandbox (pre_commands, before_repo_set_cmd, grader assets) failed.
SETUP_FAILED: Final = "setup_failed"
#: The environment cannot run the row's tests (none of them ran, with the patch or without it):
#: an infrastructure outcome, never a reward of 0 to train on.
EVAL_INFRASTRUCTURE: Final = "eval_infrastructure"

#: Bytes of log kept in :attr:`EvalResult.log_tail`.
LOG_TAIL_CHARS: Final = 4000


class EvalResult(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of grading one patch in a fresh sandbox.

    Task outcomes (tests failing, a patch that does not apply, a suite that times out) are
    results with ``reward == 0.0``. ``infra_failure`` marks outcomes caused by the evaluation
    environment rather than the patch (setup commands failing, an unevaluable row): a trainer
    should drop such a sample instead of training on its zero reward.

    Attributes:
        reward: 1.0 when resolved, else 0.0.
        resolved: every fail-to-pass and pass-to-pass test passed (or the grader said solved).
        applied_cleanly: the patch applied (an empty patch counts as applied).
        reason: ``resolved``, ``tests_failed``, ``patch_apply_failed``, ``patch_refused``
            (the patch writes into ``.git/`` or outside the work tree), ``tests_timeout``,
            ``no_grader``, ``log_ungradable``, ``setup_failed``, ``eval_infrastructure`` or
            ``unevaluable``.
        protocol: the protocol that graded.
        instance_id: the graded instance.
        grader: which grader ran (``swebench``, ``swepro``, ``eval_cmd``, ``f2p_script``).
        apply_method: the ladder rung that applied the patch (``empty``, ``git_apply``,
            ``git_apply_3way``, ``git_apply_reject``, ``patch_fuzz``), None if none did.
        infra_failure: the outcome says nothing about the patch.
        detail: a human-readable explanation of ``reason``.
        tests_status: per-test status where the grader knows it (test id -> PASSED/FAILED/...).
        f2p_passed: fail-to-pass tests that passed, when known.
        f2p_total: fail-to-pass tests graded, when known.
        p2p_passed: pass-to-pass tests that passed, when known.
        p2p_total: pass-to-pass tests graded, when known.
        test_exit_code: the test command's exit status, when known (-1: time budget).
        log_tail: the last characters of the test log.
        durations: seconds per phase (``spec``, ``boot``, ``setup``, ``apply``, ``tests``,
            ``parse``, ``kill``, ``control``, ``total``).
    """

    reward: float
    resolved: bool
    applied_cleanly: bool
    reason: str
    protocol: str
    instance_id: str
    grader: str | None = None
    apply_method: str | None = None
    infra_failure: bool = False
    detail: str = ""
    tests_status: Mapping[str, str] = msgspec.field(default_factory=dict)
    f2p_passed: int | None = None
    f2p_total: int | None = None
    p2p_passed: int | None = None
    p2p_total: int | None = None
    test_exit_code: int | None = None
    log_tail: str = ""
    durations: Mapping[str, float] = msgspec.field(default_factory=dict)


class EvalArtifacts(msgspec.Struct, kw_only=True):
    """What one grading ran and saw, beside its result (the SWE-bench harness's files).

    Filled by the protocol as the grading goes (a grading that ended early leaves the rest
    empty).

    Attributes:
        eval_script: the script that ran the tests.
        test_output: the tests' whole output (stdout and stderr, in order).
        report: the per-instance report in swebench's ``get_eval_report`` format, when known.
    """

    eval_script: str = ""
    test_output: str = ""
    report: dict[str, Any] | None = None


class Graded(msgspec.Struct, frozen=True, kw_only=True):
    """What a protocol's :meth:`~trio_swe.grading.GradingProtocol.grade` returns."""

    result: EvalResult
    artifacts: EvalArtifacts = msgspec.field(default_factory=EvalArtifacts)


def log_tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text``."""
    return text if len(text) <= limit else text[-limit:]
