"""``BackendWrapper``: the one base for backends that wrap another (boot retries, Ray leases,
Ray ownership), so each says only what it changes.

It forwards the :class:`~trio_swe.sandbox.Backend` protocol (``name``, ``create_sandbox``,
``statistics``, ``aclose``) and the optional image hooks (``image_for``, ``check_image``:
what the wrapped backend boots for a row is what the wrapper boots).
"""

from __future__ import annotations

from typing import Any, TypeVar

import trio

from ._images import check_image, image_for
from ._protocol import Backend, Sandbox
from ._types import BackendStatistics, SandboxSpec

_S = TypeVar("_S", bound=BackendStatistics)


class BackendWrapper:
    """A backend that forwards everything to ``backend``; subclasses override what they change.

    Args:
        backend: the wrapped backend.
        owns: ``aclose`` closes the wrapped backend too (False: it belongs to the caller).
    """

    def __init__(self, backend: Backend, *, owns: bool = True) -> None:
        self._backend = backend
        self._owns = owns
        self.name = backend.name

    @property
    def wrapped(self) -> Backend:
        """The backend this one wraps."""
        return self._backend

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        return await self._backend.create_sandbox(spec, nursery)

    def statistics(self) -> BackendStatistics:
        return self._backend.statistics()

    def wrapped_statistics(self, cls: type[_S], **own: Any) -> _S:
        """A ``cls`` (a subclass with an ``inner`` field) of the wrapped backend's counters,
        the wrapped backend's own statistics as ``inner``, and the wrapper's ``own`` fields."""
        inner = self._backend.statistics()
        fields: dict[str, Any] = {
            "created": inner.created,
            "killed": inner.killed,
            "live": inner.live,
            "boot_failures": inner.boot_failures,
            "inner": inner,
        }
        return cls(**fields, **own)

    async def aclose(self) -> None:
        if not self._owns:
            return
        close = getattr(self._backend, "aclose", None)
        if close is not None:
            await close()

    def image_for(self, md: Any) -> str:
        return image_for(self._backend, md)

    def check_image(self, image: str, *, commit: str | None) -> str | None:
        return check_image(self._backend, image, commit=commit)
