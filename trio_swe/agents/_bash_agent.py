"""The built-in bash agent: the policy proposes one shell command per turn, the loop runs it.

The token history is append-only: the first prompt is encoded once, and every later prompt is the
previous prompt + the exact sampled output ids + the encoded observation. Nothing is re-rendered
or re-tokenized, so each prompt is a prefix of the next and the sample builder always takes its
CLEAN path (no false forks from template round-trips, no O(N^2) re-tokenization).
"""

from __future__ import annotations

import re
import time
from array import array
from typing import Any, Final

import trio

from ..sandbox import Sandbox
from ..trajectory import TurnRecord
from ._policy import Policy, PolicyError
from ._tokenizer import Tokenizer
from ._types import AgentFinish, AgentOutcome, AgentTask, BaseAgent

__all__ = ["BashAgent", "render_first_prompt"]

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
#: The assistant header; it occurs once per turn in every prompt.
ASSISTANT_HEADER: Final = f"{IM_START}assistant\n"
#: The command that ends the run.
SUBMIT: Final = "submit"

SYSTEM_PROMPT: Final = (
    "You are a careful software engineer. You work in a shell inside the repository at "
    "{workdir}. Each reply holds your reasoning and exactly one shell command in a ```bash code "
    "block; the command runs as the next step and its output comes back to you. Fix the issue "
    "by editing source files; do not edit the tests and do not commit. When you are done, reply "
    "with a ```bash block that holds only `submit`."
)

USER_PROMPT: Final = (
    "Instance: {instance_id}\n\n"
    "The issue (also in {problem_statement_path}):\n\n{problem_statement}\n"
)

_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)

_DEFAULT_SAMPLING: Final[dict[str, Any]] = {
    "max_new_tokens": 4096,
    "temperature": 1.0,
    "skip_special_tokens": False,
    "no_stop_trim": True,
}


def render_first_prompt(task: AgentTask) -> str:
    """The text of the first prompt: system message, the issue, then the assistant header."""
    system = SYSTEM_PROMPT.format(workdir=task.workdir)
    user = USER_PROMPT.format(
        instance_id=task.instance_id,
        problem_statement_path=task.problem_statement_path,
        problem_statement=task.problem_statement.strip(),
    )
    return f"{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{user}{IM_END}\n{ASSISTANT_HEADER}"


def parse_command(text: str) -> str | None:
    """The one command of a reply, or None when the reply has no block or more than one."""
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        return None
    command: str = blocks[0].strip()
    return command or None


