"""The demo scripts as a CLI agent's model says them: each shell step a call of that agent's own
shell tool, in Qwen3's tool-call format (``<tool_call>{json}</tool_call>``).

The bash agent's scripts (``DemoInstance.script``) are reused step for step: a ```` ```bash ````
step becomes a call of the CLI's shell tool with that command, ``submit`` becomes a final
plain-text answer (mini-swe-agent's own ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), and a
step without a command is dropped (a plain answer ends a CLI's run; ill-formed turns are
tested on their own). So each instance earns what its bash-agent script earns.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ..agents._bash_agent import parse_command
from ..models import ChatModel, ParsedOutput, ToolCall
from ._instances import DEMO_INSTANCES, DemoInstance
from ._policy_server import ScriptedCompletion

__all__ = ["CLI_SHELL_TOOLS", "cli_script", "cli_scripts", "tool_call_text"]

#: Each CLI agent's shell tool and its command argument.
CLI_SHELL_TOOLS: dict[str, tuple[str, str]] = {
    "claude-code": ("Bash", "command"),
    "codex": ("exec_command", "cmd"),
    "qwen-code": ("run_shell_command", "command"),
    "opencode": ("bash", "command"),
    "mini-swe-agent": ("bash", "command"),
}

#: Assistant turns a CLI puts in the history before the model's first turn (Qwen Code primes
#: the conversation with a scripted "Got it" reply), so the script skips as many turns.
_PRIMED_TURNS = {"qwen-code": 1}

_MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def tool_call_text(name: str, arguments: dict[str, object], reasoning: str = "") -> str:
    """One tool call as Qwen3 samples it (reasoning in ``<think>``, then ``<tool_call>``)."""
    think = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{think}<tool_call>\n{call}\n</tool_call>"


def _say(model: ChatModel | None, reasoning: str, call: ToolCall | None, text: str = "") -> str:
    if model is None:
        if call is None:
            return text
        return tool_call_text(call.name, dict(call.arguments), reasoning)
    message = ParsedOutput(
        text="",
        reasoning=reasoning or None,
        content=text,
        tool_calls=(call,) if call is not None else (),
    ).message()
    sampled = model.assistant_text(message)
    # The scripted server appends the stop token itself.
    return sampled[: -len(model.stop_text)] if sampled.endswith(model.stop_text) else sampled


def cli_script(
    agent: str, instance: DemoInstance, model: ChatModel | None = None
) -> list[str | ScriptedCompletion]:
    """``instance``'s script for ``agent`` (a key of :data:`CLI_SHELL_TOOLS`): Qwen3's format,
    or ``model``'s own (its template renders each turn as the model would sample it)."""
    tool, arg = CLI_SHELL_TOOLS[agent]
    out: list[str | ScriptedCompletion] = ["(primer)"] * _PRIMED_TURNS.get(agent, 0)
    for step in instance.script:
        text = step.text if isinstance(step, ScriptedCompletion) else step
        command = parse_command(text)
        if command is None:
            continue
        reasoning = text[: text.find("```")].strip()
        if command == "submit":
            if agent == "mini-swe-agent":
                body = _say(model, reasoning, ToolCall(tool, {arg: _MINI_SUBMIT}))
            else:
                body = _say(model, "", None, reasoning or "Done.")
        else:
            body = _say(model, reasoning, ToolCall(tool, {arg: command}))
        if isinstance(step, ScriptedCompletion):
            out.append(ScriptedCompletion(body, delay_sec=step.delay_sec, repeat=step.repeat))
        else:
            out.append(body)
    return out


def cli_scripts(
    agent: str,
    instances: Sequence[DemoInstance] = DEMO_INSTANCES,
    model: ChatModel | None = None,
) -> dict[str, list[str | ScriptedCompletion]]:
    """Every demo instance's script for ``agent``, by instance id."""
    return {inst.instance_id: cli_script(agent, inst, model) for inst in instances}
