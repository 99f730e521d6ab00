"""One failure vocabulary: every error is a TrioSweError from _errors.py and names its abort."""

from __future__ import annotations

import inspect

import pytest

import trio_swe
from trio_swe import _errors, agents, grading, models, policy
from trio_swe.episode import AbortReason

#: The documented table (the _errors module docstring and docs/episodes.md).
TABLE = {
    "SandboxBootError": "boot_failed",
    "BackendUnavailableError": "boot_failed",
    "PermanentBootError": "boot_failed",
    "SandboxError": "sandbox_error",
    "SandboxUnreachableError": "sandbox_error",
    "SandboxNotRunningError": "sandbox_error",
    "DetachedCommandLostError": "sandbox_error",
    "SetupFailedError": "setup_failed",
    "AgentInstallError": "agent_install_failed",
    "PolicyError": "policy_error",
    "PromptTooLongError": "prompt_too_long",
    "PatchFailedError": "patch_failed",
    "EvalInfrastructureError": "eval_infrastructure",
    "TrioSweError": "internal_error",
    "InternalError": "internal_error",
    "InvalidArgumentError": "internal_error",
    "ConfigError": "internal_error",
    "MetadataError": "internal_error",
    "SpecBuildError": "internal_error",
    "SampleDecodeError": "internal_error",
    "SandboxFileNotFoundError": "internal_error",
    "SandboxFileTooLargeError": "internal_error",
    "SandboxNotAFileError": "internal_error",
    "SandboxPermissionError": "internal_error",
    "TemplateError": "internal_error",
    "NotAppendOnlyError": "internal_error",
    "TokenLimitError": "internal_error",
    "SandboxFileTimeoutError": "sandbox_error",
}


def _error_classes() -> dict[str, type[BaseException]]:
    return {
        name: obj
        for name, obj in vars(_errors).items()
        if inspect.isclass(obj) and issubclass(obj, BaseException)
    }


def test_every_error_is_rooted_and_carries_its_abort_reason() -> None:
    classes = _error_classes()
    assert set(classes) == set(TABLE)
    for name, cls in classes.items():
        assert issubclass(cls, _errors.TrioSweError), name
        assert cls.abort_reason == TABLE[name], name  # type: ignore[attr-defined]
        assert cls.abort_reason in AbortReason.__args__  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (policy, "PolicyError"),
        (agents, "AgentInstallError"),
        (grading, "MetadataError"),
        (trio_swe, "PolicyError"),
        (trio_swe, "AgentInstallError"),
        (trio_swe, "SetupFailedError"),
        (trio_swe, "PromptTooLongError"),
        (agents, "PromptTooLongError"),
        (models, "TemplateError"),
        (models, "NotAppendOnlyError"),
    ],
)
def test_errors_exported_elsewhere_are_the_ones_from_errors(module: object, name: str) -> None:
    assert getattr(module, name) is getattr(_errors, name)


def test_swebench_spec_errors_are_trio_swe_errors() -> None:
    from trio_swe.grading._swebench_api import SpecBuildError

    assert SpecBuildError is _errors.SpecBuildError
    err = SpecBuildError("not_a_swebench_row", "detail")
    assert isinstance(err, trio_swe.TrioSweError)
    assert (err.reason, err.detail, str(err)) == (
        "not_a_swebench_row",
        "detail",
        "not_a_swebench_row: detail",
    )