class BashAgent(BaseAgent):
    """An agent loop in Python over a :class:`~trio_swe.agents.Policy`.

    Each turn: call the policy on the token history, record a :class:`~trio_swe.TurnRecord`,
    parse one ```bash block from the reply, run it as ``user`` in the workdir with a per-command
    timeout, and append the output (its tail) as the next observation. The run stops on ``submit``
    (exit code 0), on the turn limit or the context cap (exit code 1), or when the budget runs out
    (exit code -1, the turns so far kept). A reply without exactly one command block is recorded
    with ``ill_formed=True`` and answered with a format reminder.

    Args:
        policy: where completions come from.
        tokenizer: the policy's tokenizer.
        max_turns: policy calls per run.
        command_timeout_sec: limit of one command (also bounded by the remaining budget).
        observation_max_chars: the tail of a command's output shown to the policy.
        sampling_params: defaults under the task's own sampling parameters.
        user: who runs the commands in the sandbox.
        owns_policy: :meth:`aclose` closes the policy too (the agent registry's bash agent
            owns its SGLang client; a policy you pass in stays yours by default).
    """

    name = "bash"
    #: Its token history is append-only, so the episode builds samples in strict mode.
    append_only = True

    def __init__(
        self,
        policy: Policy,
        tokenizer: Tokenizer,
        *,
        max_turns: int = 50,
        command_timeout_sec: float = 300.0,
        observation_max_chars: int = 4000,
        sampling_params: dict[str, Any] | None = None,
        user: str = "agent",
        owns_policy: bool = False,
    ) -> None:
        self.policy = policy
        self.owns_policy = owns_policy
        self.tokenizer = tokenizer
        self.max_turns = max_turns
        self.command_timeout_sec = command_timeout_sec
        self.observation_max_chars = observation_max_chars
        self.sampling_params = {**_DEFAULT_SAMPLING, **(sampling_params or {})}
        self.user = user

    async def aclose(self) -> None:
        """Close the policy if this agent owns it (see ``owns_policy``)."""
        if self.owns_policy and isinstance(self.policy, trio.abc.AsyncResource):
            await self.policy.aclose()

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _observation(self, exit_code: int, reason: str, output: str, truncated: bool) -> str:
        limit = self.observation_max_chars
        if len(output) > limit or truncated:
            output = f"[... output truncated, last {limit} characters ...]\n" + output[-limit:]
        status = f"exit code {exit_code}" if reason == "exit" else f"killed ({reason})"
        return f"{status}\n{output}"

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        """Run the loop; see the class docstring."""
        turns: list[TurnRecord] = []
        transcript: list[str] = []
        stats = {"command_sec": 0.0, "policy_sec": 0.0, "n_commands": 0}
        finish: AgentFinish = "turn_limit"
        params = {**self.sampling_params, **task.sampling_params}
        cap = task.max_context_tokens
        deadline = trio.current_time() + task.time_budget_sec

        with trio.CancelScope(deadline=deadline) as budget:
            # int32 and append-only: each turn's TurnRecord copies it with one memcpy, where a
            # list would be rebuilt and converted token by token (quadratic over an episode).
            ids = array("i", self._encode(render_first_prompt(task)))
            for _ in range(self.max_turns):
                call_params = dict(params)
                if cap:
                    room = cap - len(ids)
                    if room <= 0:
                        finish = "context_limit"
                        break
                    call_params["max_new_tokens"] = min(
                        int(call_params.get("max_new_tokens", room)), room
                    )
                t0 = time.monotonic()
                out = await self.policy.generate(ids, call_params, session_id=task.session_id)
                stats["policy_sec"] += time.monotonic() - t0
                if out.finish_reason == "abort":
                    raise PolicyError("the policy server aborted the generation")
                text = self.tokenizer.decode(out.output_ids)
                command = parse_command(text)
                turns.append(
                    TurnRecord.from_lists(
                        prompt_ids=ids,
                        output_ids=out.output_ids,
                        output_log_probs=out.log_probs,
                        finish_reason=out.finish_reason,
                        ill_formed=command is None,
                    )
                )
                transcript.append(f"--- turn {len(turns)} ---\n{text}")
                if command == SUBMIT:
                    finish = "submitted"
                    break
                if command is None:
                    observation = (
                        "Format error: reply with exactly one ```bash code block holding one "
                        "command (or `submit`)."
                    )
                else:
                    remaining = max(deadline - trio.current_time(), 0.001)
                    stats["n_commands"] += 1
                    t1 = time.monotonic()
                    try:
                        result = await sandbox.exec(
                            command,
                            user=self.user,
                            cwd=task.workdir,
                            timeout=min(self.command_timeout_sec, remaining),
                        )
                    finally:
                        # Counted even when the budget cancels the command midway.
                        stats["command_sec"] += time.monotonic() - t1
                    observation = self._observation(
                        result.exit_code, result.reason, result.output, result.output_truncated
                    )
                transcript.append(observation)
                tail = "" if text.endswith(IM_END) else IM_END
                ids.extend(out.output_ids)
                ids.extend(
                    self._encode(
                        f"{tail}\n{IM_START}user\n{observation}{IM_END}\n{ASSISTANT_HEADER}"
                    )
                )
                if cap and len(ids) >= cap:
                    finish = "context_limit"
                    break

        if budget.cancelled_caught or (finish != "submitted" and trio.current_time() >= deadline):
            finish = "time_budget"
        exit_code = {"submitted": 0, "time_budget": -1}.get(finish, 1)
        return AgentOutcome(
            exit_code=exit_code,
            finish=finish,
            turns=turns,
            output="\n".join(transcript)[-20000:],
            command_sec=float(stats["command_sec"]),
            policy_sec=float(stats["policy_sec"]),
            n_commands=int(stats["n_commands"]),
        )
