"""verl's agent loop: one trio_swe episode per dataset row, on verl's own engine.

Requires ``verl`` (``pip install 'trio-swe[verl]'``, verl 0.9.1); importing this module imports
it, and registers :class:`TrioSweAgentLoop` under the name ``trio_swe`` (verl's ``@register``).
Choose it per row with an ``agent_name`` column, or for every row with
``actor_rollout_ref.rollout.agent.default_agent_loop=trio_swe``; or name it in the YAML file of
``actor_rollout_ref.rollout.agent.agent_loop_config_path``::

    - name: trio_swe
      _target_: trio_swe.integrations.verl.TrioSweAgentLoop
      swe_env: {SWE_AGENT: bash, SWE_BACKEND: docker}   # optional, over the process environment

``run(sampling_params, **row)`` reads the row (:func:`trio_swe.grading.get_metadata`; the
``SWE_TRAIN_PROTOCOL`` protocol), runs the episode through :mod:`trio_swe.aio` (trio as a guest
of verl's asyncio loop), generates every turn through the ``LLMServerClient`` verl passes (so
verl's engine serves the episode, and the gateway forwards a CLI agent's calls to it), and returns
an ``AgentLoopOutput`` (see :mod:`trio_swe.integrations._convert` for the rules; an aborted
episode is a one-token row with ``response_mask == [0]``, ``reward_score == 0.0`` and
``reward_extra_info["trio_swe_aborted"] == 1.0``, which verl carries into the batch's
non-tensor fields).

:class:`VLLMServerClient` is an ``LLMServerClient`` for a vLLM served apart from verl (its
``/inference/v1/generate`` route, ``--enable-scale-out``).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import httpx
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from .._errors import MetadataError
from ..config import SweConfig, replace_option
from ..grading import get_metadata
from ..policy import PolicyOutput
from ..sandbox import Backend
from ._convert import TrainerRow, failed_row, to_trainer_row
from ._trainer import AsyncioPolicy, check_output, run_trainer_episode, sglang_params

__all__ = ["TrioSweAgentLoop", "VLLMServerClient", "to_agent_loop_output"]


def _rollout(config: Any) -> Any:
    return config.actor_rollout_ref.rollout


def swe_config_for(trainer_config: Any, swe_env: dict[str, str] | None = None) -> SweConfig:
    """The episode configuration: the environment (``SWE_*``, with ``swe_env`` over it), then
    verl's own settings where it leaves them open: the tokenizer of the trained checkpoint
    (``actor_rollout_ref.model.path``, when a folder) and the context cap
    (``rollout.prompt_length + rollout.response_length``)."""
    environ = {**os.environ, **{str(k): str(v) for k, v in (swe_env or {}).items()}}
    config = SweConfig.from_env(environ)
    path = str(trainer_config.actor_rollout_ref.model.get("path") or "")
    if not config.bash.tokenizer and path and os.path.isdir(path):
        config = replace_option(config, "bash.tokenizer", path)
    rollout = _rollout(trainer_config)
    if not config.episode.max_context_tokens:
        cap = int(rollout.prompt_length) + int(rollout.response_length)
        config = replace_option(config, "episode.max_context_tokens", cap)
    return config


def to_agent_loop_output(row: TrainerRow) -> AgentLoopOutput:
    """verl's ``AgentLoopOutput`` of a trainer row."""
    metrics = AgentLoopMetrics(
        generate_sequences=row.metrics.get("time_agent_policy_sec", 0.0),
        tool_calls=row.metrics.get("time_agent_commands_sec", 0.0),
        compute_score=row.metrics.get("time_eval_sec", 0.0),
    )
    return AgentLoopOutput(
        prompt_ids=row.prompt_ids,
        response_ids=row.response_ids,
        response_mask=row.loss_mask,
        response_logprobs=row.log_probs,
        reward_score=row.reward,
        num_turns=row.num_turns,
        metrics=metrics,
        extra_fields={
            # Same keys on every row: verl stacks them into the batch's non-tensor fields.
            "reward_extra_info": {
                "trio_swe_aborted": 1.0 if row.aborted else 0.0,
                "trio_swe_permanent": 1.0 if row.permanent else 0.0,
                "trio_swe_trained_tokens": float(row.trained_tokens),
            },
            "trio_swe": {
                "instance_id": row.instance_id,
                "episode_id": row.episode_id,
                "stop_reason": row.stop_reason,
                "abort_reason": row.abort_reason,
                "dropped_samples": row.dropped_samples,
                "metrics": dict(row.metrics),
            },
        },
    )


def _finish(stop_reason: str | None, n: int, max_tokens: Any) -> str:
    # verl says "completed" for both vLLM's "stop" and "length": a full budget was a length stop.
    if stop_reason in ("aborted", "abort"):
        return "abort"
    if isinstance(max_tokens, int) and n >= max_tokens:
        return "length"
    return "stop"


