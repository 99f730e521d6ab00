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
import shlex
import time
import uuid
from collections.abc import Mapping
from typing import Any, Literal

import msgspec
import trio

from ._errors import (
    AbortReason,
    BackendUnavailableError,
    EvalInfrastructureError,
    PatchFailedError,
    PermanentBootError,
    SandboxBootError,
    SandboxError,
    SandboxFileTooLargeError,
    SetupFailedError,
    TrioSweError,
)
from ._groups import open_private_nursery
from ._retry import Backoff, retry
from .agents import Agent, AgentOutcome, AgentTask
from .config import SweConfig
from .grading import (
    EvalResult,
    InstanceMetadata,
    evaluability_check,
    resolve_image,
    run_evaluation,
)
from .grading._patch import diff_script
from .sandbox import (
    Backend,
    BackendStatistics,
    Sandbox,
    SandboxSpec,
    exec_and_wait,
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

#: The harness's own files in the workdir, never part of the patch.
PROBLEM_STATEMENT_FILE = "PROBLEM_STATEMENT.md"
HARNESS_DIR = ".harness"
_EXCLUDES = (PROBLEM_STATEMENT_FILE, HARNESS_DIR)
#: Grace on top of the agent's own budget before the episode cancels an agent that overran it.
AGENT_GRACE_SEC = 30.0
_SHORT_TIMEOUT_SEC = 120.0
#: Problem statements up to this size travel inside the setup command (one spawn fewer).
_INLINE_STATEMENT_MAX = 64 * 1024


class PhaseTimings(msgspec.Struct, kw_only=True):
    """Wall-clock seconds of each phase of an episode (0 for phases that did not run).

    ``agent_commands`` and ``agent_policy`` are the parts of ``agent`` spent in the agent's
    commands and waiting for the policy; ``eval_tests`` is the part of ``eval`` spent running
    the tests. What remains of ``total`` is the library's own overhead.
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

    @property
    def overhead(self) -> float:
        """``total`` minus the agent's commands, the policy and the graded tests."""
        return max(self.total - self.agent_commands - self.agent_policy - self.eval_tests, 0.0)


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
        boot_attempts: sandbox creations tried (agent and eval sandboxes).
        boot_retries: creations that failed and were retried.
        agent_output: the tail of the agent's transcript or log.
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
    boot_attempts: int = 0
    boot_retries: int = 0
    agent_output: str = ""

    @property
    def patch_text(self) -> str:
        """:attr:`patch` decoded as UTF-8 for reading; bytes that are not UTF-8 show as U+FFFD."""
        return self.patch.decode("utf-8", "replace")

    @property
    def dropped(self) -> bool:
        """True when a trainer should drop this episode (infrastructure failure)."""
        return self.status == "aborted"


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


class _BootingBackend:
    """Wraps a backend: bounded, jittered retries and the shared limiter around every boot.

    Used for the agent's sandbox and handed to the grader for the eval sandbox, so both boots
    share the limit and the retry policy, and the episode counts their attempts.
    """

    def __init__(self, backend: Backend, limiter: trio.CapacityLimiter, config: SweConfig) -> None:
        self._backend = backend
        self._limiter = limiter
        self._config = config
        self.name = backend.name
        self.attempts = 0
        self.retries = 0

    def statistics(self) -> BackendStatistics:
        return self._backend.statistics()

    async def aclose(self) -> None:
        """The wrapped backend belongs to the caller: nothing to close here."""

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


async def _prepare_workspace(
    sb: Sandbox, md: InstanceMetadata, agent_user: str, config: SweConfig
) -> str:
    """Run the pre-commands, make the workdir the agent's, write the problem statement.

    Returns the base commit the patch will be taken against (recorded after the pre-commands,
    which often check out the instance's base).
    """
    wd = shlex.quote(md.workdir)
    script = md.setup_script()
    if script is not None:
        result = await exec_and_wait(
            sb,
            script,
            time_budget_sec=config.episode.setup_timeout_sec,
            user="root",
            workdir=md.workdir,
            want_output=True,
        )
        if not result.ok:
            raise SetupFailedError(
                f"pre-commands failed (exit {result.exit_code}, {result.reason}): "
                f"{result.output[-500:]}",
            )
    # One command: give a non-git workdir a repository (so the patch has a base), keep the
    # harness's files out of git, write the problem statement, hand the tree to the agent, and
    # print the base commit last. Each exec is a process spawn, so they are batched.
    statement_path = f"{md.workdir.rstrip('/')}/{PROBLEM_STATEMENT_FILE}"
    inline = len(md.problem_statement.encode()) <= _INLINE_STATEMENT_MAX
    excludes = "".join(f"/{name}\n" for name in _EXCLUDES)
    steps = [
        f"cd {wd}",
        "(git rev-parse -q --verify HEAD >/dev/null || (git init -q && git add -A && "
        "git -c user.name=trio-swe -c user.email=trio-swe@localhost commit -q "
        "--allow-empty -m base))",
        f"printf %s {shlex.quote(excludes)} >> .git/info/exclude",
    ]
    if inline:
        steps.append(
            f"printf %s {shlex.quote(md.problem_statement)} > {shlex.quote(statement_path)}"
        )
    if agent_user != "root":
        user = shlex.quote(agent_user)
        # Images without the user (plain E2B templates) get one, as slime's harness does.
        steps.append(f"(id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user})")
        steps.append(f"chown -R {user}: .")
    steps.append("git rev-parse HEAD")
    prep = await sb.exec(" && ".join(steps), user="root", timeout=_SHORT_TIMEOUT_SEC)
    lines = prep.output.strip().splitlines()
    commit = lines[-1].strip() if prep.ok and lines else ""
    if len(commit) < 40 or not all(c in "0123456789abcdef" for c in commit):
        raise SetupFailedError(f"workspace preparation failed: {prep.output[-300:]}")
    if not inline:
        await sb.write_file(statement_path, md.problem_statement, user=agent_user)
    return commit


async def take_patch(sb: Sandbox, workdir: str, base_commit: str, *, agent_user: str) -> bytes:
    """The agent's change, as bytes: new files included (``git add -N``), binary-safe, against
    the base.

    The agent's leftover processes are killed first so the tree is not changing under ``git``.
    Harness files (the problem statement, ``.harness/``) are excluded. Nothing the agent
    configured in git (hooks, fsmonitor, filters...) runs: see :func:`~.grading._patch.diff_script`.
    """
    token = uuid.uuid4().hex[:12]
    out = f"/tmp/trio_swe-patch-{token}.diff"
    err = f"/tmp/trio_swe-patch-{token}.err"  # stderr must not mix into the patch
    kill = f"pkill -KILL -u {shlex.quote(agent_user)} 2>/dev/null\n" if agent_user != "root" else ""
    script = diff_script(
        workdir=workdir, base_commit=base_commit, out_path=out, err_path=err, excludes=_EXCLUDES
    )
    # The diff goes to a file and to stdout: a short one arrives with the exec's output, a long
    # one (the exec's output is capped) is read back from the file, and so is one that was not
    # UTF-8 (the output is decoded with replacement characters; the file has the bytes).
    result = await sb.exec(kill + script, user="root", timeout=_SHORT_TIMEOUT_SEC)
    if not result.ok:
        raise PatchFailedError(f"git diff failed (exit {result.exit_code}): {result.output}")
    if not result.output_truncated and "\ufffd" not in result.output:
        return result.output.encode()
    try:
        return await sb.read_file(out)
    except SandboxFileTooLargeError as exc:
        raise PatchFailedError(f"the agent's patch is too large to take: {exc}") from exc


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
    network: bool = True,
    build_samples: bool = True,
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
        network: whether the agent's sandbox gets network access.
        build_samples: False skips the samples (evaluation runs).

    Returns:
        The result; see :class:`EpisodeResult`.
    """
    cfg = config if config is not None else SweConfig.from_env()
    # What this backend boots for the row (its image-mapping hook), for both sandboxes.
    md = resolve_image(backend, md)
    episode = _Episode(
        md,
        agent,
        _BootingBackend(backend, limiter or boot_limiter(cfg), cfg),
        cfg,
        episode_id=episode_id or f"{md.instance_id}#{uuid.uuid4().hex[:12]}",
        sampling_params=sampling_params,
    )
    started = time.monotonic()
    abort: tuple[AbortReason, str] | None = None
    with trio.move_on_after(cfg.guard_sec) as guard:
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
        backend: _BootingBackend,
        config: SweConfig,
        *,
        episode_id: str,
        sampling_params: Mapping[str, Any] | None,
    ) -> None:
        self.md = md
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
                network=network and bool(getattr(self.agent, "sandbox_network", True)),
                ttl_sec=self.config.guard_sec,
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

    async def _agent_phase(self, sb: Sandbox) -> None:
        """Prepare the workspace, run the agent under its budget, take the patch."""
        md, cfg, timings = self.md, self.config, self.timings
        user = self.agent.user
        t1 = time.monotonic()
        self.base_commit = base = await _prepare_workspace(sb, md, user, cfg)
        t2 = time.monotonic()
        timings.setup = t2 - t1
        task = AgentTask(
            instance_id=md.instance_id,
            session_id=self.episode_id,
            problem_statement=md.problem_statement,
            workdir=md.workdir,
            problem_statement_path=f"{md.workdir.rstrip('/')}/{PROBLEM_STATEMENT_FILE}",
            time_budget_sec=cfg.episode.agent_time_budget_sec,
            max_context_tokens=cfg.episode.max_context_tokens,
            sampling_params=self.sampling_params,
        )
        outcome: AgentOutcome | None = None
        # The agent keeps its own budget and returns its turns; this scope only catches an
        # agent that ignores it.
        with trio.move_on_after(cfg.episode.agent_time_budget_sec + AGENT_GRACE_SEC):
            outcome = await self.agent.run(sb, task)
        self.outcome = outcome or AgentOutcome(exit_code=-1, finish="time_budget")
        t3 = time.monotonic()
        timings.agent = t3 - t2
        timings.agent_commands = self.outcome.command_sec
        timings.agent_policy = self.outcome.policy_sec
        self.patch = await take_patch(sb, md.workdir, base, agent_user=user)
        timings.patch = time.monotonic() - t3

    async def _grade(self) -> EvalResult:
        """Grade the patch in a fresh sandbox; its infrastructure failures abort the episode."""
        try:
            return await run_evaluation(
                self.backend, self.md, self.patch, timeout_sec=self.config.episode.eval_timeout_sec
            )
        except SandboxError as exc:
            raise EvalInfrastructureError(f"{type(exc).__name__}: {exc}") from exc

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
            boot_attempts=self.backend.attempts,
            boot_retries=self.backend.retries,
        )
