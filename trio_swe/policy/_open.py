"""A policy client by its API's name (``SWE_POLICY_API``), and the sampling options users set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

from .._errors import ConfigError
from ._sglang import SGLangPolicy
from ._vllm import VLLMPolicy

__all__ = ["POLICY_APIS", "PolicyApi", "SamplingOptions", "open_policy"]

PolicyApi = Literal["sglang", "vllm", "vllm-completions"]
#: The policy APIs :func:`open_policy` speaks: SGLang's ``/generate``, vLLM's
#: ``/inference/v1/generate``, vLLM's (or any OpenAI-compatible engine's) ``/v1/completions``.
POLICY_APIS: Final[tuple[str, ...]] = ("sglang", "vllm", "vllm-completions")


class SamplingOptions(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The sampling parameters a run sets for every policy call (``trio-swe run --temperature``).

    ``None`` leaves a parameter to the agent's and the engine's defaults. ``seed`` is the run's
    base seed: each episode of a group gets its own (see
    :func:`~trio_swe.rollout.run_rollouts`), and each turn adds its index, so no two calls of a
    run share a seed.

    The recorded log-probs are the engine's: at ``temperature`` T != 1 (or with top-p/top-k),
    they are those of the distribution sampled from only where the engine reports processed
    log-probs (vLLM ``--logprobs-mode processed_logprobs``; SGLang's default); a trainer
    re-scoring at T must divide its logits by T too.
    """

    temperature: float | None = msgspec.field(default=None)
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        t, p, k, m, seed = self.temperature, self.top_p, self.top_k, self.max_new_tokens, self.seed
        bad = [
            (name, value)
            for name, value, ok in (
                ("temperature", t, t is None or t >= 0),
                ("top_p", p, p is None or 0 < p <= 1),
                ("top_k", k, k is None or k == -1 or k >= 1),
                ("max_new_tokens", m, m is None or m >= 1),
                ("seed", seed, seed is None or seed >= 0),
            )
            if not ok
        ]
        if bad:
            name, value = bad[0]
            raise ConfigError(f"sampling option {name}={value!r} is out of range")

    def params(self) -> dict[str, Any]:
        """The options that are set, as sampling parameters (SGLang's names)."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if v is not None}


def open_policy(
    api: str,
    url: str,
    *,
    vocab_size: int | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> SGLangPolicy | VLLMPolicy:
    """The client of the policy server at ``url`` speaking ``api`` (one of :data:`POLICY_APIS`).

    Use it as an async context manager, as the client itself.

    Raises:
        ConfigError: an unknown API name (the message lists the known ones).
    """
    if api == "sglang":
        return SGLangPolicy(url, defaults=defaults)
    if api == "vllm":
        return VLLMPolicy(url, route="generate", vocab_size=vocab_size, defaults=defaults)
    if api == "vllm-completions":
        return VLLMPolicy(url, route="completions", vocab_size=vocab_size, defaults=defaults)
    raise ConfigError(f"policy API {api!r} is unknown; choose one of {', '.join(POLICY_APIS)}")
