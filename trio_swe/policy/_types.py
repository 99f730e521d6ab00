"""What every policy is: the ``Policy`` protocol, its output and its counters.

Sampling parameters travel as a mapping in SGLang's names (``max_new_tokens``, ``temperature``,
``top_p``, ``seed``, ...), the lingua franca of agents, the gateway and trainers; each client
translates them to its engine's dialect at its edge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

__all__ = ["Policy", "PolicyOutput", "PolicyStatistics", "StreamingPolicy"]


class PolicyStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of a policy client (``statistics()`` of :class:`SGLangPolicy`, :class:`VLLMPolicy`).

    Attributes:
        requests: generation requests sent.
        aborts: aborts sent to the engine (a cancelled or failed generation).
        errors: requests that failed (transport, HTTP status, malformed reply).
        output_tokens: tokens received.
    """

    requests: int = 0
    aborts: int = 0
    errors: int = 0
    output_tokens: int = 0


class PolicyOutput(msgspec.Struct, frozen=True, kw_only=True):
    """One generation.

    Attributes:
        output_ids: the sampled token ids.
        log_probs: the log-probability of each sampled token under the sampling policy;
            ``len(log_probs) == len(output_ids)``.
        finish_reason: ``"stop"``, ``"length"`` or ``"abort"`` (SGLang's names; other engines'
            are mapped to these).
    """

    output_ids: list[int]
    log_probs: list[float]
    finish_reason: str = "stop"


@runtime_checkable
class Policy(Protocol):
    """Something that continues a token sequence: an SGLang or vLLM server, a trainer's engine
    handle, a scripted replay, ..."""

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        """Sample a continuation of ``input_ids``.

        Args:
            input_ids: the whole prompt as token ids.
            sampling_params: SGLang sampling parameters (``max_new_tokens``, ``temperature``...).
            session_id: a routing key, so one episode's turns reach the same server (prefix cache).

        Raises:
            PolicyError: the server failed.
        """
        ...


@runtime_checkable
class StreamingPolicy(Policy, Protocol):
    """A :class:`Policy` that can also hand over the sampled ids as they are generated."""

    async def generate_stream(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        on_tokens: Callable[[list[int]], Awaitable[None]],
        session_id: str | None = None,
    ) -> PolicyOutput:
        """As :meth:`Policy.generate`, awaiting ``on_tokens(new_ids)`` for each piece of the
        output as it arrives; the output returned holds every id (and its log-prob) that was
        handed over, in order. An exception from ``on_tokens`` ends the generation."""
        ...
