"""The Docker backend: one container per sandbox, through the Docker Engine API over httpx."""

from ._backend import DockerBackend
from ._engine import EngineError
from ._sandbox import DockerSandbox
from ._wire import PullProgress

__all__ = ["DockerBackend", "DockerSandbox", "EngineError", "PullProgress"]
