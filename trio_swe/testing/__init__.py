"""Test tools shipped with trio_swe, for trio_swe's own tests and for users' tests.

:func:`open_envd_server` serves a local, envd-compatible server on loopback: E2B's REST
lifecycle API and envd's process and file APIs, executing real processes in local sandboxes,
with seeded fault injection (:class:`FaultPlan`, :class:`Fault`) from HTTP status codes down to
HTTP/2 frames. Point the official ``e2b`` SDK or :class:`trio_swe.sandbox.e2b.E2BBackend` at it
with :meth:`EnvdServer.sdk_env`. See ``docs/testing.md``. With :class:`SyntheticBackend` its
commands are timers (no processes), and :class:`EnvdServerProcess` runs it in a subprocess: for
measuring a client at 10,000 sandboxes.

The scripted SGLang policy server (:func:`open_scripted_policy_server`) is re-exported from
:mod:`trio_swe.demo`, where it lives.
"""

from ._envd._faults import (
    CANCEL,
    INTERNAL_ERROR,
    NO_ERROR,
    REFUSED_STREAM,
    Fault,
    FaultKind,
    FaultPlan,
)
from ._envd._h2proxy import FaultProxyStatistics
from ._envd._server import EnvdServer, EnvdServerStatistics, open_envd_server
from ._envd._subprocess import EnvdServerProcess
from ._envd._synthetic import SyntheticBackend

__all__ = [
    "CANCEL",
    "INTERNAL_ERROR",
    "NO_ERROR",
    "REFUSED_STREAM",
    "EnvdServer",
    "EnvdServerProcess",
    "EnvdServerStatistics",
    "Fault",
    "FaultKind",
    "FaultPlan",
    "FaultProxyStatistics",
    "SyntheticBackend",
    "open_envd_server",
]

# The scripted policy server belongs to the demo (production code); re-exported for tests.
from ..demo._policy_server import (
    ScriptedCompletion,
    ScriptedPolicyServer,
    open_scripted_policy_server,
    scripted_logprob,
)

__all__ += [
    "ScriptedCompletion",
    "ScriptedPolicyServer",
    "open_scripted_policy_server",
    "scripted_logprob",
]
