"""What the verl and SkyRL adapters share: the trainer's asyncio handle as a trio_swe policy,
the agent built around it, and one episode run from asyncio.

A trainer owns its engine and hands its rollout code an asyncio handle to it. The episode runs in
trio (a guest of the trainer's loop, :mod:`trio_swe.aio`), so its policy calls cross back into
asyncio with :func:`trio_swe.aio.await_asyncio`: :class:`AsyncioPolicy` wraps a coroutine
function returning a :class:`~trio_swe.policy.PolicyOutput` and checks every reply, so nothing the
engine sends unchecked becomes a sample.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from .. import aio
from .._close import aclose_quietly
from .._errors import ConfigError, PolicyError
from ..agents import Agent, BashAgent, CliAgent, create_agent
from ..config import SweConfig
from ..episode import EpisodeResult, run_episode
from ..grading import InstanceMetadata
from ..models import load_tokenizer
from ..policy import PolicyOutput, PolicyStatistics
from ..sandbox import Backend, create_backend

__all__ = [
    "AsyncioGenerate",
    "AsyncioPolicy",
    "build_agent",
    "check_output",
    "run_trainer_episode",
    "vllm_params",
]

#: ``(prompt ids, vLLM sampling parameters, session id) -> PolicyOutput``, awaited in asyncio.
AsyncioGenerate = Callable[[list[int], dict[str, Any], "str | None"], Awaitable[PolicyOutput]]

#: Sampling parameters vLLM's ``SamplingParams`` takes that an episode may set (SGLang's names on
#: the left where they differ). Anything else an agent passes (SGLang-only knobs) is dropped:
#: verl builds ``SamplingParams(**params)``, which refuses unknown names.
_RENAMED: Final = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
_VLLM_NAMES: Final = frozenset(
    {
        "max_tokens",
        "min_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
    }
)
#: A log-prob above this is not a log-probability (float32 rounding stays far below it).
_LOGPROB_MAX: Final = 1e-4


def vllm_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's names for an episode's sampling parameters (SGLang's names), unknown ones dropped.

    ``no_stop_trim`` becomes ``include_stop_str_in_output``; ``n`` and ``logprobs`` are the
    caller's to set (one sequence, the sampled token's log-prob).
    """
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = _RENAMED.get(key, key)
        if key == "no_stop_trim":
            out["include_stop_str_in_output"] = bool(value)
        elif name in _VLLM_NAMES and value is not None:
            out[name] = value
    return out


