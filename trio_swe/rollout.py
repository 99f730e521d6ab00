"""Many episodes: ``run_rollouts`` streams results as they finish; ``generate`` plugs into slime.

``run_rollouts`` runs episodes with a concurrency limit inside its own nursery and hands each
:class:`~trio_swe.EpisodeResult` out the moment it is ready. Leaving the block early cancels the
episodes still running (their sandboxes are killed on the way out).

``generate(args, sample, sampling_params, evaluation=False)`` has the signature of slime's custom
generate functions (``--custom-generate-function-path trio_swe.generate``). slime runs asyncio, so
it drives the episode through :mod:`trio_swe.aio`.
"""

from __future__ import annotations

import copy
import inspect
import logging
import math
import os
import struct
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from ._errors import ConfigError, MetadataError
from .agents._harness import create_agent
from .agents._types import Agent
from .config import BACKENDS, SweConfig
from .episode import EpisodeResult, boot_limiter, run_episode
from .grading import InstanceMetadata, get_metadata
from .sandbox import Backend
from .trajectory import decode_sample, encode_sample

__all__ = [
    "GENERATE_BACKENDS",
    "ResultsWriter",
    "encode_result",
    "generate",
    "read_results",
    "run_rollouts",
]

logger = logging.getLogger(__name__)


