"""The local backend: bubblewrap sandboxes on this machine (the embedded default)."""

from ._backend import LocalBackend, LocalBackendStatistics, WorkspaceMode
from ._process import LocalProcess
from ._sandbox import LocalSandbox, LocalSandboxStatistics

__all__ = [
    "LocalBackend",
    "LocalBackendStatistics",
    "LocalProcess",
    "LocalSandbox",
    "LocalSandboxStatistics",
    "WorkspaceMode",
]
