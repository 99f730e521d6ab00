"""The ``Agent`` protocol and its records: what an agent is given and what it hands back."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec
import trio

from ..sandbox import Sandbox
from ..trajectory import TurnRecord

__all__ = ["Agent", "AgentFinish", "AgentOutcome", "AgentTask", "BaseAgent", "FirstTurnAgent"]

#: How an agent's run ended.
#:
#: * ``"submitted"``: the agent said it was done (the bash agent's ``submit``).
#: * ``"exited"``: a CLI agent's process exited by itself (see ``exit_code``).
#: * ``"turn_limit"`` / ``"context_limit"``: the bash agent ran out of turns or context.
#: * ``"time_budget"``: the wall-clock budget ran out; ``exit_code == -1``.
AgentFinish = Literal["submitted", "exited", "turn_limit", "context_limit", "time_budget"]


class AgentTask(msgspec.Struct, frozen=True, kw_only=True):
    """What an agent is asked to do in a prepared sandbox.

    Attributes:
        instance_id: the task's id.
        session_id: unique per episode; the policy's routing key.
        problem_statement: the issue text (also written to ``problem_statement_path``).
        workdir: the repository inside the sandbox.
        problem_statement_path: where the episode wrote the problem statement.
        time_budget_sec: wall-clock budget of the whole run (the agent budget's one name).
        started_at: the trio clock when the episode handed the task over (None: the moment
            :meth:`deadline` is asked).
        max_context_tokens: cap of prompt + output tokens (``0``: no cap).
        sampling_params: SGLang sampling parameters for policy calls.
        prompt: the instruction a CLI agent is started with.
    """

    instance_id: str
    session_id: str
    problem_statement: str
    workdir: str
    problem_statement_path: str
    time_budget_sec: float
    max_context_tokens: int = 0
    sampling_params: dict[str, Any] = msgspec.field(default_factory=dict)
    prompt: str = ""
    started_at: float | None = None

    def deadline(self) -> float:
        """The trio clock time the run must end by: the one place the budget becomes a
        deadline (agents pass it to their cancel scopes)."""
        start = trio.current_time() if self.started_at is None else self.started_at
        return start + self.time_budget_sec


class AgentOutcome(msgspec.Struct, kw_only=True):
    """What an agent's run produced.

    Attributes:
        exit_code: ``0`` for a normal finish, ``-1`` when the budget ran out, a CLI agent's exit
            status otherwise (the bash agent reports ``1`` for a turn or context limit).
        finish: how the run ended, see :data:`AgentFinish`.
        turns: one :class:`~trio_swe.TurnRecord` per policy call, in order.
        output: a transcript or log tail for humans.
        command_sec: time spent inside the agent's commands in the sandbox.
        policy_sec: time spent waiting for the policy.
        n_commands: commands run.
    """

    exit_code: int
    finish: AgentFinish
    turns: list[TurnRecord] = msgspec.field(default_factory=list)
    output: str = ""
    command_sec: float = 0.0
    policy_sec: float = 0.0
    n_commands: int = 0


@runtime_checkable
class Agent(Protocol):
    """Something that works on a task inside a sandbox.

    Implementations return an :class:`AgentOutcome` for every task outcome, including a budget
    overrun (``exit_code=-1``, ``finish="time_budget"``, the turns so far kept), and raise only
    for infrastructure failures (:class:`~trio_swe.SandboxError`,
    :class:`~trio_swe.agents.PolicyError`, :class:`~trio_swe.agents.AgentInstallError`).
    An agent is a :class:`trio.abc.AsyncResource`: ``aclose()`` releases what it owns (its
    policy's HTTP client), and ``async with agent:`` closes it. Subclass :class:`BaseAgent`
    for the defaults.

    Attributes:
        name: the agent's name (``SWE_AGENT``).
        user: the sandbox user it works as; the episode hands the workdir to this user.
        append_only: its token history only ever grows (each prompt extends the previous one
            with the sampled ids), so the episode builds samples in strict mode.
        sandbox_network: its sandbox needs a network (False: the agent reaches only its
            gateway, as the CLI agents do, and the episode asks for a sandbox without one).
    """

    name: str
    user: str
    append_only: bool
    sandbox_network: bool

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        """Work on ``task`` in ``sandbox`` (already prepared) within ``task.time_budget_sec``."""
        ...

    async def aclose(self) -> None:
        """Release what the agent owns. Idempotent."""
        ...


@runtime_checkable
class FirstTurnAgent(Agent, Protocol):
    """An agent whose first policy call needs only the task, not the sandbox (the bash
    agent's first prompt is the system prompt and the problem statement).

    The episode enters :meth:`first_turn` as soon as it has the task, when the agent will
    run at once (an agent slot is free), and runs the agent inside it: the first
    generation overlaps the sandbox's boot and the workspace's preparation, instead of the
    engine idling through them.
    """

    def first_turn(self, task: AgentTask) -> AbstractAsyncContextManager[None]:
        """Start ``task``'s first policy call now; :meth:`run` of the same task inside the
        block takes its output. Leaving the block cancels a call not taken (the policy
        aborts it), so a sandbox that fails to boot leaves nothing running."""
        ...


class BaseAgent(trio.abc.AsyncResource):
    """Defaults for :class:`Agent` implementations: user ``agent``, not append-only, a sandbox
    with a network, and an ``aclose`` that owns nothing."""

    name: str = "agent"
    user: str = "agent"
    append_only: bool = False
    sandbox_network: bool = True

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        """Work on ``task``; see :class:`Agent`."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Nothing to release."""
