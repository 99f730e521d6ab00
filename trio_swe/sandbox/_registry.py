"""Backends by name: ``SWE_BACKEND`` / ``--backend`` -> a :class:`~trio_swe.Backend`.

One registry serves ``trio-swe run``, slime's ``generate`` and anyone else who picks a backend by
name. Each entry imports its backend lazily (E2B's client is not loaded for a local run).
Register another with :func:`register_backend` (the name becomes a valid ``SWE_BACKEND``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from .._errors import ConfigError, InvalidArgumentError
from ._protocol import Backend

__all__ = ["available_backends", "create_backend", "open_backend", "register_backend"]

#: Upper bound on closing a backend's connections on the way out (shielded).
CLOSE_TIMEOUT_SEC = 30.0

#: Builds a backend from keyword options (``LocalBackend(**options)``, ...).
BackendFactory = Callable[..., Backend]


def _local(**options: Any) -> Backend:
    from .local import LocalBackend

    return LocalBackend(**options)


def _e2b(**options: Any) -> Backend:
    from .e2b import E2BBackend

    return E2BBackend(**options)  # E2B_* and SSL_CERT_FILE from the environment by default


def _docker(**options: Any) -> Backend:
    from .docker import DockerBackend

    return DockerBackend(**options)  # DOCKER_HOST, else /var/run/docker.sock


_FACTORIES: dict[str, BackendFactory] = {"local": _local, "e2b": _e2b, "docker": _docker}


def register_backend(name: str, factory: BackendFactory, *, replace: bool = False) -> None:
    """Make ``factory`` selectable as ``SWE_BACKEND=<name>``.

    Raises:
        InvalidArgumentError: the name is empty, or taken (pass ``replace=True``).
    """
    if not name or not name.strip():
        raise InvalidArgumentError("backend name must be non-empty")
    if name in _FACTORIES and not replace:
        raise InvalidArgumentError(f"backend {name!r} is already registered (pass replace=True)")
    _FACTORIES[name] = factory


def available_backends() -> tuple[str, ...]:
    """Registered backend names, in registration order (``local`` first)."""
    return tuple(_FACTORIES)


def _choices() -> str:
    return "choose one of " + ", ".join(repr(n) for n in _FACTORIES)


def create_backend(name: str, options: Mapping[str, Any] | None = None) -> Backend:
    """Build the backend named ``name`` with ``options`` (its constructor's keyword arguments).

    Raises:
        ConfigError: no backend has that name (the message names the choices).
    """
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ConfigError(f"backend {name!r}: {_choices()}") from None
    return factory(**dict(options or {}))


@asynccontextmanager
async def open_backend(
    name: str, options: Mapping[str, Any] | None = None
) -> AsyncIterator[Backend]:
    """The backend named ``name``, closed (its connections) on the way out of the block.

    Example::

        async with open_backend("e2b") as backend:
            async with open_sandbox(backend, "my-template") as sb:
                ...
    """
    backend = create_backend(name, options)
    try:
        yield backend
    finally:
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + CLOSE_TIMEOUT_SEC
            await backend.aclose()
