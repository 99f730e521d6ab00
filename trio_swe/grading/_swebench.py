"""The ``swebench`` protocol: SWE-bench's eval script, graded by swebench's ``get_eval_report``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from . import _swebench_api

if TYPE_CHECKING:
    from ..sandbox import Backend
    from ._result import EvalResult
    from ._types import InstanceMetadata


class SweBenchProtocol:
    """Grades like the SWE-bench harness; needs the optional ``swebench`` package."""

    def get_metadata(self, row: Mapping[str, Any]) -> InstanceMetadata:
        raise NotImplementedError

    def evaluability_check(self, md: InstanceMetadata) -> str | None:
        raise NotImplementedError

    async def run_evaluation(
        self, backend: Backend, md: InstanceMetadata, patch: str, *, timeout_sec: float
    ) -> EvalResult:
        raise NotImplementedError

    def unavailable_reason(self) -> str | None:
        return _swebench_api.unavailable_reason()
