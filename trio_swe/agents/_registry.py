"""The registry of agents by name (``SWE_AGENT``): :func:`register_agent`, :func:`create_agent`.

Kept apart from the agents themselves so that :mod:`trio_swe.config` can check ``SWE_AGENT``
against it without importing them (the built-in ``bash`` and ``npm-cli`` register themselves
in ``_harness.py``, which the :mod:`trio_swe.agents` package imports).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .._errors import ConfigError, InvalidArgumentError

if TYPE_CHECKING:
    from ._types import Agent

__all__ = [
    "AgentFactory",
    "available_agents",
    "check_agent",
    "create_agent",
    "register_agent",
]

#: Builds an agent from the configuration (a :class:`~trio_swe.config.SweConfig`). Typed ``Any``
#: here because ``config`` asks this module for the agent names when it checks ``SWE_AGENT``:
#: naming ``SweConfig`` would make the two modules import each other.
AgentFactory = Callable[[Any], "Agent"]

_REGISTRY: dict[str, AgentFactory] = {}


class _NamesAnAgent(Protocol):
    """What :func:`create_agent` reads of a ``SweConfig``: the agent's name."""

    @property
    def agent(self) -> str: ...


def register_agent(name: str, factory: AgentFactory, *, replace: bool = False) -> None:
    """Make ``factory`` selectable as ``SWE_AGENT=<name>``.

    Raises:
        InvalidArgumentError: the name is taken (pass ``replace=True``) or empty.
    """
    if not name or not name.strip():
        raise InvalidArgumentError("agent name must be non-empty")
    if name in _REGISTRY and not replace:
        raise InvalidArgumentError(f"agent {name!r} is already registered (pass replace=True)")
    _REGISTRY[name] = factory


def available_agents() -> tuple[str, ...]:
    """Registered agent names, sorted."""
    return tuple(sorted(_REGISTRY))


def unknown_agent(name: str) -> ConfigError:
    """The error for an agent name nobody registered (it names the choices)."""
    return ConfigError(
        f"SWE_AGENT={name!r} is not a registered agent; choose one of "
        f"{', '.join(available_agents())} or call trio_swe.agents.register_agent()"
    )


def check_agent(name: str) -> None:
    """Check at start-up that ``name`` is a registered agent (``SWE_AGENT``).

    Raises:
        ConfigError: naming the agent and the registered ones.
    """
    if name not in _REGISTRY:
        raise unknown_agent(name)


def create_agent(config: _NamesAnAgent, name: str | None = None) -> Agent:
    """Build the agent named ``name`` (default ``config.agent``).

    Raises:
        ConfigError: no agent has that name (the message lists those that do).
    """
    key = name or config.agent
    try:
        factory = _REGISTRY[key]
    except KeyError:
        raise unknown_agent(key) from None
    return factory(config)
