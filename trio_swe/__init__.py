"""trio_swe: coding-agent episodes for RL on software-engineering tasks, on trio.

The public surface is re-exported here; everything else is private (modules starting with ``_``)
or lives in a documented subpackage (``trio_swe.grading``, ``trio_swe.testing``,
``trio_swe.agents``, ``trio_swe.aio``, ``trio_swe.demo``, ``trio_swe.integrations``).

The names load on first use (PEP 562 ``__getattr__``): ``import trio_swe`` imports none of the
modules behind them, so a program (the ``trio-swe`` command among them, which must be quick to
take Ctrl-C over: :mod:`trio_swe.cli._entry`) pays only for what it touches. Type checkers read
the imports under ``TYPE_CHECKING``; :data:`_ORIGINS` is the same list for the interpreter
(tests/test_public_names.py checks that the two agree).
"""

# Not `from typing import TYPE_CHECKING`: importing typing costs more than the rest of this file,
# and every tool that reads the block below knows the name.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from . import aio
    from ._errors import (
        AbortReason,
        AgentInstallError,
        BackendUnavailableError,
        ConfigError,
        DetachedCommandLostError,
        EvalInfrastructureError,
        InternalError,
        InvalidArgumentError,
        PatchFailedError,
        PermanentBootError,
        PolicyError,
        PromptTooLongError,
        SandboxBootError,
        SandboxError,
        SandboxFileNotFoundError,
        SandboxFileTimeoutError,
        SandboxFileTooLargeError,
        SandboxNotAFileError,
        SandboxNotRunningError,
        SandboxPermissionError,
        SandboxUnreachableError,
        SetupFailedError,
        TrioSweError,
    )
    from .config import SweConfig
    from .episode import EpisodeResult, PhaseTimings, run_episode
    from .grading import (
        EvalResult,
        InstanceMetadata,
        MetadataError,
        available_protocols,
        evaluability_check,
        get_metadata,
        register_protocol,
        require_protocol,
        run_evaluation,
    )
    from .integrations.slime import generate
    from .results import ResultsWriter, group_advantages, read_results
    from .rollout import GroupMember, open_rollouts, plan_groups, run_rollouts
    from .sandbox import (
        EXIT_TIME_BUDGET_EXCEEDED,
        Backend,
        ExecResult,
        ResourceLimits,
        Sandbox,
        SandboxSpec,
        exec_and_wait,
        open_sandbox,
        wait_cleanups,
    )
    from .sandbox.docker import DockerBackend
    from .sandbox.e2b import E2BBackend
    from .sandbox.local import LocalBackend
    from .trajectory import (
        BuilderStatistics,
        Sample,
        SampleBuilder,
        SampleDecodeError,
        TurnRecord,
        TurnRecorder,
        decode_sample,
        decode_sample_json,
        encode_sample,
        encode_sample_json,
        read_samples,
        truncate,
        write_samples,
    )

