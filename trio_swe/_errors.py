"""The error hierarchy of trio_swe, rooted at :class:`TrioSweError`, and its failure vocabulary.

Infrastructure failures (the sandbox could not be booted, reached or kept alive; the policy
server failed; an agent could not be installed) are exceptions, and each class carries the
:data:`AbortReason` an episode ends with when it escapes (``abort_reason``), so
:func:`trio_swe.run_episode` maps every one of them with a single ``except``. A trainer drops an
aborted episode instead of training on a fake zero reward. Task outcomes (a command exiting
non-zero, a patch that does not apply, a test suite that times out) are *results*, never
exceptions: an :class:`~trio_swe.ExecResult` says why a command ended (``ExecReason``), an
:class:`~trio_swe.EvalResult` why grading gave its reward. The three vocabularies side by side
are in ``docs/episodes.md`` ("Failure vocabulary").

============================  =======================  =========================================
exception                     ``abort_reason``         raised when
============================  =======================  =========================================
SandboxBootError              ``boot_failed``          a sandbox did not boot (after retries)
PermanentBootError            ``boot_failed``          the spec can never boot (not retried)
BackendUnavailableError       ``boot_failed``          the backend cannot work on this machine
SandboxError (others)         ``sandbox_error``        a sandbox died or stopped answering
SetupFailedError              ``setup_failed``         pre-commands or workspace preparation
AgentInstallError             ``agent_install_failed`` a CLI agent could not be installed
PolicyError                   ``policy_error``         the policy server failed
PromptTooLongError            ``prompt_too_long``      the first prompt cannot fit the context
PatchFailedError              ``patch_failed``         the patch could not be taken
EvalInfrastructureError       ``eval_infrastructure``  the eval sandbox or its setup failed
TrioSweError (others)         ``internal_error``       a bug or a misuse; the traceback is logged
============================  =======================  =========================================
"""

from __future__ import annotations

from typing import ClassVar, Literal

__all__ = [
    "AbortReason",
    "AgentInstallError",
    "BackendUnavailableError",
    "ConfigError",
    "DetachedCommandLostError",
    "EvalInfrastructureError",
    "InternalError",
    "InvalidArgumentError",
    "MetadataError",
    "NotAppendOnlyError",
    "PatchFailedError",
    "PermanentBootError",
    "PolicyError",
    "PromptTooLongError",
    "SampleDecodeError",
    "SandboxBootError",
    "SandboxError",
    "SandboxFileNotFoundError",
    "SandboxFileTooLargeError",
    "SandboxNotAFileError",
    "SandboxNotRunningError",
    "SandboxPermissionError",
    "SandboxUnreachableError",
    "SetupFailedError",
    "SpecBuildError",
    "TemplateError",
    "TokenLimitError",
    "TrioSweError",
]

#: Why an episode was aborted. All are infrastructure outcomes, never the agent's fault.
AbortReason = Literal[
    "unevaluable",  # the row cannot be graded (checked before anything boots)
    "boot_failed",  # the agent sandbox did not boot after the retries
    "setup_failed",  # pre-commands or workspace preparation failed
    "sandbox_error",  # a sandbox died or became unreachable mid-episode
    "agent_install_failed",  # a CLI agent could not be installed
    "policy_error",  # the policy server failed
    "prompt_too_long",  # the first prompt does not fit the context: never sent (a row property)
    "patch_failed",  # the patch could not be taken from the sandbox
    "eval_infrastructure",  # the eval sandbox or its setup failed
    "guard_timeout",  # the outer guard (agent + setup + eval + headroom) fired
    "internal_error",  # a bug; the traceback is logged
]


class TrioSweError(Exception):
    """Base class of every error raised by trio_swe.

    Attributes:
        abort_reason: the reason an episode is aborted with when this error escapes its phases
            (a class attribute; ``internal_error`` for errors that are not infrastructure).
    """

    abort_reason: ClassVar[AbortReason] = "internal_error"


class InternalError(TrioSweError):
    """Several failures at once that no single error stands for (raised ``from`` their group)."""


class InvalidArgumentError(TrioSweError, ValueError):
    """A caller-supplied value (tag, path, user, env name, workdir...) was refused before anything ran."""


class ConfigError(TrioSweError, ValueError):
    """Configuration (environment variables, protocol names, missing optional packages) is unusable."""


class SandboxError(TrioSweError):
    """An infrastructure failure of a sandbox: not a task outcome."""

    abort_reason: ClassVar[AbortReason] = "sandbox_error"


class BackendUnavailableError(SandboxError):
    """The backend cannot work on this machine (e.g. ``bwrap`` is not installed)."""

    abort_reason: ClassVar[AbortReason] = "boot_failed"


class SandboxBootError(SandboxError):
    """The sandbox could not be created."""

    abort_reason: ClassVar[AbortReason] = "boot_failed"


class PermanentBootError(SandboxBootError):
    """The sandbox can never boot from this spec: a missing image, a commit that does not
    exist, a workdir the backend cannot use. Raised on the first attempt and never retried."""


class SandboxUnreachableError(SandboxError):
    """The sandbox did not answer (transport failures that outlived the retries)."""


