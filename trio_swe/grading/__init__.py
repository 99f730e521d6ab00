"""Grading: instance metadata, selectable protocols (``scaleswe``, ``swebench``), EvalResult.

Grading always happens in a fresh sandbox booted from the instance image; only the patch carries
over from the agent's sandbox. See ``docs/grading.md`` for the row shapes and protocols.
"""

from __future__ import annotations

from .._errors import MetadataError
from ._api import (
    check_rows,
    evaluability_check,
    expected_commit,
    get_metadata,
    grade,
    local_checkouts,
    resolve_image,
    run_evaluation,
)
from ._harness import HarnessOutputs
from ._patch import diff_script
from ._registry import (
    GradingProtocol,
    available_protocols,
    register_protocol,
    require_protocol,
)
from ._result import EvalArtifacts, EvalResult, Graded
from ._shims import local_backend_shims
from ._types import (
    InstanceMetadata,
    ScaleSweGrading,
    SweBenchGrading,
    SweProSpec,
)

__all__ = [
    "EvalArtifacts",
    "EvalResult",
    "Graded",
    "GradingProtocol",
    "HarnessOutputs",
    "InstanceMetadata",
    "MetadataError",
    "ScaleSweGrading",
    "SweBenchGrading",
    "SweProSpec",
    "available_protocols",
    "check_rows",
    "diff_script",
    "evaluability_check",
    "expected_commit",
    "get_metadata",
    "grade",
    "local_backend_shims",
    "local_checkouts",
    "register_protocol",
    "require_protocol",
    "resolve_image",
    "run_evaluation",
]
