"""The built-in bash agent: the policy proposes commands turn by turn, the loop runs them.

Two dialects, one loop:

* **tools** (a :class:`~trio_swe.models.ChatModel`: a checkpoint's tokenizer and chat template):
  the ``bash`` tool (and ``edit_file``) are declared to the template; tool calls are parsed from
  the model's output by the checkpoint's parser; each result goes back as a ``tool`` message,
  rendered by the template as a delta.
* **text** (a plain :class:`~trio_swe.agents.Tokenizer`, e.g. :class:`ByteTokenizer` for demos):
  a fixed ChatML prompt and one ```` ```bash ```` block per reply.

In both, the token history is append-only: every prompt is the previous prompt + the exact
sampled output ids + the encoded observation. Nothing sampled is re-rendered or re-tokenized,
so each prompt is a prefix of the next and the sample builder always takes its CLEAN path.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import time
from array import array
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

import trio

from .._errors import InvalidArgumentError, PromptTooLongError
from .._groups import open_private_nursery
from ..models import BASH_TOOL, EDIT_TOOL, ChatModel, ParsedOutput, TokenHistory, ToolCall
from ..policy import (
    ByteTokenizer,
    Policy,
    PolicyError,
    PolicyOutput,
    Tokenizer,
    open_policy,
    vocabulary_size,
)
from ..sandbox import Sandbox, check_command
from ..trajectory import TurnRecord, TurnRecorder
from ._types import AgentFinish, AgentOutcome, AgentTask, BaseAgent

if TYPE_CHECKING:
    from ..config import SweConfig

__all__ = ["DEFAULT_MAX_PROMPT_TOKENS", "BashAgent", "PromptTooLongError", "render_first_prompt"]

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
#: The assistant header; it occurs once per turn in every prompt.
ASSISTANT_HEADER: Final = f"{IM_START}assistant\n"
#: The command that ends the run.
SUBMIT: Final = "submit"
#: The first prompt's cap when the task sets no ``max_context_tokens``: no sane problem
#: statement is longer, and a bigger one must not reach the policy server.
DEFAULT_MAX_PROMPT_TOKENS: Final = 131_072

SYSTEM_PROMPT: Final = (
    "You are a careful software engineer. You work in a shell inside the repository at "
    "{workdir}. Each reply holds your reasoning and exactly one shell command in a ```bash code "
    "block; the command runs as the next step and its output comes back to you. Fix the issue "
    "by editing source files; do not edit the tests and do not commit. When you are done, reply "
    "with a ```bash block that holds only `submit`."
)

TOOL_SYSTEM_PROMPT: Final = (
    "You are a careful software engineer working in the repository at {workdir}. Use the tools "
    "to read and change files and to run commands; the result of every call comes back to you. "
    "Fix the issue by editing source files; do not edit the tests and do not commit. When you "
    "are done, call bash with the command `submit` alone."
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

# Run by the edit tool as the agent user: the arguments arrive base64-encoded in argv[1] (one
# quoted word), so nothing the model wrote is ever parsed by a shell.
_EDIT_SCRIPT: Final = r"""
import base64, json, sys
a = json.loads(base64.b64decode(sys.argv[1]))
path, old, new = a["path"], a["old_text"], a["new_text"]
if old == "":
    open(path, "w", encoding="utf-8").write(new)
    print(f"wrote {path} ({len(new)} characters)")
    sys.exit(0)
try:
    text = open(path, encoding="utf-8").read()
except OSError as e:
    print(f"cannot read {path}: {e.strerror}")
    sys.exit(1)
n = text.count(old)
if n != 1:
    print(f"old_text occurs {n} times in {path}; it must occur exactly once")
    sys.exit(1)
open(path, "w", encoding="utf-8").write(text.replace(old, new, 1))
print(f"edited {path}")
"""
#: Linux caps one argv word at 128 KiB; an edit whose encoded arguments exceed this is refused.
_EDIT_MAX_ARG = 120 * 1024


def render_first_prompt(task: AgentTask) -> str:
    """The text dialect's first prompt: system message, the issue, then the assistant header."""
    system = SYSTEM_PROMPT.format(workdir=task.workdir)
    return (
        f"{IM_START}system\n{system}{IM_END}\n{IM_START}user\n{_user_prompt(task)}{IM_END}\n"
        f"{ASSISTANT_HEADER}"
    )


def _user_prompt(task: AgentTask) -> str:
    return USER_PROMPT.format(
        instance_id=task.instance_id,
        problem_statement_path=task.problem_statement_path,
        problem_statement=task.problem_statement.strip(),
    )


def first_messages(task: AgentTask) -> list[dict[str, Any]]:
    """The tools dialect's first messages: system and user."""
    return [
        {"role": "system", "content": TOOL_SYSTEM_PROMPT.format(workdir=task.workdir)},
        {"role": "user", "content": _user_prompt(task)},
    ]


