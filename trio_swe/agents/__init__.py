"""Agents: the ``Agent`` protocol, the built-in bash agent, the npm CLI harness, policies.

* :class:`Agent` — ``await agent.run(sandbox, task) -> AgentOutcome``; a registry selects one by
  name (``SWE_AGENT``): :func:`register_agent`, :func:`create_agent`, :func:`available_agents`.
* :class:`BashAgent` — the built-in loop over a :class:`Policy` (one shell command per turn),
  recording a :class:`~trio_swe.TurnRecord` per policy call.
* :func:`install_npm_cli`, :func:`run_agent`, :class:`NpmCliAgent` — CLI coding agents shipped
  as npm packages.
* :class:`SGLangPolicy` — SGLang's ``/generate`` over httpx; :class:`ByteTokenizer` — a
  dependency-free tokenizer for demos and tests.
"""

from __future__ import annotations

from .._errors import PromptTooLongError
from . import _cli as _cli  # registers the CLI agents
from ._bash_agent import BashAgent, parse_command, render_first_prompt
from ._cli import CliAgent, cli_agent_host_paths
from ._harness import AgentInstallError, NpmCliAgent, install_npm_cli, run_agent
from ._policy import (
    Policy,
    PolicyError,
    PolicyOutput,
    PolicyStatistics,
    SGLangPolicy,
    StreamingPolicy,
)
from ._registry import AgentFactory, available_agents, create_agent, register_agent
from ._tokenizer import ByteTokenizer, Tokenizer
from ._types import Agent, AgentFinish, AgentOutcome, AgentTask, BaseAgent

__all__ = [
    "Agent",
    "AgentFactory",
    "AgentFinish",
    "AgentInstallError",
    "AgentOutcome",
    "AgentTask",
    "BaseAgent",
    "BashAgent",
    "ByteTokenizer",
    "CliAgent",
    "NpmCliAgent",
    "Policy",
    "PolicyError",
    "PolicyOutput",
    "PolicyStatistics",
    "PromptTooLongError",
    "SGLangPolicy",
    "StreamingPolicy",
    "Tokenizer",
    "available_agents",
    "cli_agent_host_paths",
    "create_agent",
    "install_npm_cli",
    "parse_command",
    "register_agent",
    "render_first_prompt",
    "run_agent",
]