@asynccontextmanager
async def run_rollouts(
    instances: Iterable[InstanceMetadata],
    agent: Agent,
    *,
    backend: Backend,
    config: SweConfig | None = None,
    concurrency: int = 4,
    sampling_params: Mapping[str, Any] | None = None,
    network: bool = True,
    build_samples: bool = True,
    episode_id: Callable[[InstanceMetadata], str] | None = None,
    on_start: Callable[[InstanceMetadata], None] | None = None,
) -> AsyncIterator[trio.MemoryReceiveChannel[EpisodeResult]]:
    """Run one episode per instance, at most ``concurrency`` at a time; stream the results.

    Use it as an async context manager whose value is an async iterator of results, in the
    order they finish::

        async with run_rollouts(mds, agent, backend=LocalBackend(), concurrency=8) as results:
            async for result in results:
                print(result.instance_id, result.status, result.reward)

    Leaving the block before the iterator is exhausted cancels the episodes still running.
    Instances are pulled from ``instances`` lazily, only when a slot is free.

    Args:
        instances: the instances (from :func:`trio_swe.grading.get_metadata`).
        agent: the agent every episode uses (it must be safe to run concurrently, as the
            built-in agents are).
        backend: where sandboxes come from.
        config: budgets and limits; :meth:`SweConfig.from_env` when None.
        concurrency: episodes running at once (boots are further limited by
            ``config.boot_concurrency``).
        sampling_params: SGLang sampling parameters for every policy call.
        network: whether agent sandboxes get network access.
        build_samples: False skips building samples.
        episode_id: makes each episode's id from its instance (default: a fresh unique id).
        on_start: called as each episode starts (progress displays).
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, not {concurrency}")
    cfg = config if config is not None else SweConfig.from_env()
    shared_boot = boot_limiter(cfg)
    send, receive = trio.open_memory_channel[EpisodeResult](math.inf)
    slots = trio.CapacityLimiter(concurrency)

    async def one(
        md: InstanceMetadata, borrower: object, out: trio.MemorySendChannel[EpisodeResult]
    ) -> None:
        async with out:
            if on_start is not None:
                on_start(md)
            try:
                result = await run_episode(
                    md,
                    agent,
                    backend=backend,
                    config=cfg,
                    episode_id=episode_id(md) if episode_id is not None else None,
                    sampling_params=sampling_params,
                    limiter=shared_boot,
                    network=network,
                    build_samples=build_samples,
                )
            finally:
                slots.release_on_behalf_of(borrower)
            await out.send(result)

    async def drive(nursery: trio.Nursery) -> None:
        async with send:
            for md in instances:
                borrower = object()  # equal instances (n samples per prompt) need their own token
                await slots.acquire_on_behalf_of(borrower)
                nursery.start_soon(one, md, borrower, send.clone())

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drive, nursery)
            async with receive:
                yield receive
            # The consumer is done (exhausted the results, or left early): stop what still runs.
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        # The caller's own exception comes out as itself, not wrapped in our nursery's group.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


# --- slime's custom generate ---------------------------------------------------------------

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
        self.agents: dict[tuple[str, str], Agent] = {}
        self.e2b: Backend | None = None

    def agent(self, config: SweConfig, url: str) -> Agent:
        key = (config.agent, url)
        if key not in self.agents:
            self.agents[key] = create_agent(_with_policy_url(config, url))
        return self.agents[key]

    def backend(self, name: str) -> Backend:
        if name == "e2b":
            if self.e2b is None:
                from .sandbox.e2b import E2BBackend

                self.e2b = E2BBackend()  # E2B_* and SSL_CERT_FILE from the environment
            return self.e2b
        if not _LOCAL_BACKEND:
            from .sandbox.local import LocalBackend

            _LOCAL_BACKEND.append(LocalBackend())
        return _LOCAL_BACKEND[0]

    async def aclose(self) -> None:
        closers = [_closer(agent) for agent in self.agents.values()]
        closers.append(getattr(self.e2b, "aclose", None))
        self.agents, self.e2b = {}, None
        await _close_quietly(closers, timeout_sec=30.0)


async def _close_quietly(
    closers: Iterable[Callable[[], Any] | None], *, timeout_sec: float
) -> None:
    """Call each closer (awaiting it if it returns an awaitable), shielded and bounded.

    Closing connections must not be skipped by a cancellation, and a broken connection that
    fails to close must not fail the caller: the failure is logged.
    """
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + timeout_sec
        for close in closers:
            if close is None:
                continue
            try:
                result = close()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.warning("closing %r failed", close, exc_info=True)


def _closer(agent: Agent) -> Callable[[], Any] | None:
    """The agent's ``aclose``, or its policy's (the bash agent's SGLang client), if any."""
    close = getattr(agent, "aclose", None)
    if close is None:
        close = getattr(getattr(agent, "policy", None), "aclose", None)
    return close if callable(close) else None


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
    return config.policy_url


def _slime_abort(sample: Any, reason: str, instance_id: str) -> Any:
    """slime's convention for a sample that must not be trained on."""
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
    _set_status(out, "aborted")
    return out


def _set_status(sample: Any, status: str) -> None:
    enum = getattr(type(sample), "Status", None)
    sample.status = getattr(enum, status.upper()) if enum is not None else status


async def generate(
    args: Any, sample: Any, sampling_params: Mapping[str, Any], evaluation: bool = False
) -> Any:
    """slime's custom generate function: one episode for ``sample``, from asyncio.

    The protocol is ``SWE_EVAL_PROTOCOL`` when ``evaluation`` else ``SWE_TRAIN_PROTOCOL``; the
    agent is ``SWE_AGENT`` (the bash agent calls SGLang at ``args.sglang_router_ip:port``); the
    backend is ``SWE_BACKEND``: ``local``, or ``e2b`` (:class:`~trio_swe.E2BBackend` configured
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
    from . import aio

    config = SweConfig.from_env()  # SWE_BACKEND is checked first
    protocol = config.protocol_for(evaluation=evaluation)
    try:
        md = get_metadata(sample, protocol)
    except MetadataError as exc:
        return [_slime_abort(sample, f"metadata:{exc}", "unknown")]
    url = _policy_url(args, config)
    session_id = getattr(sample, "session_id", None) or None

    async def episode() -> EpisodeResult:
        async with _run_shared() as shared:
            return await run_episode(
                md,
                shared.agent(config, url),
                backend=shared.backend(config.backend),
                config=config,
                episode_id=str(session_id) if session_id else None,
                sampling_params=sampling_params,
                build_samples=not evaluation,
            )

    result = await aio.run(episode)
    if result.status == "aborted":
        return [_slime_abort(sample, f"{result.abort_reason}:{result.error}", md.instance_id)]
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
        out.metadata = meta
        _set_status(out, status)
        outs.append(out)
    return outs


def _with_policy_url(config: SweConfig, url: str) -> SweConfig:
    return msgspec.structs.replace(config, policy_url=url)


# --- results files ---------------------------------------------------------------------------

_FRAME_HEADER = struct.Struct(">I")


class _Frame(msgspec.Struct, array_like=True):
    result: EpisodeResult
    samples: list[bytes]


_frame_decoder = msgspec.msgpack.Decoder(_Frame)


def encode_result(result: EpisodeResult) -> bytes:
    """One length-prefixed msgpack frame: the result, its samples encoded by ``encode_sample``."""
    frame = _Frame(
        result=msgspec.structs.replace(result, samples=[]),
        samples=[encode_sample(s) for s in result.samples],
    )
    body = msgspec.msgpack.encode(frame)
    return _FRAME_HEADER.pack(len(body)) + body


def read_results(path: str | os.PathLike[str]) -> tuple[list[EpisodeResult], int]:
    """The results in a results file, and the length of its intact prefix in bytes.

    A frame cut short (the writer was killed midway) ends the intact prefix; everything before
    it is returned. A missing file has no results.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return [], 0
    results: list[EpisodeResult] = []
    pos = 0
    while pos + _FRAME_HEADER.size <= len(data):
        (size,) = _FRAME_HEADER.unpack_from(data, pos)
        end = pos + _FRAME_HEADER.size + size
        if end > len(data):
            break
        try:
            frame = _frame_decoder.decode(data[pos + _FRAME_HEADER.size : end])
        except msgspec.DecodeError:
            break
        frame.result.samples = [decode_sample(s) for s in frame.samples]
        results.append(frame.result)
        pos = end
    return results, pos


class ResultsWriter:
    """Appends results to a file, one frame each, flushed as it goes; resumable.

    Opening an existing file keeps its intact frames (and drops a frame cut short by an
    interrupted writer), so a rerun continues where the last one stopped.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.previous, intact = read_results(self.path)
        self._file = open(self.path, "ab")  # noqa: SIM115  (closed by close())
        self._file.truncate(intact)
        self._file.seek(intact)
        self.written = 0

    def write(self, result: EpisodeResult) -> None:
        """Append ``result`` and flush it to the OS (it survives the process being killed)."""
        self._file.write(encode_result(result))
        self._file.flush()
        self.written += 1

    def close(self) -> None:
        """Sync and close the file."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
