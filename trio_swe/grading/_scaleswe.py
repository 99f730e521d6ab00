"""The ``scaleswe`` protocol: SWE-bench Pro run scripts, ``eval_cmd`` or a Scale-SWE f2p script."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..sandbox import Backend
    from ._result import EvalResult
    from ._types import InstanceMetadata


class ScaleSweProtocol:
    """Grades with the row's own grader; needs nothing beyond the sandbox."""

    def get_metadata(self, row: Mapping[str, Any]) -> InstanceMetadata:
        raise NotImplementedError

    def evaluability_check(self, md: InstanceMetadata) -> str | None:
        raise NotImplementedError

    async def run_evaluation(
        self, backend: Backend, md: InstanceMetadata, patch: str, *, timeout_sec: float
    ) -> EvalResult:
        raise NotImplementedError

    def unavailable_reason(self) -> str | None:
        return None