@register("trio_swe")
class TrioSweAgentLoop(AgentLoopBase):  # type: ignore[misc]  # verl is untyped
    """One trio_swe episode per row, generating through verl's ``LLMServerClient``.

    Args (beyond verl's own, which its worker passes):
        swe_env: ``SWE_*`` variables over the process environment (from the YAML entry).
        swe_config: the episode configuration itself (overrides ``swe_env``).
        backend: where sandboxes come from (default: ``SWE_BACKEND``).
    """

    def __init__(
        self,
        trainer_config: Any,
        server_manager: Any,
        tokenizer: Any,
        processor: Any,
        dataset_cls: Any,
        data_config: Any,
        hf_model_type: str | None = None,
        *,
        swe_env: dict[str, str] | None = None,
        swe_config: SweConfig | None = None,
        backend: Backend | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            trainer_config,
            server_manager,
            tokenizer,
            processor,
            dataset_cls,
            data_config,
            hf_model_type=hf_model_type,
            **kwargs,
        )
        self.swe_config = swe_config or swe_config_for(self.config, swe_env)
        self.backend = backend

    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        if pad is None:
            pad = getattr(self.tokenizer, "eos_token_id", None)
        return int(pad or 0)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One episode for the row ``kwargs``; see the module's docstring."""
        rollout = _rollout(self.config)
        config = self.swe_config
        try:
            md = get_metadata(kwargs, config.protocol_for(evaluation=False))
        except MetadataError as exc:
            return to_agent_loop_output(
                failed_row(f"metadata:{exc}", pad_id=self._pad_id(), permanent=True)
            )
        episode_id = f"trio-swe-{uuid.uuid4().hex}"
        client = self.server_manager

        async def generate(
            ids: list[int], params: dict[str, Any], session_id: str | None
        ) -> PolicyOutput:
            # One sticky request id per episode: verl routes a session to one server.
            request_id = session_id or episode_id
            out: TokenOutput = await client.generate(
                request_id, prompt_ids=ids, sampling_params={**params, "logprobs": True}
            )
            where = f"verl {type(client).__name__} (request {request_id})"
            finish = _finish(out.stop_reason, len(out.token_ids), params.get("max_tokens"))
            return check_output(where, out.token_ids, out.log_probs, finish)

        policy = AsyncioPolicy(generate, name=f"verl {type(client).__name__}")
        result = await run_trainer_episode(
            md,
            policy,
            config=config,
            backend=self.backend,
            sampling_params=sglang_params(sampling_params),
            episode_id=episode_id,
        )
        row = to_trainer_row(
            result,
            pad_id=self._pad_id(),
            max_prompt_tokens=int(rollout.prompt_length),
            max_response_tokens=int(rollout.response_length),
        )
        return to_agent_loop_output(row)


class VLLMServerClient(LLMServerClient):  # type: ignore[misc]  # verl is untyped
    """verl's ``LLMServerClient`` for a vLLM served apart from verl (no Ray, no load balancer).

    ``generate`` posts to ``{url}/inference/v1/generate`` (vLLM with ``--enable-scale-out``)
    and answers a ``TokenOutput`` the way verl's own vLLM server does: ``max_tokens`` defaults
    to what the rollout's lengths leave, ``logprobs=True`` asks for the sampled token's
    log-prob, ``stop_reason`` is ``"completed"`` or ``"aborted"``. Serve vLLM with
    ``--logprobs-mode processed_logprobs`` for log-probs of the distribution sampled from.
    """

    def __init__(
        self,
        config: Any,
        url: str,
        *,
        model: str | None = None,
        timeout_sec: float | None = None,
    ) -> None:
        super().__init__(config, load_balancer_handle=None)
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_sec = timeout_sec
        self._client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=self.timeout_sec))
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP client (on the loop that used it)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        **kwargs: Any,
    ) -> TokenOutput:
        """See verl's ``LLMServerClient.generate`` (text only: no images, videos or audio)."""
        rollout = _rollout(self.config)
        params = dict(sampling_params)
        want_logprobs = bool(params.pop("logprobs", False))
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if max_tokens is None:
            max_tokens = min(
                int(rollout.response_length),
                int(rollout.prompt_length) + int(rollout.response_length) - len(prompt_ids),
            )
        params["max_tokens"] = max(1, int(max_tokens))
        params["logprobs"] = 0 if want_logprobs else None
        params["n"] = 1
        body: dict[str, Any] = {
            "request_id": f"{request_id}-{uuid.uuid4().hex[:8]}",
            "token_ids": list(prompt_ids),
            "sampling_params": params,
        }
        if self.model:
            body["model"] = self.model
        response = await self._http().post(f"{self.url}/inference/v1/generate", json=body)
        if response.status_code >= 400:
            raise RuntimeError(
                f"vLLM at {self.url} POST /inference/v1/generate answered HTTP "
                f"{response.status_code}: {response.text[:300]}"
            )
        choice = response.json()["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        content = (choice.get("logprobs") or {}).get("content") if want_logprobs else None
        log_probs = [float(e["logprob"]) for e in content] if content is not None else None
        finish = choice.get("finish_reason")
        return TokenOutput(
            token_ids=ids,
            log_probs=log_probs,
            stop_reason="aborted" if finish == "abort" else "completed",
        )
