"""slime's custom generate function: ``--custom-generate-function-path trio_swe.generate``.

``generate(args, sample, sampling_params, evaluation=False)`` runs one episode for a slime
sample and returns slime samples. slime is an asyncio program, so the episode runs in trio
through :mod:`trio_swe.aio` (trio as a guest of slime's loop). This module sits above that bridge:
control goes down into :func:`trio_swe.aio.run` and never back up.

What the calls of one trio run share (agents with their HTTP clients, the E2B backend with its
connection pools) is kept in a RunVar and closed by the last call out (:class:`_RunShared`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from .. import aio
from .._close import aclose_quietly
from .._errors import ConfigError, MetadataError
from ..agents import Agent, create_agent
from ..config import BACKENDS, RayOptions, SweConfig, replace_option
from ..episode import EpisodeResult, run_episode
from ..grading import get_metadata
from ..models import load_tokenizer
from ..sandbox import Backend, create_backend
from ._convert import PERMANENT_ABORT_REASONS as PERMANENT_ABORT_REASONS
from ._convert import abort_text, is_permanent_abort

__all__ = ["GENERATE_BACKENDS", "generate"]

#: The values of ``SWE_BACKEND`` that :func:`generate` accepts.
GENERATE_BACKENDS: tuple[str, ...] = BACKENDS

_LOCAL_BACKEND: list[Backend] = []  # one LocalBackend per process (not bound to a trio run)


class _RunShared:
    """What the generate() calls of one trio run share, closed by the last call out.

    :func:`trio_swe.aio.run` keeps one trio run per asyncio loop while calls are active and ends
    it when the last one returns. Agents (their policy's HTTP client) and the E2B backend (its
    HTTP/2 connection pools) are bound to the trio run that opened them, so concurrent calls
    share them, and the last call out closes them inside that run, before it ends; a later call
    starts a fresh set in the next run.
    """

    def __init__(self) -> None:
        self.users = 0
        self.agents: dict[tuple[str, str, str, str], Agent] = {}
        self.backends: dict[str, Backend] = {}

    def agent(self, config: SweConfig, url: str) -> Agent:
        key = (config.agent, url, config.bash.tokenizer, config.bash.tool_parser)
        if key not in self.agents:
            self.agents[key] = create_agent(_with_policy_url(config, url))
        return self.agents[key]

    def backend(self, name: str) -> Backend:
        if name == "local":
            # Not bound to a trio run: one per process.
            if not _LOCAL_BACKEND:
                _LOCAL_BACKEND.append(create_backend("local"))
            return _LOCAL_BACKEND[0]
        if name not in self.backends:
            # Bound to this trio run (E2B's connection pools): closed by the last call out.
            self.backends[name] = create_backend(name)
        return self.backends[name]

    async def aclose(self) -> None:
        resources: list[Backend | Agent] = [*self.agents.values(), *self.backends.values()]
        self.agents, self.backends = {}, {}
        await aclose_quietly(resources, timeout_sec=30.0)


_SHARED: trio.lowlevel.RunVar[_RunShared | None] = trio.lowlevel.RunVar(
    "trio_swe_generate_shared", default=None
)


@asynccontextmanager
async def _run_shared() -> AsyncIterator[_RunShared]:
    shared = _SHARED.get()
    if shared is None:
        shared = _RunShared()
        _SHARED.set(shared)
    shared.users += 1
    try:
        yield shared
    finally:
        shared.users -= 1
        if shared.users == 0:
            _SHARED.set(None)  # a call arriving while this closes starts a fresh set
            await shared.aclose()


def _policy_url(args: Any, config: SweConfig) -> str:
    ip = getattr(args, "sglang_router_ip", None)
    port = getattr(args, "sglang_router_port", None)
    if ip and port:
        return f"http://{ip}:{port}"
    return config.bash.policy_url


# PERMANENT_ABORT_REASONS (shared with the verl and SkyRL adapters, _convert.py): abort
# reasons that are properties of the row, not passing failures: slime gets ``Status.FAILED`` for
# them (its fully-async mode requeues ``ABORTED`` samples, forever for a row that can never be
# graded). A ``boot_failed`` caused by a :class:`~trio_swe.PermanentBootError` (a missing image)
# is ``FAILED`` too.


def _slime_abort(sample: Any, reason: str, instance_id: str) -> Any:
    """slime's convention for a sample that must not be trained on: ``ABORTED``, or ``FAILED``
    when the reason (the part before ``:``) is in :data:`PERMANENT_ABORT_REASONS`."""
    out = copy.copy(sample)
    out.tokens = [0, 0]
    out.response = ""
    out.response_length = 1
    out.loss_mask = [0]
    out.rollout_log_probs = [0.0]
    out.reward = 0.0
    out.remove_sample = True
    out.metadata = {**(getattr(sample, "metadata", None) or {}), "abort_reason": reason}
    out.metadata["instance_id"] = instance_id
    permanent = is_permanent_abort(reason)
    _set_status(out, "failed" if permanent else "aborted")
    return out


def _set_status(sample: Any, status: str) -> None:
    enum = getattr(type(sample), "Status", None)
    if enum is not None and status == "failed" and not hasattr(enum, "FAILED"):
        status = "aborted"  # a slime without Status.FAILED
    sample.status = getattr(enum, status.upper()) if enum is not None else status


def _with_slime_args(config: SweConfig, args: Any) -> SweConfig:
    """The trainer's own settings over the environment's: the tokenizer of
    ``args.hf_checkpoint`` (the checkpoint being trained), and ``args.rollout_max_context_len``
    as the context cap when ``SWE_MAX_CONTEXT_TOKENS`` is unset."""
    checkpoint = getattr(args, "hf_checkpoint", None)
    if checkpoint:
        path = os.fspath(checkpoint)
        if not os.path.isdir(path):
            raise ConfigError(f"args.hf_checkpoint {path!r} is not a checkpoint directory")
        config = replace_option(config, "bash.tokenizer", path)
    max_len = getattr(args, "rollout_max_context_len", None)
    if not config.episode.max_context_tokens and isinstance(max_len, int) and max_len > 0:
        config = replace_option(config, "episode.max_context_tokens", max_len)
    return config


async def generate(
    args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool = False
) -> Any:
    """slime's custom generate function: one episode for ``sample``, from asyncio.

    The protocol is ``SWE_EVAL_PROTOCOL`` when ``evaluation`` else ``SWE_TRAIN_PROTOCOL``; the
    agent is ``SWE_AGENT`` (the bash agent calls SGLang at ``args.sglang_router_ip:port``); the
    backend is ``SWE_BACKEND``: ``local``, ``docker`` (:class:`~trio_swe.DockerBackend` on
    ``DOCKER_HOST``, its connections shared like E2B's), or ``e2b`` (:class:`~trio_swe.E2BBackend` configured
    from ``E2B_API_KEY``, ``E2B_API_URL``, ``E2B_SANDBOX_URL``, ``E2B_DOMAIN``, ``SSL_CERT_FILE``;
    its connections are shared by the calls running at once and closed by the last one out).
    Returns a list of slime samples (copies of ``sample`` with our fields set), or one aborted
    sample (``remove_sample=True``, ``metadata["abort_reason"]``) for infrastructure failures
    and unreadable rows. For ``evaluation`` it returns one sample carrying the reward, with
    ``remove_sample=True``. Cancelling the awaiting task kills the episode's sandboxes before
    the cancellation completes.

    Raises:
        ConfigError: ``SWE_BACKEND`` is not one of :data:`GENERATE_BACKENDS` (checked first, for
            every sample), another variable is malformed, or the E2B settings are incomplete.
    """
    config = _with_slime_args(SweConfig.from_env(), args)  # SWE_BACKEND is checked first
    protocol = config.protocol_for(evaluation=evaluation)
    try:
        md = get_metadata(sample, protocol)
    except MetadataError as exc:
        return [_slime_abort(sample, f"metadata:{exc}", "unknown")]
    url = _policy_url(args, config)
    session_id = getattr(sample, "session_id", None) or None

    async def episode() -> tuple[EpisodeResult, Callable[[list[int]], str]]:
        if config.bash.tokenizer:
            # The first call loads the checkpoint's tokenizer (about a second) off the loop;
            # later ones find it in the process-wide cache.
            await trio.to_thread.run_sync(load_tokenizer, config.bash.tokenizer)
        async with _run_shared() as shared:
            agent = shared.agent(config, url)
            result = await run_episode(
                md,
                agent,
                backend=shared.backend(config.backend),
                config=config,
                episode_id=str(session_id) if session_id else None,
                sampling_params=sampling_params,
                build_samples=not evaluation,
            )
            return result, _decoder(agent)

    options = _ray_options(config)
    if options is not None:
        # SWE_RAY_WORKERS: the episode runs on the shared pool of Ray workers; this process only
        # carries the call.
        from ..ray import AsyncioWorkerPool, shared_pool

        pool = AsyncioWorkerPool(shared_pool(options, _with_policy_url(config, url)))
        result = await pool.run_episode(
            md,
            episode_id=str(session_id) if session_id else None,
            sampling_params=sampling_params,
            build_samples=not evaluation,
        )
        decode = await _local_decoder(config)
    else:
        result, decode = await aio.run(episode)
    if result.status == "aborted":
        out = _slime_abort(sample, abort_text(result), md.instance_id)
        if is_permanent_abort(abort_text(result), result.error):
            _set_status(out, "failed")  # a missing image, a commit that does not exist, ...
        return [out]
    extra = {
        "instance_id": md.instance_id,
        "grading_solved": bool(result.eval_result and result.eval_result.resolved),
        "applied_cleanly": bool(result.eval_result and result.eval_result.applied_cleanly),
        "agent_exit_code": result.agent_exit_code,
        "episode_status": result.status,
    }
    if evaluation or not result.samples:
        out = _slime_abort(
            sample, "evaluation" if evaluation else "no_trained_turns", md.instance_id
        )
        out.reward = result.reward
        out.metadata.update(extra)
        if evaluation:
            out.metadata.pop("abort_reason", None)
            _set_status(out, "completed")
        return [out]
    outs = []
    for s in result.samples:
        out = copy.copy(sample)
        fields = s.to_slime_dict()
        status = fields.pop("status")
        meta = {**(getattr(sample, "metadata", None) or {}), **fields.pop("metadata"), **extra}
        for name, value in fields.items():
            setattr(out, name, value)
        # The response region as text, by the tokenizer that made the ids (tool results
        # included, as slime's multi-turn samples have it).
        out.response = decode(fields["tokens"][len(fields["tokens"]) - fields["response_length"] :])
        out.metadata = meta
        _set_status(out, status)
        outs.append(out)
    return outs


def _ray_options(config: SweConfig) -> RayOptions | None:
    """``config.ray`` (``SWE_RAY_*``) when episodes go to the Ray pool, else None.

    Raises:
        ConfigError: ``SWE_RAY_WORKERS`` is set but Ray is not installed.
    """
    if not config.ray.enabled:
        return None
    try:
        from .. import ray as _needs_the_ray_extra  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"SWE_RAY_WORKERS needs Ray: pip install 'trio-swe[ray]' ({exc})")
    return config.ray


async def _local_decoder(config: SweConfig) -> Callable[[list[int]], str]:
    """The response text's decoder when the agent ran on a Ray worker: the same tokenizer here."""
    if not config.bash.tokenizer:
        from ..policy import ByteTokenizer

        return ByteTokenizer().decode
    import asyncio

    tokenizer = await asyncio.to_thread(load_tokenizer, config.bash.tokenizer)

    def text(ids: list[int]) -> str:
        return str(tokenizer.decode(ids))

    return text


def _decoder(agent: Agent) -> Callable[[list[int]], str]:
    tokenizer = getattr(agent, "tokenizer", None)
    decode = getattr(tokenizer, "decode", None)
    if decode is None:
        return lambda ids: ""

    def text(ids: list[int]) -> str:
        return str(decode(ids))

    return text


def _with_policy_url(config: SweConfig, url: str) -> SweConfig:
    return replace_option(config, "bash.policy_url", url)
