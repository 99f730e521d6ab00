"""The error hierarchy of trio_swe, rooted at :class:`TrioSweError`.

Infrastructure failures (the sandbox could not be booted, reached or kept alive) derive from
:class:`SandboxError`; a trainer drops the episode instead of training on a fake zero reward.
Task outcomes (a command exiting non-zero, a patch that does not apply, a test suite that times
out) are *results*, never exceptions.
"""

from __future__ import annotations


class TrioSweError(Exception):
    """Base class of every error raised by trio_swe."""


class InvalidArgumentError(TrioSweError, ValueError):
    """A caller-supplied value (tag, path, user, env name, workdir...) was refused before anything ran."""


class ConfigError(TrioSweError, ValueError):
    """Configuration (environment variables, protocol names, missing optional packages) is unusable."""


class SandboxError(TrioSweError):
    """An infrastructure failure of a sandbox: not a task outcome."""


class BackendUnavailableError(SandboxError):
    """The backend cannot work on this machine (e.g. ``bwrap`` is not installed)."""


class SandboxBootError(SandboxError):
    """The sandbox could not be created."""


class SandboxUnreachableError(SandboxError):
    """The sandbox did not answer (transport failures that outlived the retries)."""


class SandboxNotRunningError(SandboxError):
    """The sandbox is gone (killed, reclaimed, or died while a command ran)."""


class DetachedCommandLostError(SandboxError):
    """A detached command's launcher vanished without writing its done marker."""


class SandboxFileNotFoundError(TrioSweError, FileNotFoundError):
    """``read_file`` of a path that does not exist in the sandbox."""


class MetadataError(TrioSweError, ValueError):
    """A dataset row cannot be graded: a field is missing or malformed.

    Attributes:
        field: the dotted name of the offending field (e.g. ``"metadata.remote_env_info.repo"``).
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class SampleDecodeError(TrioSweError, ValueError):
    """Bytes or a file that do not hold a valid encoded :class:`~trio_swe.Sample`."""