class SandboxNotRunningError(SandboxError):
    """The sandbox is gone (killed, reclaimed, or died while a command ran)."""


class DetachedCommandLostError(SandboxError):
    """A detached command's launcher vanished without writing its done marker."""


class SandboxFileNotFoundError(TrioSweError, FileNotFoundError):
    """``read_file`` of a path that does not exist in the sandbox."""


class SandboxPermissionError(TrioSweError, PermissionError):
    """The sandbox refused an access the caller asked for: permissions, or a read-only file
    system (``write_file`` to ``/etc/passwd`` as a user, to a read-only mount...). The same on
    every backend; a caller's error, not an infrastructure failure."""


class SandboxFileTooLargeError(TrioSweError, ValueError):
    """``read_file`` of a file larger than its ``max_bytes`` (nothing past the cap was kept).

    Attributes:
        path: the file.
        max_bytes: the cap.
        size: the file's size when known (None when it was only seen to exceed the cap).
    """

    def __init__(self, path: str, max_bytes: int, size: int | None = None) -> None:
        what = f"{size} bytes" if size is not None else "more bytes"
        super().__init__(
            f"read_file {path!r}: {what} than max_bytes={max_bytes} allows "
            "(pass a larger max_bytes, or None for no cap)"
        )
        self.path = path
        self.max_bytes = max_bytes
        self.size = size


class SandboxNotAFileError(TrioSweError, ValueError):
    """``read_file`` of something that is not a regular file (a directory, a device, a FIFO,
    a socket) without ``special=True``.

    Attributes:
        path: the path.
        kind: what it is (``"directory"``, ``"character device"``, ``"fifo"``...).
    """

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(
            f"read_file {path!r}: a {kind}, not a regular file "
            "(pass special=True to read it anyway, bounded by max_bytes)"
        )
        self.path = path
        self.kind = kind


class PolicyError(TrioSweError):
    """The policy server failed (unreachable, HTTP error, malformed reply): infrastructure."""

    abort_reason: ClassVar[AbortReason] = "policy_error"


class PromptTooLongError(TrioSweError):
    """The agent's first prompt does not fit the context (``max_context_tokens``, or the
    agent's default cap): nothing was sent to the policy. A property of the row, not a passing
    failure (slime gets ``Status.FAILED``).

    Attributes:
        tokens: the prompt's length, or a lower bound of it when it was not tokenized.
        limit: the cap it exceeds.
    """

    abort_reason: ClassVar[AbortReason] = "prompt_too_long"

    def __init__(self, tokens: int, limit: int, *, exact: bool) -> None:
        what = f"{tokens} tokens" if exact else f"at least {tokens} tokens (not tokenized)"
        super().__init__(f"the first prompt is {what}; the limit is {limit}")
        self.tokens = tokens
        self.limit = limit


class AgentInstallError(TrioSweError):
    """A CLI agent could not be installed in the sandbox after its retries (infrastructure)."""

    abort_reason: ClassVar[AbortReason] = "agent_install_failed"


class SetupFailedError(TrioSweError):
    """The agent's workspace could not be prepared (pre-commands failed, no base commit)."""

    abort_reason: ClassVar[AbortReason] = "setup_failed"


class PatchFailedError(TrioSweError):
    """The agent's patch could not be taken from its sandbox."""

    abort_reason: ClassVar[AbortReason] = "patch_failed"


class EvalInfrastructureError(TrioSweError):
    """Grading could not run: the eval sandbox failed, or its setup did (not the patch's fault)."""

    abort_reason: ClassVar[AbortReason] = "eval_infrastructure"


class MetadataError(TrioSweError, ValueError):
    """A dataset row cannot be graded: a field is missing or malformed.

    Attributes:
        field: the dotted name of the offending field (e.g. ``"metadata.remote_env_info.repo"``).
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class SpecBuildError(TrioSweError):
    """SWE-bench's eval script could not be built for a row.

    Attributes:
        reason: a short machine-readable string (``swebench_import_failed``, ...).
        detail: the human-readable rest.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class TemplateError(ConfigError):
    """A checkpoint's chat template cannot be used as trio_swe needs it (it drops the tools,
    its tool calls do not parse back, an assistant turn has no stable end): at start-up."""


class NotAppendOnlyError(TrioSweError):
    """Appending these messages would change tokens already in a token history (the template
    re-renders earlier turns, e.g. Qwen3 drops their reasoning once a user message follows).
    The caller forks (:meth:`trio_swe.models.TokenHistory.fork`): a new history from the whole
    conversation, instead of pretending the old tokens are still the prompt."""


class TokenLimitError(TrioSweError):
    """A text or conversation holds more tokens than a cap allows; it was refused before it was
    tokenized whole (its length in characters alone says so, or the pieces tokenized so far).

    Attributes:
        tokens: a lower bound of its length in tokens (the exact count was never needed).
        limit: the cap.
    """

    def __init__(self, tokens: int, limit: int) -> None:
        super().__init__(f"at least {tokens} tokens, over the cap of {limit}")
        self.tokens = tokens
        self.limit = limit


class SampleDecodeError(TrioSweError, ValueError):
    """Bytes or a file that do not hold a valid encoded :class:`~trio_swe.Sample`."""