#: Where each public name lives (a submodule, relative to this package); ``aio`` and the other
#: subpackages are found by name.
_ORIGINS: dict[str, tuple[str, ...]] = {
    "._errors": (
        "AbortReason",
        "AgentInstallError",
        "BackendUnavailableError",
        "ConfigError",
        "DetachedCommandLostError",
        "EvalInfrastructureError",
        "InternalError",
        "InvalidArgumentError",
        "PatchFailedError",
        "PermanentBootError",
        "PolicyError",
        "PromptTooLongError",
        "SandboxBootError",
        "SandboxError",
        "SandboxFileNotFoundError",
        "SandboxFileTimeoutError",
        "SandboxFileTooLargeError",
        "SandboxNotAFileError",
        "SandboxNotRunningError",
        "SandboxPermissionError",
        "SandboxUnreachableError",
        "SetupFailedError",
        "TrioSweError",
    ),
    ".config": ("SweConfig",),
    ".episode": (
        "EpisodeResult",
        "PhaseTimings",
        "run_episode",
    ),
    ".grading": (
        "EvalResult",
        "InstanceMetadata",
        "MetadataError",
        "available_protocols",
        "evaluability_check",
        "get_metadata",
        "register_protocol",
        "require_protocol",
        "run_evaluation",
    ),
    ".integrations.slime": ("generate",),
    ".results": (
        "ResultsWriter",
        "group_advantages",
        "read_results",
    ),
    ".rollout": (
        "GroupMember",
        "open_rollouts",
        "plan_groups",
        "run_rollouts",
    ),
    ".sandbox": (
        "EXIT_TIME_BUDGET_EXCEEDED",
        "Backend",
        "ExecResult",
        "ResourceLimits",
        "Sandbox",
        "SandboxSpec",
        "exec_and_wait",
        "open_sandbox",
        "wait_cleanups",
    ),
    ".sandbox.docker": ("DockerBackend",),
    ".sandbox.e2b": ("E2BBackend",),
    ".sandbox.local": ("LocalBackend",),
    ".trajectory": (
        "BuilderStatistics",
        "Sample",
        "SampleBuilder",
        "SampleDecodeError",
        "TurnRecord",
        "TurnRecorder",
        "decode_sample",
        "decode_sample_json",
        "encode_sample",
        "encode_sample_json",
        "read_samples",
        "truncate",
        "write_samples",
    ),
}

_NAMED = {name: module for module, names in _ORIGINS.items() for name in names}

__version__ = "0.1.0"

__all__ = [
    "EXIT_TIME_BUDGET_EXCEEDED",
    "AbortReason",
    "AgentInstallError",
    "Backend",
    "BackendUnavailableError",
    "BuilderStatistics",
    "ConfigError",
    "DetachedCommandLostError",
    "DockerBackend",
    "E2BBackend",
    "EpisodeResult",
    "EvalInfrastructureError",
    "EvalResult",
    "ExecResult",
    "GroupMember",
    "InstanceMetadata",
    "InternalError",
    "InvalidArgumentError",
    "LocalBackend",
    "MetadataError",
    "PatchFailedError",
    "PermanentBootError",
    "PhaseTimings",
    "PolicyError",
    "PromptTooLongError",
    "ResourceLimits",
    "ResultsWriter",
    "Sample",
    "SampleBuilder",
    "SampleDecodeError",
    "Sandbox",
    "SandboxBootError",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxFileTimeoutError",
    "SandboxFileTooLargeError",
    "SandboxNotAFileError",
    "SandboxNotRunningError",
    "SandboxPermissionError",
    "SandboxSpec",
    "SandboxUnreachableError",
    "SetupFailedError",
    "SweConfig",
    "TrioSweError",
    "TurnRecord",
    "TurnRecorder",
    "aio",
    "available_protocols",
    "decode_sample",
    "decode_sample_json",
    "encode_sample",
    "encode_sample_json",
    "evaluability_check",
    "exec_and_wait",
    "generate",
    "get_metadata",
    "group_advantages",
    "open_rollouts",
    "open_sandbox",
    "plan_groups",
    "read_results",
    "read_samples",
    "register_protocol",
    "require_protocol",
    "run_episode",
    "run_evaluation",
    "run_rollouts",
    "truncate",
    "wait_cleanups",
    "write_samples",
]


if not TYPE_CHECKING:  # a type checker reads the imports above, not this

    def __getattr__(name: str) -> object:
        """Import the public ``name`` (or the submodule ``name``) on first use, then keep it."""
        import importlib

        module = _NAMED.get(name)
        if module is not None:
            value = getattr(importlib.import_module(module, __name__), name)
        elif name.startswith("__"):  # dunder probes (``__wrapped__``...): never a submodule
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        else:
            try:
                value = importlib.import_module(f"{__name__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":  # the submodule exists; its import failed
                    raise
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
