"""The E2B backend: E2B's REST lifecycle API and envd's Connect-RPC API, native on trio.

Use :class:`E2BBackend` with :func:`trio_swe.open_sandbox`::

    async with E2BBackend() as backend:  # E2B_API_KEY from the environment
        async with open_sandbox(backend, "my-template") as sb:
            print((await sb.exec("uname -a")).output)
"""

from ._backend import E2BBackend, E2BBackendStatistics
from ._lanes import PoolStatistics
from ._retry import RetryPolicy
from ._sandbox import E2BSandbox, E2BSandboxStatistics

__all__ = [
    "E2BBackend",
    "E2BBackendStatistics",
    "E2BSandbox",
    "E2BSandboxStatistics",
    "PoolStatistics",
    "RetryPolicy",
]
