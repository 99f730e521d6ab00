"""The protocol registry: names -> grading protocols, and the fail-fast availability check."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .._errors import ConfigError, InvalidArgumentError

if TYPE_CHECKING:
    from ..sandbox import Backend
    from ._result import Graded
    from ._types import InstanceMetadata

_NAME_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")


@runtime_checkable
class GradingProtocol(Protocol):
    """What a grading protocol implements. Register one with :func:`register_protocol`.

    Every method but :meth:`grade` is cheap and does no I/O.
    """

    def get_metadata(self, row: Mapping[str, Any]) -> InstanceMetadata:
        """Read a dataset row; raise :class:`~trio_swe.MetadataError` naming a bad field."""
        ...

    def evaluability_check(self, md: InstanceMetadata) -> str | None:
        """A reason the instance cannot be graded, or None; run before an episode starts."""
        ...

    async def grade(
        self, backend: Backend, md: InstanceMetadata, patch: str | bytes, *, timeout_sec: float
    ) -> Graded:
        """Grade ``patch`` (bytes from episodes; str from direct callers) in a fresh sandbox
        from ``md.image``: the result, and what the grading ran and saw (its eval script, the
        whole test output, the per-instance report) for whoever writes the harness's files."""
        ...

    def unavailable_reason(self) -> str | None:
        """Why this protocol cannot run in this process (with the fix), or None."""
        ...


_lock = threading.Lock()
_registry: dict[str, GradingProtocol] = {}


def register_protocol(name: str, protocol: GradingProtocol, *, replace: bool = False) -> None:
    """Make ``protocol`` selectable as ``name`` (e.g. through ``SWE_EVAL_PROTOCOL``).

    Args:
        name: lowercase letters, digits, ``_``, ``.``, ``-``; starts with a letter.
        protocol: an object implementing :class:`GradingProtocol`.
        replace: allow replacing an already registered protocol (including built-ins).

    Raises:
        InvalidArgumentError: a bad name, an object that is not a protocol, or a name already
            taken without ``replace=True``.
    """
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise InvalidArgumentError(
            f"protocol name {name!r}: use lowercase letters, digits, '_', '.', '-'"
        )
    if not isinstance(protocol, GradingProtocol):
        raise InvalidArgumentError(
            f"protocol {name!r}: {type(protocol).__name__} lacks get_metadata/evaluability_check/"
            "grade/unavailable_reason"
        )
    with _lock:
        if name in _registry and not replace:
            raise InvalidArgumentError(
                f"protocol {name!r} is already registered (pass replace=True)"
            )
        _registry[name] = protocol


def available_protocols() -> tuple[str, ...]:
    """The registered protocol names, sorted (a protocol may still be unusable, see
    :func:`require_protocol`)."""
    with _lock:
        return tuple(sorted(_registry))


def get_protocol(name: str) -> GradingProtocol:
    """The protocol registered as ``name``, without checking that it can run.

    Raises:
        ConfigError: no such protocol.
    """
    with _lock:
        protocol = _registry.get(name)
    if protocol is None:
        known = ", ".join(available_protocols()) or "none"
        raise ConfigError(
            f"unknown grading protocol {name!r}; known protocols: {known} "
            "(register another with trio_swe.grading.register_protocol)"
        )
    return protocol


def require_protocol(name: str) -> GradingProtocol:
    """The protocol registered as ``name``, checked to be usable now (fail fast at config load).

    Raises:
        ConfigError: an unknown name, or a protocol that cannot run here (e.g. ``swebench``
            without the swebench package); the message names the fix.
    """
    protocol = get_protocol(name)
    reason = protocol.unavailable_reason()
    if reason is not None:
        raise ConfigError(f"grading protocol {name!r} cannot run: {reason}")
    return protocol
