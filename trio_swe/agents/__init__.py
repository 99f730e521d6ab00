"""Agents: the ``Agent`` protocol, the built-in bash agent, the CLI agents and their harness.

* :class:`Agent` — ``await agent.run(sandbox, task) -> AgentOutcome``; a registry selects one by
  name (``SWE_AGENT``): :func:`register_agent`, :func:`create_agent`, :func:`available_agents`.
* :class:`BashAgent` — the built-in loop over a :class:`Policy` (one shell command per turn),
  recording a :class:`~trio_swe.TurnRecord` per policy call.
* :func:`install_npm_cli`, :func:`run_agent`, :class:`NpmCliAgent` — CLI coding agents shipped
  as npm packages.

Policies (SGLang, vLLM) and tokenizers live below the agents, in :mod:`trio_swe.policy`.
"""

from __future__ import annotations

from .._errors import PromptTooLongError
from . import _cli as _cli  # registers the CLI agents
from ._bash_agent import BashAgent, parse_command, render_first_prompt
from ._cli import CLI_AGENTS, CliAgent, cli_agent_host_paths
from ._harness import AgentInstallError, NpmCliAgent, install_npm_cli, run_agent
from ._install import ensure_installed
from ._registry import AgentFactory, available_agents, check_agent, create_agent, register_agent
from ._types import Agent, AgentFinish, AgentOutcome, AgentTask, BaseAgent, FirstTurnAgent

__all__ = [
    "CLI_AGENTS",
    "Agent",
    "AgentFactory",
    "AgentFinish",
    "AgentInstallError",
    "AgentOutcome",
    "AgentTask",
    "BaseAgent",
    "BashAgent",
    "CliAgent",
    "FirstTurnAgent",
    "NpmCliAgent",
    "PromptTooLongError",
    "available_agents",
    "check_agent",
    "cli_agent_host_paths",
    "create_agent",
    "ensure_installed",
    "install_npm_cli",
    "parse_command",
    "register_agent",
    "render_first_prompt",
    "run_agent",
]
