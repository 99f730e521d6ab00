"""trio_swe: coding-agent episodes for RL on software-engineering tasks, on trio.

The public surface is re-exported here; everything else is private (modules starting with ``_``)
or lives in a documented subpackage (``trio_swe.grading``, ``trio_swe.testing``,
``trio_swe.agents``, ``trio_swe.aio``, ``trio_swe.demo``, ``trio_swe.integrations``).
"""

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
from .results import ResultsWriter, read_results
from .rollout import open_rollouts, run_rollouts
from .sandbox import (
    EXIT_TIME_BUDGET_EXCEEDED,
    Backend,
    ExecResult,
    ResourceLimits,
    Sandbox,
    SandboxSpec,
    exec_and_wait,
    open_sandbox,
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
    decode_sample,
    decode_sample_json,
    encode_sample,
    encode_sample_json,
    read_samples,
    truncate,
    write_samples,
)

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
    "open_rollouts",
    "open_sandbox",
    "read_results",
    "read_samples",
    "register_protocol",
    "require_protocol",
    "run_episode",
    "run_evaluation",
    "run_rollouts",
    "truncate",
    "write_samples",
]