def sglang_params(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """A trainer's sampling parameters (vLLM's names) in SGLang's, as episodes take them; the
    trainer's own ``logprobs``/``n`` switches are dropped (the adapters always ask for one
    sequence with its log-probs)."""
    back = {v: k for k, v in _RENAMED.items()}
    return {
        back.get(k, k): v
        for k, v in (params or {}).items()
        if k not in ("logprobs", "n") and v is not None
    }


def check_output(
    where: str,
    ids: Sequence[int],
    log_probs: Sequence[float] | None,
    finish_reason: str,
    vocab_size: int | None = None,
) -> PolicyOutput:
    """A :class:`PolicyOutput` of a trainer's reply, after the checks every reply passes.

    Raises:
        PolicyError: no log-probs, one per id missing, an id outside the vocabulary, or a
            log-prob that is not one (naming ``where``).
    """
    if log_probs is None:
        raise PolicyError(f"{where}: the reply has no log-probs (the trainer must request them)")
    if len(ids) != len(log_probs):
        raise PolicyError(f"{where}: {len(ids)} token ids but {len(log_probs)} log-probs")
    for i, (tid, lp) in enumerate(zip(ids, log_probs, strict=True)):
        if not isinstance(tid, int) or tid < 0 or (vocab_size is not None and tid >= vocab_size):
            raise PolicyError(
                f"{where}: token id {tid!r} at position {i} is outside the vocabulary"
            )
        if not (isinstance(lp, (int, float)) and math.isfinite(lp) and lp <= _LOGPROB_MAX):
            raise PolicyError(f"{where}: log-prob {lp!r} of token {i} is not one")
    return PolicyOutput(
        output_ids=list(ids),
        log_probs=[float(x) for x in log_probs],
        finish_reason=finish_reason,
    )


class AsyncioPolicy:
    """A :class:`~trio_swe.policy.Policy` whose calls run a trainer's asyncio coroutine.

    Called from trio code started by :func:`trio_swe.aio.run` (an episode run by an adapter):
    each call translates the parameters to vLLM's names and awaits ``generate`` on the host loop
    (:func:`trio_swe.aio.await_asyncio`). Cancelling the episode cancels the asyncio call.
    """

    def __init__(self, generate: AsyncioGenerate, *, name: str) -> None:
        self._generate = generate
        self.name = name
        self._stats = {"requests": 0, "aborts": 0, "errors": 0, "output_tokens": 0}

    def statistics(self) -> PolicyStatistics:
        """Calls made, calls cancelled, failures and output tokens received."""
        return PolicyStatistics(**self._stats)

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: Mapping[str, Any],
        *,
        session_id: str | None = None,
    ) -> PolicyOutput:
        """See :meth:`~trio_swe.policy.Policy.generate`."""
        import trio

        self._stats["requests"] += 1
        try:
            out = await aio.await_asyncio(
                self._generate, list(input_ids), vllm_params(sampling_params), session_id
            )
        except trio.Cancelled:
            self._stats["aborts"] += 1
            raise
        except PolicyError:
            self._stats["errors"] += 1
            raise
        except Exception as exc:
            # The trainer's handle failed (its server, its transport): a policy failure, which
            # the episode turns into an abort, never a sample.
            self._stats["errors"] += 1
            raise PolicyError(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        self._stats["output_tokens"] += len(out.output_ids)
        return out


def build_agent(config: SweConfig, policy: Any) -> Agent:
    """The agent ``config.agent`` names, generating through ``policy`` (the trainer's engine).

    ``bash`` uses the checkpoint's chat template and tool calls when ``SWE_TOKENIZER`` names the
    checkpoint, else the byte tokenizer; the CLI agents (``claude-code``, ``codex``,
    ``qwen-code``, ``opencode``, ``mini-swe-agent``) reach ``policy`` through the gateway.

    Raises:
        ConfigError: another agent (it would not call the trainer's engine), or a CLI agent
            without ``SWE_TOKENIZER``.
    """
    name = config.agent
    if name == "bash":
        return BashAgent.from_config(config, policy)
    if name in ("claude-code", "codex", "qwen-code", "opencode", "mini-swe-agent"):
        if not config.bash.tokenizer:
            raise ConfigError(
                f"SWE_AGENT={name} records its turns through the gateway, which renders them "
                "with the checkpoint's chat template: set SWE_TOKENIZER to the checkpoint folder"
            )
        return CliAgent(
            name,
            policy=policy,
            tokenizer=load_tokenizer(config.bash.tokenizer),
            sampling_params=config.policy.sampling_params(),
            tool_parser=config.bash.tool_parser,
        )
    create_agent(config)  # an unknown name: the registry's error lists the known ones
    raise ConfigError(
        f"SWE_AGENT={name!r} does not generate through the trainer's engine; the trainer "
        "adapters run bash, claude-code, codex, qwen-code, opencode or mini-swe-agent"
    )


_LOCAL: list[Backend] = []  # one LocalBackend per process: it is not bound to a trio run


async def run_trainer_episode(
    md: InstanceMetadata,
    policy: Any,
    *,
    config: SweConfig,
    backend: Backend | None = None,
    sampling_params: Mapping[str, Any] | None = None,
    episode_id: str | None = None,
) -> EpisodeResult:
    """From asyncio: one episode of ``config.agent`` on ``md`` through ``policy``.

    ``backend`` defaults to ``config.backend`` (``SWE_BACKEND``): the local backend is shared by
    the process; another one is opened for this episode and closed after it. Cancelling the
    awaiter kills the episode's sandboxes before the cancellation completes.
    """

    async def episode() -> EpisodeResult:
        import trio

        if config.bash.tokenizer:
            await trio.to_thread.run_sync(load_tokenizer, config.bash.tokenizer)
        agent = build_agent(config, policy)
        own: Backend | None = None
        chosen = backend
        if chosen is None:
            if config.backend == "local":
                if not _LOCAL:
                    _LOCAL.append(create_backend("local"))
                chosen = _LOCAL[0]
            else:
                chosen = own = create_backend(config.backend)
        try:
            return await run_episode(
                md,
                agent,
                backend=chosen,
                config=config,
                episode_id=episode_id,
                sampling_params=sampling_params,
            )
        finally:
            await aclose_quietly([agent, own], timeout_sec=30.0)

    return await aio.run(episode)
