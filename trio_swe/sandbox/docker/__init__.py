"""The Docker backend: one container per sandbox, through the Docker Engine API over httpx."""

from ._backend import DockerBackend, DockerBackendStatistics
from ._engine import EngineError
from ._sandbox import DockerSandbox, DockerSandboxStatistics
from ._wire import PullProgress

__all__ = [
    "DockerBackend",
    "DockerBackendStatistics",
    "DockerSandbox",
    "DockerSandboxStatistics",
    "EngineError",
    "PullProgress",
]
