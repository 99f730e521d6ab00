"""Boot policy: one boot limiter per trio run, and bounded, jittered retries around a boot.

Every episode of a trio run shares :func:`boot_limiter` (``config.boot.concurrency`` boots at
once); :class:`BootingBackend` wraps the episode's backend so the agent's sandbox and the eval
sandbox boot under the same limit and retry policy, and counts their attempts.
"""

from __future__ import annotations

import logging

import trio

from ._errors import BackendUnavailableError, PermanentBootError, SandboxBootError, SandboxError
from ._retry import Backoff, retry
from .config import SweConfig
from .sandbox import Backend, BackendWrapper, Sandbox, SandboxSpec

__all__ = ["BootingBackend", "boot_limiter"]

logger = logging.getLogger("trio_swe.episode")


_BOOT_LIMITER: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "trio_swe_boot_limiter"
)


def boot_limiter(config: SweConfig) -> trio.CapacityLimiter:
    """The boot limiter shared by every episode of the current trio run.

    Created on first use with ``config.boot.concurrency`` tokens; later calls return the same
    limiter (its ``total_tokens`` can be changed at any time).
    """
    try:
        return _BOOT_LIMITER.get()
    except LookupError:
        limiter = trio.CapacityLimiter(config.boot.concurrency)
        _BOOT_LIMITER.set(limiter)
        return limiter


class BootingBackend(BackendWrapper):
    """Wraps a backend: bounded, jittered retries and the shared limiter around every boot.

    Used for the agent's sandbox and handed to the grader for the eval sandbox, so both boots
    share the limit and the retry policy, and the episode counts their attempts. The wrapped
    backend belongs to the caller (``aclose`` leaves it open).
    """

    def __init__(self, backend: Backend, limiter: trio.CapacityLimiter, config: SweConfig) -> None:
        super().__init__(backend, owns=False)
        self._limiter = limiter
        self._config = config
        self.attempts = 0
        self.retries = 0

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        boot = self._config.boot
        backoff = Backoff(
            attempts=boot.retries + 1, base_sec=boot.backoff_sec, max_sec=boot.backoff_max_sec
        )

        async def attempt(n: int) -> Sandbox:
            self.attempts += 1
            async with self._limiter:
                return await self._backend.create_sandbox(spec, nursery)

        def count_retry(n: int, exc: Exception) -> None:
            self.retries += 1
            logger.warning(
                "boot attempt %d/%d of %s failed: %s", n, backoff.attempts, spec.image, exc
            )

        try:
            return await retry(
                attempt,
                backoff,
                retry_on=(SandboxError,),
                # This machine or this spec cannot do it; retrying will not help.
                give_up_on=(BackendUnavailableError, PermanentBootError),
                on_retry=count_retry,
            )
        except (BackendUnavailableError, PermanentBootError):
            raise
        except SandboxError as exc:
            raise SandboxBootError(
                f"sandbox for {spec.image!r} did not boot after {backoff.attempts} attempts: {exc}"
            ) from exc
