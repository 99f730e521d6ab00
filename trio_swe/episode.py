"""One episode: boot a sandbox, let an agent work, take its patch, grade it, build samples.

:func:`run_episode` owns the agent's sandbox for exactly the agent phase (it is killed before
grading starts), grades in a fresh sandbox, and returns an :class:`EpisodeResult` for every
outcome that is not a cancellation. Task outcomes (the agent failing, the patch not applying, the
tests timing out) are ordinary results; infrastructure failures (boot failed after retries, a
sandbox died, the policy server is unreachable, the eval environment broke, the outer guard
fired) give ``status == "aborted"`` with a typed :data:`AbortReason`, so a trainer drops the
episode instead of training on a fake zero reward.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal

import msgspec
import trio

from ._boot import BootingBackend, boot_limiter
from ._errors import (
    AbortReason,
    EvalInfrastructureError,
    SandboxError,
    TrioSweError,
)
from ._groups import open_private_nursery
from ._workspace import PROBLEM_STATEMENT_FILE, prepare_workspace, take_patch
from .agents import Agent, AgentOutcome, AgentTask, FirstTurnAgent
from .config import SweConfig
from .grading import (
    EvalArtifacts,
    EvalResult,
    InstanceMetadata,
    evaluability_check,
    grade,
    resolve_image,
)
from .sandbox import (
    Backend,
    Sandbox,
    open_sandbox,
)
from .trajectory import Sample, SampleBuilder

__all__ = [
    "AbortReason",
    "EpisodeResult",
    "EpisodeStatus",
    "PhaseTimings",
    "run_episode",
    "take_patch",
]

logger = logging.getLogger("trio_swe.episode")

#: ``completed``: the agent finished by itself; ``truncated``: it was cut short (time budget,
#: turn limit, context cap) and was graded anyway; ``aborted``: infrastructure failure, drop it.
EpisodeStatus = Literal["completed", "truncated", "aborted"]

# AbortReason (why an episode was aborted) lives in _errors.py, next to the errors that carry it.

#: Grace on top of the agent's own budget before the episode cancels an agent that overran it.
AGENT_GRACE_SEC = 30.0


class PhaseTimings(msgspec.Struct, kw_only=True):
    """Wall-clock seconds of each phase of an episode (0 for phases that did not run).

    ``agent_commands`` and ``agent_policy`` are the parts of ``agent`` spent in the agent's
    commands and waiting for the policy; ``eval_tests`` is the part of ``eval`` spent running
    the tests; ``agent_wait`` is how long the prepared sandbox waited for a rollout's agent
    slot (not in ``agent``). What remains of ``total`` is the library's own overhead.
    """

    boot: float = 0.0
    setup: float = 0.0
    agent: float = 0.0
    patch: float = 0.0
    kill: float = 0.0
    eval: float = 0.0
    samples: float = 0.0
    total: float = 0.0
    agent_commands: float = 0.0
    agent_policy: float = 0.0
    eval_tests: float = 0.0
    agent_wait: float = 0.0

    @property
    def overhead(self) -> float:
        """``total`` minus the agent's commands, the policy, the graded tests and the wait for
        an agent slot."""
        spent = self.agent_commands + self.agent_policy + self.eval_tests + self.agent_wait
        return max(self.total - spent, 0.0)


class EpisodeResult(msgspec.Struct, kw_only=True):
    """Everything one episode produced.

    Attributes:
        instance_id: the instance.
        episode_id: unique per episode (the policy's routing key).
        protocol: the grading protocol.
        status: ``completed``, ``truncated`` or ``aborted`` (see :data:`EpisodeStatus`).
        abort_reason: why it was aborted (None otherwise).
        error: a one-line description of the failure behind ``abort_reason``.
        reward: the grader's reward (0.0 for aborted episodes: do not train on it).
        eval_result: the grader's full result, when grading ran.
        samples: training samples built from the agent's turns (empty for aborted episodes and
            for agents that record no turns).
        agent_exit_code: ``0`` normal finish, ``-1`` time budget, else the agent's status.
        agent_finish: how the agent's run ended (``submitted``, ``time_budget``, ...).
        n_turns: policy calls made by the agent.
        patch: the agent's change as ``git diff --binary`` against the base commit, as bytes
            (exact, whatever the files' encoding: grade this); :attr:`patch_text` is the text.
        base_commit: the commit the patch is taken against.
        timings: seconds per phase.
        started_at: when the episode started, in seconds since the epoch (None in results
            written before it was recorded).
        boot_attempts: sandbox creations tried (agent and eval sandboxes).
        boot_retries: creations that failed and were retried.
        agent_output: the tail of the agent's transcript or log.
        group_id: the group this episode belongs to (GRPO: the episodes of one instance in one
            run; :func:`~trio_swe.rollout.plan_groups` names them). Files written before groups
            existed read as ``""``: :attr:`group` falls back to the instance id.
        group_index: the episode's place in its group (0 to n - 1).
        seed: the sampling seed the agent was given (``sampling_params["seed"]``; each policy
            call adds its turn index), None when the policy sampled unseeded.
        eval_artifacts: what the grading ran and saw (eval script, whole test output, report),
            kept only when asked (``keep_eval_artifacts``: they are large) and never written to
            results files; the SWE-bench harness's files are made from them.
    """

    instance_id: str
    episode_id: str
    protocol: str
    status: EpisodeStatus
    abort_reason: AbortReason | None = None
    error: str | None = None
    reward: float = 0.0
    eval_result: EvalResult | None = None
    samples: list[Sample] = msgspec.field(default_factory=list)
    agent_exit_code: int | None = None
    agent_finish: str | None = None
    n_turns: int = 0
    patch: bytes = b""
    base_commit: str | None = None
    timings: PhaseTimings = msgspec.field(default_factory=PhaseTimings)
    started_at: float | None = None
    boot_attempts: int = 0
    boot_retries: int = 0
    agent_output: str = ""
    group_id: str = ""
    group_index: int = 0
    seed: int | None = None
    eval_artifacts: EvalArtifacts | None = None

    @property
    def group(self) -> str:
        """:attr:`group_id`, or the instance id for results written before groups existed."""
        return self.group_id or self.instance_id

    @property
    def patch_text(self) -> str:
        """:attr:`patch` decoded as UTF-8 for reading; bytes that are not UTF-8 show as U+FFFD."""
        return self.patch.decode("utf-8", "replace")

    @property
    def dropped(self) -> bool:
        """True when a trainer should drop this episode (infrastructure failure)."""
        return self.status == "aborted"


def _status_of(outcome: AgentOutcome) -> EpisodeStatus:
    if outcome.finish in ("time_budget", "turn_limit", "context_limit"):
        return "truncated"
    return "completed"


async def run_episode(
    md: InstanceMetadata,
    agent: Agent,
    *,
    backend: Backend,
    config: SweConfig | None = None,
    episode_id: str | None = None,
    sampling_params: Mapping[str, Any] | None = None,
    limiter: trio.CapacityLimiter | None = None,
    agent_slots: trio.CapacityLimiter | None = None,
    network: bool = True,
    build_samples: bool = True,
    group_id: str | None = None,
    group_index: int = 0,
    keep_eval_artifacts: bool = False,
) -> EpisodeResult:
    """Run one episode of ``agent`` on instance ``md`` and grade it.

    Phases: check the row is gradable; boot the agent's sandbox (bounded retries with jittered
    backoff, under the boot limiter shared by all episodes of this trio run); prepare the
    workspace; run the agent under its budget; take the patch; kill the sandbox; grade the
    patch in a fresh sandbox; build samples capped at ``config.episode.max_context_tokens``. An outer
    guard (``config.guard_sec``) bounds the whole episode.

    Cancellation propagates (nothing is returned); the sandboxes are killed on the way out.

    Args:
        md: the instance, from :func:`trio_swe.grading.get_metadata`.
        agent: who works on it (e.g. :class:`~trio_swe.agents.BashAgent`).
        backend: where sandboxes come from.
        config: budgets and limits; :meth:`SweConfig.from_env` when None.
        episode_id: unique id (the policy's routing key); a fresh one when None.
        sampling_params: SGLang sampling parameters for the agent's policy calls.
        limiter: the boot limiter; :func:`boot_limiter` of this trio run when None.
        agent_slots: when given, the agent runs holding one of its tokens, the boot, workspace
            and grading outside it (:func:`~trio_swe.open_rollouts` keeps its policy busy so).
            The wait for a token moves the guard and the sandbox's TTL by as long as it took,
            at most the agent's budget.
        network: whether the agent's sandbox gets network access.
        build_samples: False skips the samples (evaluation runs).
        group_id: the episode's group (default: the instance id); see :attr:`EpisodeResult.group_id`.
        group_index: its place in the group.
        keep_eval_artifacts: keep what the grading ran and saw in
            :attr:`EpisodeResult.eval_artifacts` (to write the harness's files).

    Returns:
        The result; see :class:`EpisodeResult`.
    """
    cfg = config if config is not None else SweConfig.from_env()
    # What this backend boots for the row (its image-mapping hook), for both sandboxes.
    md = resolve_image(backend, md)
    episode = _Episode(
        md,
        agent,
        BootingBackend(backend, limiter or boot_limiter(cfg), cfg),
        cfg,
        episode_id=episode_id or f"{md.instance_id}#{uuid.uuid4().hex[:12]}",
        sampling_params=sampling_params,
        group=(group_id or md.instance_id, group_index),
        keep_eval_artifacts=keep_eval_artifacts,
        agent_slots=agent_slots,
    )
    started = time.monotonic()
    episode.started_at = time.time()
    abort: tuple[AbortReason, str] | None = None
    with trio.move_on_after(cfg.guard_sec) as guard:
        episode.guard = guard
        try:
            unevaluable = evaluability_check(md, backend)
            if unevaluable:
                abort = ("unevaluable", unevaluable)
            else:
                await episode.run(network=network, build_samples=build_samples)
        except Exception as exc:
            # One mapping for every failure: each trio_swe error names its own abort reason.
            abort = _abort_of(exc, episode.episode_id)
    if guard.cancelled_caught:
        abort = ("guard_timeout", f"the episode outlived its guard of {cfg.guard_sec:g} s")
    return episode.result(abort, total_sec=time.monotonic() - started)


def _abort_of(exc: Exception, episode_id: str) -> tuple[AbortReason, str]:
    reason: AbortReason = exc.abort_reason if isinstance(exc, TrioSweError) else "internal_error"
    if reason == "internal_error":
        logger.exception("episode %s failed with an unexpected error", episode_id)
    return reason, f"{type(exc).__name__}: {exc}"


class _Episode:
    """One run of :func:`run_episode`: the phases in order, and what each one produced.

    The phases run in :meth:`run` and return their values to it; it keeps them here, and
    :meth:`result` is the one place that turns them into an :class:`EpisodeResult` (whatever
    phase the episode got to before it ended or was aborted).
    """

    def __init__(
        self,
        md: InstanceMetadata,
        agent: Agent,
        backend: BootingBackend,
        config: SweConfig,
        *,
        episode_id: str,
        sampling_params: Mapping[str, Any] | None,
        group: tuple[str, int],
        keep_eval_artifacts: bool = False,
        agent_slots: trio.CapacityLimiter | None = None,
    ) -> None:
        self.md = md
        self.agent_slots = agent_slots
        self.guard: trio.CancelScope | None = None
        self.group = group
        self.keep_eval_artifacts = keep_eval_artifacts
        self.eval_artifacts: EvalArtifacts | None = None
        self.agent = agent
        self.backend = backend
        self.config = config
        self.episode_id = episode_id
        self.sampling_params = dict(sampling_params or {})
        self.timings = PhaseTimings()
        self.base_commit: str | None = None
        self.outcome: AgentOutcome | None = None
        self.patch = b""
        self.eval_result: EvalResult | None = None
        self.samples: list[Sample] = []
        self.started_at: float | None = None
        self._slot_taken_early = False

    async def run(self, *, network: bool, build_samples: bool) -> None:
        timings = self.timings
        release = trio.Event()

        async def hold_sandbox(*, task_status: trio.TaskStatus[Sandbox]) -> None:
            # The episode's nursery owns the agent's sandbox through this task: it lives until
            # `release` is set (or the episode fails or is cancelled), then is killed here, in
            # the background, while grading boots its own sandbox.
            async with open_sandbox(
                self.backend,
                self.md.image,
                workdir=self.md.workdir,
                # Agents that reach only their gateway (the CLI agents) ask for no network.
                network=network and self.agent.sandbox_network,
                ttl_sec=self._sandbox_ttl(),
                metadata={
                    "instance_id": self.md.instance_id[:200],
                    "episode_id": self.episode_id[:200],
                },
            ) as sandbox:
                task_status.started(sandbox)
                await release.wait()
                t_kill = time.monotonic()
            timings.kill = time.monotonic() - t_kill  # read after the nursery has joined

        async with open_private_nursery(f"the agent sandbox of {self.episode_id}") as nursery:
            async with self._first_turn():
                t0 = time.monotonic()
                sb: Sandbox = await nursery.start(hold_sandbox)
                timings.boot = time.monotonic() - t0
                await self._agent_phase(sb)
            t4 = time.monotonic()
            release.set()  # kill the agent's sandbox while grading starts
            self.eval_result = await self._grade()
            timings.eval = time.monotonic() - t4
        timings.eval_tests = float(self.eval_result.durations.get("tests", 0.0))
        if self.eval_result.infra_failure:
            raise EvalInfrastructureError(f"{self.eval_result.reason}: {self.eval_result.detail}")
        if build_samples:
            t6 = time.monotonic()
            self.samples = self._samples()
            timings.samples = time.monotonic() - t6

    def _sandbox_ttl(self) -> float:
        """The agent sandbox's TTL: the guard, and the longest wait for an agent slot."""
        ttl = self.config.guard_sec
        if self.agent_slots is not None:
            ttl += self.config.episode.agent_time_budget_sec + AGENT_GRACE_SEC
        return ttl

    @asynccontextmanager
    async def _first_turn(self) -> AsyncIterator[None]:
        """Let the agent's first policy call overlap the boot, when the agent can (a
        :class:`FirstTurnAgent`) and will run as soon as its sandbox is ready: no agent slots,
        or one free now, held from here (an episode booting ahead would only hold its output)."""
        slots = self.agent_slots
        if not isinstance(self.agent, FirstTurnAgent):
            yield
            return
        if slots is not None:
            try:
                slots.acquire_nowait()
            except trio.WouldBlock:
                yield
                return
            self._slot_taken_early = True
        try:
            async with self.agent.first_turn(self._task()):
                yield
        finally:
            if self._slot_taken_early:  # the agent never ran: the slot is still ours
                self._slot_taken_early = False
                assert slots is not None
                slots.release()

    @asynccontextmanager
    async def _agent_slot(self) -> AsyncIterator[None]:
        """Hold an agent slot (when the rollout has them) while the agent runs. The wait is
        not the episode's work: the guard moves by as long as it took."""
        if self.agent_slots is None:
            yield
            return
        if self._slot_taken_early:  # by _first_turn, before the boot
            try:
                yield
            finally:
                self._slot_taken_early = False
                self.agent_slots.release()
            return
        t0 = trio.current_time()
        async with self.agent_slots:
            waited = trio.current_time() - t0
            self.timings.agent_wait = waited
            if self.guard is not None:
                # A slot frees within one agent's budget (boot_ahead <= concurrency, FIFO).
                budget = self.config.episode.agent_time_budget_sec + AGENT_GRACE_SEC
                self.guard.deadline += min(waited, budget)
            yield

    async def _agent_phase(self, sb: Sandbox) -> None:
        """Prepare the workspace, run the agent under its budget, take the patch."""
        md, cfg, timings = self.md, self.config, self.timings
        user = self.agent.user
        t1 = time.monotonic()
        self.base_commit = base = await prepare_workspace(sb, md, user, cfg)
        timings.setup = time.monotonic() - t1
        async with self._agent_slot():
            t2 = time.monotonic()
            self.outcome = await self._run_agent(sb)
            t3 = time.monotonic()
        timings.agent = t3 - t2
        timings.agent_commands = self.outcome.command_sec
        timings.agent_policy = self.outcome.policy_sec
        self.patch = await take_patch(sb, md.workdir, base, agent_user=user)
        timings.patch = time.monotonic() - t3

    def _task(self, started_at: float | None = None) -> AgentTask:
        md, cfg = self.md, self.config
        return AgentTask(
            instance_id=md.instance_id,
            session_id=self.episode_id,
            problem_statement=md.problem_statement,
            workdir=md.workdir,
            problem_statement_path=f"{md.workdir.rstrip('/')}/{PROBLEM_STATEMENT_FILE}",
            time_budget_sec=cfg.episode.agent_time_budget_sec,
            max_context_tokens=cfg.episode.max_context_tokens,
            sampling_params=self.sampling_params,
            started_at=started_at,
        )

    async def _run_agent(self, sb: Sandbox) -> AgentOutcome:
        """The agent, under its budget (which starts now)."""
        cfg = self.config
        task = self._task(started_at=trio.current_time())
        outcome: AgentOutcome | None = None
        # The agent keeps its own budget and returns its turns; this scope only catches an
        # agent that ignores it.
        with trio.move_on_after(cfg.episode.agent_time_budget_sec + AGENT_GRACE_SEC):
            outcome = await self.agent.run(sb, task)
        return outcome or AgentOutcome(exit_code=-1, finish="time_budget")

    async def _grade(self) -> EvalResult:
        """Grade the patch in a fresh sandbox; its infrastructure failures abort the episode."""
        try:
            graded = await grade(
                self.backend, self.md, self.patch, timeout_sec=self.config.episode.eval_timeout_sec
            )
        except SandboxError as exc:
            raise EvalInfrastructureError(f"{type(exc).__name__}: {exc}") from exc
        if self.keep_eval_artifacts:
            self.eval_artifacts = graded.artifacts
        return graded.result

    def _samples(self) -> list[Sample]:
        outcome, eval_result = self.outcome, self.eval_result
        assert outcome is not None
        assert eval_result is not None
        if not outcome.turns:
            return []
        # Agents that keep the token history canonical (the bash agent) get the strict
        # builder: a turn that is not a clean continuation is a bug to see, not a fork.
        builder = SampleBuilder(
            max_sample_tokens=self.config.episode.max_context_tokens or None,
            append_only=self.agent.append_only,
            ill_formed_policy=self.config.episode.ill_formed_policy,
            fork_threshold_tokens=self.config.episode.realign_max_tokens,
        )
        for turn in outcome.turns:
            builder.add(turn)
        return builder.finish(
            reward=eval_result.reward,
            metadata={
                "instance_id": self.md.instance_id,
                "episode_id": self.episode_id,
                "grading_solved": eval_result.resolved,
                "agent_exit_code": outcome.exit_code,
                "agent_finish": outcome.finish,
                "episode_status": _status_of(outcome),
            },
        )

    def result(self, abort: tuple[AbortReason, str] | None, *, total_sec: float) -> EpisodeResult:
        """The episode's result: what the phases produced, and the abort if there was one."""
        outcome, eval_result = self.outcome, self.eval_result
        self.timings.total = total_sec
        ran = outcome is not None and eval_result is not None and abort is None
        return EpisodeResult(
            instance_id=self.md.instance_id,
            episode_id=self.episode_id,
            protocol=self.md.protocol,
            status=_status_of(outcome) if ran and outcome is not None else "aborted",
            abort_reason=abort[0] if abort is not None else None,
            error=abort[1] if abort is not None else None,
            reward=eval_result.reward if ran and eval_result is not None else 0.0,
            eval_result=eval_result,
            samples=self.samples if ran else [],
            agent_exit_code=outcome.exit_code if outcome is not None else None,
            agent_finish=outcome.finish if outcome is not None else None,
            n_turns=len(outcome.turns) if outcome is not None else 0,
            agent_output=outcome.output[-4000:] if outcome is not None else "",
            patch=self.patch,
            base_commit=self.base_commit,
            timings=self.timings,
            started_at=self.started_at,
            boot_attempts=self.backend.attempts,
            boot_retries=self.backend.retries,
            group_id=self.group[0],
            group_index=self.group[1],
            seed=_seed_of(self.sampling_params),
            eval_artifacts=self.eval_artifacts,
        )


def _seed_of(params: Mapping[str, Any]) -> int | None:
    seed = params.get("seed")
    return int(seed) if seed is not None else None
