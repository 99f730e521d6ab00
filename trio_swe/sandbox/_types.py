"""Plain data shared by every backend: results, specs, reasons."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

import msgspec

#: ``read_file``'s default cap: a larger file raises ``SandboxFileTooLargeError``.
DEFAULT_READ_MAX_BYTES: Final = 64 * 1024 * 1024

#: ``read_file``'s and ``write_file``'s default time bound (seconds): past it they raise
#: ``SandboxFileTimeoutError``. Generous for the default cap (64 MiB) over a slow link; a file
#: that blocks on read (``/proc/kmsg``) never ends without it.
DEFAULT_FILE_TIMEOUT_SEC: Final = 120.0

#: Exit code reported when a command outlived its time budget (slime's convention).
EXIT_TIME_BUDGET_EXCEEDED: Final = -1

#: Why an :class:`ExecResult` ended the way it did.
#:
#: * ``"exit"``: the command exited by itself; ``exit_code`` is its status. A command killed by a
#:   signal reports ``128 + signum`` (the shell's convention) with this reason too, because a shell
#:   cannot tell the two apart.
#: * ``"signal"``: the process was killed by a signal and the backend saw it directly.
#: * ``"time_budget"``: ``exec_and_wait`` overran its budget; ``exit_code == -1``.
#: * ``"timeout"``: a short ``exec`` overran its ``timeout``; ``exit_code == -1``.
ExecReason = Literal["exit", "signal", "time_budget", "timeout"]


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a command run in a sandbox produced.

    Attributes:
        exit_code: the command's exit status, or ``-1`` when a budget or timeout ended it.
        output: stdout and stderr merged in arrival order, decoded as UTF-8 with replacement.
        reason: why it ended, see :data:`ExecReason`.
        duration_sec: wall time from start to the moment the caller learnt the result.
        output_truncated: ``output`` is not the whole output: a tail of a longer one, or (e2b)
            a part emitted while a cut stream was re-attached, or read back from the call's end
            record, was lost (envd does not replay output).
        tag: the detached-execution tag, when the command ran through ``exec_and_wait``.
    """

    exit_code: int
    output: str = ""
    reason: ExecReason = "exit"
    duration_sec: float = 0.0
    output_truncated: bool = False
    tag: str | None = None

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0."""
        return self.exit_code == 0 and self.reason == "exit"


class SandboxStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What every sandbox's ``statistics()`` reports; each backend returns a subclass.

    A frozen snapshot, as trio's ``statistics()`` give: later calls return new objects.

    Attributes:
        execs: short ``exec`` calls made (a detached command is several of them).
    """

    execs: int


class BackendStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What every backend's ``statistics()`` reports; each backend returns a subclass.

    Attributes:
        created: sandboxes booted.
        killed: sandboxes killed.
        live: sandboxes booted and not yet killed (0 once every ``open_sandbox`` has left).
        boot_failures: boots that failed (each retry of a boot counts).
    """

    created: int
    killed: int
    live: int
    boot_failures: int


class ResourceLimits(msgspec.Struct, frozen=True, kw_only=True):
    """Resource limits of one sandbox, where the backend enforces them (docker: cgroups).

    Attributes:
        memory_bytes: memory (swap included); the kernel OOM-kills past it.
        cpus: CPU time as a number of cores (``0.5`` is half of one).
        pids: processes and threads at once.
    """

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = None


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What to boot. Backends interpret ``image`` in their own way.

    Attributes:
        image: local backend: a directory, ``path@commit`` of a git repository, or an OCI image
            (``registry/name:tag``, ``oci:DIR[:TAG]``, ``docker-archive:FILE``); e2b: a
            template; docker: an image reference (or, with a ``base_image``, a directory).
        workdir: where the repository lives inside the sandbox.
        env: environment variables of every command in the sandbox.
        network: False cuts the sandbox off the network (where the backend can).
        ttl_sec: how long the provider may keep an abandoned sandbox alive (e2b's timeout).
        metadata: free-form labels (instance id, episode id) for the provider's bookkeeping.
        limits: resource limits (``None``: the backend's defaults).
    """

    image: str
    workdir: str = "/testbed"
    env: Mapping[str, str] = msgspec.field(default_factory=dict)
    network: bool = True
    ttl_sec: float = 3600.0
    metadata: Mapping[str, str] = msgspec.field(default_factory=dict)
    limits: ResourceLimits | None = None