def parse_command(text: str) -> str | None:
    """The one command of a text-dialect reply, or None when it has no block or more than one."""
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        return None
    command: str = blocks[0].strip()
    return command or None


class _TextChat:
    """The text dialect: ChatML by hand, one ```bash block per reply."""

    def __init__(self, tokenizer: Tokenizer, task: AgentTask) -> None:
        self.tokenizer = tokenizer
        self.ids = array("i", self._encode(render_first_prompt(task)))

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def parse(self, out: PolicyOutput) -> ParsedOutput:
        text = self.tokenizer.decode(out.output_ids)
        command = parse_command(text)
        if command is None:
            return ParsedOutput(
                text=text,
                ill_formed=True,
                error="reply with exactly one ```bash code block holding one command (or `submit`).",
            )
        return ParsedOutput(text=text, tool_calls=(ToolCall("bash", {"command": command}),))

    def append(self, out: PolicyOutput, parsed: ParsedOutput, observations: list[str]) -> None:
        tail = "" if parsed.text.endswith(IM_END) else IM_END
        observation = "\n".join(observations)
        self.ids.extend(out.output_ids)
        self.ids.extend(
            self._encode(f"{tail}\n{IM_START}user\n{observation}{IM_END}\n{ASSISTANT_HEADER}")
        )


class _ToolChat:
    """The tools dialect: the checkpoint's template, tool calls, tool results as deltas."""

    def __init__(self, model: ChatModel, task: AgentTask) -> None:
        self.model = model
        self.history: TokenHistory = model.start(first_messages(task))
        self.ids = self.history.ids

    def parse(self, out: PolicyOutput) -> ParsedOutput:
        return self.model.parse(out.output_ids)

    def append(self, out: PolicyOutput, parsed: ParsedOutput, observations: list[str]) -> None:
        self.history.append_output(out.output_ids, parsed)
        self.history.append_messages([{"role": "tool", "content": o} for o in observations])


class _FirstCall:
    """A first policy call sent before the sandbox was ready (:meth:`BashAgent.first_turn`)."""

    __slots__ = ("_done", "_error", "_output", "chat", "params")

    def __init__(self, chat: _TextChat | _ToolChat, params: dict[str, Any]) -> None:
        self.chat = chat
        self.params = params
        self._done = trio.Event()
        self._output: PolicyOutput | None = None
        self._error: Exception | None = None

    async def send(self, policy: Policy, session_id: str) -> None:
        try:
            self._output = await policy.generate(self.chat.ids, self.params, session_id=session_id)
        except Exception as exc:  # raised by run(), which takes it as its own call's
            self._error = exc
        self._done.set()

    async def output(self) -> PolicyOutput:
        await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._output is not None
        return self._output


