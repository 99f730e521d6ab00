"""Sandboxes: the protocol, ``open_sandbox``, backends and detached execution."""

from ._detached import exec_and_wait, wait_cleanups
from ._images import ImageMap, ImageSource, check_image, image_for
from ._open import open_sandbox
from ._protocol import Backend, Sandbox
from ._registry import available_backends, create_backend, open_backend, register_backend
from ._types import (
    DEFAULT_READ_MAX_BYTES,
    EXIT_TIME_BUDGET_EXCEEDED,
    BackendStatistics,
    ExecReason,
    ExecResult,
    ResourceLimits,
    SandboxSpec,
    SandboxStatistics,
)
from ._validate import check_command
from ._wrapper import BackendWrapper

__all__ = [
    "DEFAULT_READ_MAX_BYTES",
    "EXIT_TIME_BUDGET_EXCEEDED",
    "Backend",
    "BackendStatistics",
    "BackendWrapper",
    "ExecReason",
    "ExecResult",
    "ImageMap",
    "ImageSource",
    "ResourceLimits",
    "Sandbox",
    "SandboxSpec",
    "SandboxStatistics",
    "available_backends",
    "check_command",
    "check_image",
    "create_backend",
    "exec_and_wait",
    "image_for",
    "open_backend",
    "open_sandbox",
    "register_backend",
    "wait_cleanups",
]
