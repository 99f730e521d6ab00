"""Sandboxes: the protocol, ``open_sandbox``, backends and detached execution."""

from ._open import open_sandbox
from ._protocol import Backend, Sandbox
from ._types import EXIT_TIME_BUDGET_EXCEEDED, ExecReason, ExecResult, SandboxSpec

__all__ = [
    "EXIT_TIME_BUDGET_EXCEEDED",
    "Backend",
    "ExecReason",
    "ExecResult",
    "Sandbox",
    "SandboxSpec",
    "open_sandbox",
]