class BashAgent(BaseAgent):
    """An agent loop in Python over a :class:`~trio_swe.agents.Policy`.

    Each turn: call the policy on the token history, record a :class:`~trio_swe.TurnRecord`,
    parse the reply, run its command(s) as ``user`` in the workdir with a per-command timeout,
    and append the output (its tail) as the next observation. The run stops on ``submit``
    (exit code 0), on the turn limit or the context cap (exit code 1), or when the budget runs out
    (exit code -1, the turns so far kept). A reply that does not parse (no tool call, a malformed
    one, an unknown tool) is recorded with ``ill_formed=True``, kept exactly as sampled, and
    answered with the parser's error.

    Args:
        policy: where completions come from.
        tokenizer: a :class:`~trio_swe.models.ChatModel` (the tools dialect: the checkpoint's
            template and tool calls; its tools must include ``bash``), or a plain tokenizer (the
            text dialect: ```bash blocks in a fixed ChatML prompt).
        max_turns: policy calls per run.
        command_timeout_sec: limit of one command (also bounded by the remaining budget).
        observation_max_chars: the tail of a command's output shown to the policy.
        sampling_params: defaults under the task's own sampling parameters.
        user: who runs the commands in the sandbox.
        max_prompt_tokens: cap of the first prompt when the task has no ``max_context_tokens``.
        owns_policy: :meth:`aclose` closes the policy too (the agent registry's bash agent
            owns its SGLang client; a policy you pass in stays yours by default).
    """

    name = "bash"
    #: Its token history is append-only, so the episode builds samples in strict mode.
    append_only = True

    def __init__(
        self,
        policy: Policy,
        tokenizer: Tokenizer | ChatModel,
        *,
        max_turns: int = 50,
        command_timeout_sec: float = 300.0,
        observation_max_chars: int = 4000,
        sampling_params: dict[str, Any] | None = None,
        user: str = "agent",
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
        owns_policy: bool = False,
    ) -> None:
        self.policy = policy
        self.owns_policy = owns_policy
        self.tokenizer = tokenizer
        if isinstance(tokenizer, ChatModel):
            names = {str(t.get("function", t).get("name")) for t in tokenizer.tools}
            if "bash" not in names:
                raise InvalidArgumentError(
                    "the bash agent's ChatModel must declare the bash tool "
                    "(ChatModel.from_checkpoint(path, tools=[BASH_TOOL, EDIT_TOOL]))"
                )
        self.max_turns = max_turns
        self.command_timeout_sec = command_timeout_sec
        self.observation_max_chars = observation_max_chars
        self.sampling_params = {**_DEFAULT_SAMPLING, **(sampling_params or {})}
        self.user = user
        self.max_prompt_tokens = max_prompt_tokens
        # First calls started by first_turn, by session, until run takes them.
        self._first_calls: dict[str, _FirstCall] = {}

    @classmethod
    def from_config(cls, config: SweConfig, policy: Policy | None = None) -> BashAgent:
        """The bash agent ``config`` describes (``config.bash``, ``config.policy``).

        It speaks the checkpoint at ``config.bash.tokenizer`` (its chat template and tool
        calls, checked against the agent's tools here, before any episode), else the byte
        tokenizer. It calls ``policy`` (yours: not closed by the agent), or, when None, the
        policy server at ``config.bash.policy_url``, a client the agent owns.
        """
        tokenizer: Tokenizer | ChatModel
        if config.bash.tokenizer:
            # Loaded once per process (a second or so the first time).
            tokenizer = ChatModel.from_checkpoint(
                config.bash.tokenizer, tools=cls.TOOLS, tool_parser=config.bash.tool_parser
            )
        else:
            tokenizer = ByteTokenizer()
        owns = policy is None
        if policy is None:
            policy = open_policy(
                config.policy.api, config.bash.policy_url, vocab_size=vocabulary_size(tokenizer)
            )
        return cls(
            policy,
            tokenizer,
            sampling_params=config.policy.sampling_params(),
            max_turns=config.bash.max_turns,
            command_timeout_sec=config.bash.command_timeout_sec,
            observation_max_chars=config.bash.observation_max_chars,
            owns_policy=owns,
        )

    async def aclose(self) -> None:
        """Close the policy if this agent owns it (see ``owns_policy``)."""
        if self.owns_policy and isinstance(self.policy, trio.abc.AsyncResource):
            await self.policy.aclose()

    #: The tools the tools dialect declares (``ChatModel.from_checkpoint(path, tools=TOOLS)``).
    TOOLS: Final = (BASH_TOOL, EDIT_TOOL)

    def _observation(self, exit_code: int, reason: str, output: str, truncated: bool) -> str:
        limit = self.observation_max_chars
        if len(output) > limit or truncated:
            output = f"[... output truncated, last {limit} characters ...]\n" + output[-limit:]
        status = f"exit code {exit_code}" if reason == "exit" else f"killed ({reason})"
        return f"{status}\n{output}"

    def _check_prompt_size(self, task: AgentTask) -> int:
        """The first prompt's token limit; raises before tokenizing a statement that cannot fit."""
        limit = task.max_context_tokens or self.max_prompt_tokens
        size = len(task.problem_statement.encode("utf-8", errors="surrogatepass"))
        if size < limit:
            return limit  # a token covers at least one byte: no bound to check
        tok = self.tokenizer
        per_token = tok.max_token_bytes if isinstance(tok, ChatModel) else 1
        if size // per_token >= limit:
            raise PromptTooLongError(size // per_token, limit, exact=False)
        return limit

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        """Run the loop; see the class docstring.

        Raises:
            PromptTooLongError: the first prompt does not fit (nothing was sent).
            PolicyError: the policy failed, aborted, or sent ids outside the vocabulary.
        """
        turns: list[TurnRecord] = []
        # The history is append-only: the records share one copy of it (each prompt's new
        # tokens copied once), not one whole copy per turn.
        recorder = TurnRecorder()
        transcript: list[str] = []
        stats = {"command_sec": 0.0, "policy_sec": 0.0, "n_commands": 0}
        finish: AgentFinish = "turn_limit"
        first = self._first_calls.pop(task.session_id, None)
        cap = task.max_context_tokens
        deadline = task.deadline()

        with trio.CancelScope(deadline=deadline) as budget:
            chat = first.chat if first is not None else self._first_chat(task)
            for turn in range(self.max_turns):
                call_params = self._call_params(task, chat, turn)
                if call_params is None:
                    finish = "context_limit"
                    break
                t0 = time.monotonic()
                if first is not None and turn == 0 and first.params == call_params:
                    out = await first.output()  # sent while the sandbox booted
                else:
                    out = await self.policy.generate(
                        chat.ids, call_params, session_id=task.session_id
                    )
                stats["policy_sec"] += time.monotonic() - t0
                if out.finish_reason == "abort":
                    raise PolicyError("the policy server aborted the generation")
                self._check_vocabulary(out)
                parsed = chat.parse(out)
                turns.append(
                    recorder.record(
                        prompt_ids=chat.ids,
                        output_ids=out.output_ids,
                        output_log_probs=out.log_probs,
                        finish_reason=out.finish_reason,
                        ill_formed=parsed.ill_formed,
                    )
                )
                transcript.append(f"--- turn {len(turns)} ---\n{parsed.text}")
                if parsed.ill_formed:
                    observations = [f"Format error: {parsed.error}"]
                elif _submits(parsed.tool_calls):
                    finish = "submitted"
                    break
                else:
                    observations = []
                    for call in parsed.tool_calls:
                        observations.append(await self._call(sandbox, task, call, deadline, stats))
                transcript.extend(observations)
                chat.append(out, parsed, observations)
                if cap and len(chat.ids) >= cap:
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

    def _first_chat(self, task: AgentTask) -> _TextChat | _ToolChat:
        """The first prompt's chat; raises PromptTooLongError if it cannot fit."""
        limit = self._check_prompt_size(task)
        tok = self.tokenizer
        chat: _TextChat | _ToolChat = (
            _ToolChat(tok, task) if isinstance(tok, ChatModel) else _TextChat(tok, task)
        )
        if len(chat.ids) >= limit:
            raise PromptTooLongError(len(chat.ids), limit, exact=True)
        return chat

    def _call_params(
        self, task: AgentTask, chat: _TextChat | _ToolChat, turn: int
    ) -> dict[str, Any] | None:
        """Turn ``turn``'s sampling parameters; None when the context has no room left."""
        params = {**self.sampling_params, **task.sampling_params}
        if params.get("seed") is not None:  # no two calls of an episode share a seed
            params["seed"] = int(params["seed"]) + turn
        cap = task.max_context_tokens
        if cap:
            room = cap - len(chat.ids)
            if room <= 0:
                return None
            params["max_new_tokens"] = min(int(params.get("max_new_tokens", room)), room)
        return params

    @asynccontextmanager
    async def first_turn(self, task: AgentTask) -> AsyncIterator[None]:
        """See :class:`~trio_swe.agents.FirstTurnAgent`: the first prompt needs only the task.

        A prompt that cannot be sent (too long, no room) starts nothing: :meth:`run` raises
        or ends as it would have. The call's failure is raised by :meth:`run`, when it takes
        the output, as if it had made the call itself.
        """
        try:
            chat = self._first_chat(task)
        except PromptTooLongError:
            chat = None
        params = self._call_params(task, chat, 0) if chat is not None else None
        if chat is None or params is None or task.session_id in self._first_calls:
            yield
            return
        first = _FirstCall(chat, params)
        self._first_calls[task.session_id] = first
        try:
            async with open_private_nursery(f"the first policy call of {task.session_id}") as n:
                n.start_soon(first.send, self.policy, task.session_id)
                try:
                    yield
                finally:
                    n.cancel_scope.cancel()  # not taken: the policy aborts it
        finally:
            if self._first_calls.get(task.session_id) is first:
                del self._first_calls[task.session_id]

    def _check_vocabulary(self, out: PolicyOutput) -> None:
        tok = self.tokenizer
        size = vocabulary_size(tok)
        if size is None:
            return
        bad = next((i for i in out.output_ids if not 0 <= i < size), None)
        if bad is not None:
            raise PolicyError(
                f"the policy returned token id {bad}, outside the tokenizer's vocabulary "
                f"(size {size})"
            )

    async def _call(
        self,
        sandbox: Sandbox,
        task: AgentTask,
        call: ToolCall,
        deadline: float,
        stats: dict[str, Any],
    ) -> str:
        """Run one tool call; its observation."""
        if call.name == "bash":
            command = str(call.arguments["command"])
        elif call.name == "edit_file":
            payload = base64.b64encode(json.dumps(call.arguments).encode()).decode()
            if len(payload) > _EDIT_MAX_ARG:
                return "Error: the edit is too large for edit_file; write the file with bash"
            command = f"python3 -c {shlex.quote(_EDIT_SCRIPT)} {shlex.quote(payload)}"
        else:  # the parser validated the name against the declared tools
            return f"Error: the tool {call.name!r} is not available"
        try:  # what no sandbox can run (a NUL, past the kernel's argument limit) is the model's
            check_command(command)
        except InvalidArgumentError as exc:
            return f"Error: {exc}"
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
        return self._observation(
            result.exit_code, result.reason, result.output, result.output_truncated
        )


def _submits(calls: tuple[ToolCall, ...]) -> bool:
    return any(
        c.name == "bash" and str(c.arguments.get("command", "")).strip() == SUBMIT for c in calls
    )
