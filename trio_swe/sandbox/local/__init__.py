"""The local backend: bubblewrap sandboxes on this machine (the embedded default)."""

from ._backend import LocalBackend, WorkspaceMode
from ._process import LocalProcess
from ._sandbox import LocalSandbox

__all__ = ["LocalBackend", "LocalProcess", "LocalSandbox", "WorkspaceMode"]
