"""trio_swe: coding-agent episodes for RL on software-engineering tasks, on trio.

The public surface is re-exported here; everything else is private (modules starting with ``_``)
or lives in a documented subpackage (``trio_swe.grading``, ``trio_swe.testing``, ``trio_swe.aio``).
"""

from ._errors import (
    BackendUnavailableError,
    ConfigError,
    DetachedCommandLostError,
    InvalidArgumentError,
    SandboxBootError,
    SandboxError,
    SandboxFileNotFoundError,
    SandboxNotRunningError,
    SandboxUnreachableError,
    TrioSweError,
)

# --- sandbox (issue 2) ---
from .sandbox import (
    EXIT_TIME_BUDGET_EXCEEDED,
    Backend,
    ExecResult,
    Sandbox,
    SandboxSpec,
    open_sandbox,
)

# --- sandbox/local (issue 2) ---
# --- sandbox/detached (issue 2) ---
from .sandbox import exec_and_wait

# --- trajectory (issue 3) ---
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

# --- grading (issue 4) ---
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
# --- e2b (issue 5) ---
from .sandbox.e2b import E2BBackend

# --- episode / rollout (issue 6) ---
from . import aio
from .config import SweConfig
from .episode import EpisodeResult, PhaseTimings, run_episode
from .rollout import generate, run_rollouts

__version__ = "0.1.0"
