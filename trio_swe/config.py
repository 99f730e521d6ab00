"""``SweConfig``: every knob of an episode and a rollout, read from the environment.

Nothing is read at import time: a trainer calls :meth:`SweConfig.from_env` when it starts (and
again whenever it wants to pick up changed variables). A bad value fails right there with a
:class:`~trio_swe.ConfigError` naming the variable, never halfway through a rollout.

Environment variables (defaults in brackets):

=============================  ======================================================  =========
variable                       meaning                                                  default
=============================  ======================================================  =========
``SWE_BACKEND``                sandbox backend of ``generate()`` and ``trio-swe run``   local
                               (``local``, ``e2b`` or ``docker``)
``SWE_TRAIN_PROTOCOL``         grading protocol of training episodes                    scaleswe
``SWE_EVAL_PROTOCOL``          grading protocol of evaluation episodes                  scaleswe
``SWE_AGENT``                  agent name in the registry (``trio_swe.agents``)         bash
``SWE_POLICY_URL``             base URL of the SGLang server the bash agent calls       http://127.0.0.1:30000
``SWE_AGENT_TIME_BUDGET_SEC``  wall-clock budget of the agent                           1800
``SWE_EVAL_TIMEOUT_SEC``       budget of the graded test run                            600
``SWE_SETUP_TIMEOUT_SEC``      budget of the workspace's pre-commands                   600
``SWE_ROLLOUT_GUARD_SEC``      outer bound of an episode; 0 = agent+setup+eval+headroom  0
``SWE_GUARD_HEADROOM_SEC``     added to the computed guard (boot, patch, kill)          180
``SWE_BOOT_CONCURRENCY``       sandboxes booting at once, shared by all episodes        16
``SWE_BOOT_RETRIES``           boot retries after the first attempt                     2
``SWE_BOOT_BACKOFF_SEC``       base of the full-jitter exponential boot backoff         1.0
``SWE_BOOT_BACKOFF_MAX_SEC``   cap of one boot backoff                                  30
``SWE_MAX_CONTEXT_TOKENS``     cap of a sample's tokens; 0 = no cap                     0
``SWE_MAX_TURNS``              turn limit of the bash agent                             50
``SWE_COMMAND_TIMEOUT_SEC``    limit of one bash-agent command                          300
``SWE_OBSERVATION_MAX_CHARS``  tail of a command's output shown to the policy           4000
``NPM_INSTALL_RETRIES``        attempts of ``npm install`` of a CLI agent               3
``NPM_INSTALL_BACKOFF_SEC``    backoff unit between npm attempts (x attempt number)     2.0
``SWE_TOKENIZER``              checkpoint folder of the bash agent's tokenizer and      (none:
                               chat template (tool calls); generate() prefers            byte
                               slime's ``args.hf_checkpoint``                           tokens)
``SWE_TOOL_PARSER``            tool-call format: ``hermes``, ``qwen3_coder``, or         auto
                               ``auto`` (inferred from the chat template)
=============================  ======================================================  =========
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec

from ._errors import ConfigError

__all__ = ["BACKENDS", "SweConfig"]

#: The values ``SWE_BACKEND`` accepts.
BACKENDS: tuple[str, ...] = ("local", "e2b", "docker")


class SweConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Configuration of episodes and rollouts (see the module docstring for the variables).

    Attributes:
        backend: sandbox backend of ``generate()`` and ``trio-swe run`` (``SWE_BACKEND``), one of
            :data:`BACKENDS`.
        train_protocol: grading protocol of training episodes (``SWE_TRAIN_PROTOCOL``).
        eval_protocol: grading protocol of evaluation episodes (``SWE_EVAL_PROTOCOL``).
        agent: the agent's name in the registry (``SWE_AGENT``).
        policy_url: base URL of the SGLang-compatible server (``SWE_POLICY_URL``).
        agent_time_budget_sec: the agent's wall-clock budget.
        eval_timeout_sec: the graded test run's budget.
        setup_timeout_sec: the workspace pre-commands' budget.
        rollout_guard_sec: outer bound of one episode; 0 means :attr:`guard_sec` is computed.
        guard_headroom_sec: added to the agent, setup and eval budgets for the computed guard.
        boot_concurrency: how many sandboxes may boot at once across all episodes of a run.
        boot_retries: boot retries after the first attempt (so ``1 + boot_retries`` attempts).
        boot_backoff_sec: base of the full-jitter exponential backoff between boot attempts.
        boot_backoff_max_sec: cap of one backoff.
        max_context_tokens: cap of a sample's tokens (``0``: no cap).
        max_turns: turn limit of the built-in bash agent.
        command_timeout_sec: limit of one command of the bash agent.
        observation_max_chars: how much of a command's output the bash agent shows the policy.
        npm_install_retries: attempts of ``npm install`` for a CLI agent (``NPM_INSTALL_RETRIES``).
        npm_install_backoff_sec: backoff unit between npm attempts (``NPM_INSTALL_BACKOFF_SEC``).
        tokenizer: checkpoint folder whose tokenizer and chat template the bash agent speaks
            (``SWE_TOKENIZER``); empty: the byte tokenizer and its text dialect.
        tool_parser: the checkpoint's tool-call format (``SWE_TOOL_PARSER``), or ``auto``.
    """

    backend: str = "local"
    train_protocol: str = "scaleswe"
    eval_protocol: str = "scaleswe"
    agent: str = "bash"
    policy_url: str = "http://127.0.0.1:30000"
    agent_time_budget_sec: float = 1800.0
    eval_timeout_sec: float = 600.0
    setup_timeout_sec: float = 600.0
    rollout_guard_sec: float = 0.0
    guard_headroom_sec: float = 180.0
    boot_concurrency: int = 16
    boot_retries: int = 2
    boot_backoff_sec: float = 1.0
    boot_backoff_max_sec: float = 30.0
    max_context_tokens: int = 0
    max_turns: int = 50
    command_timeout_sec: float = 300.0
    observation_max_chars: int = 4000
    npm_install_retries: int = 3
    npm_install_backoff_sec: float = 2.0
    tokenizer: str = ""
    tool_parser: str = "auto"

    def __post_init__(self) -> None:
        _check(self.backend in BACKENDS, "backend", f"{self.backend!r}: {_BACKEND_CHOICES}")
        _check(self.agent_time_budget_sec > 0, "agent_time_budget_sec", "must be > 0")
        _check(self.eval_timeout_sec > 0, "eval_timeout_sec", "must be > 0")
        _check(self.setup_timeout_sec > 0, "setup_timeout_sec", "must be > 0")
        _check(self.rollout_guard_sec >= 0, "rollout_guard_sec", "must be >= 0")
        _check(self.guard_headroom_sec >= 0, "guard_headroom_sec", "must be >= 0")
        _check(self.boot_concurrency >= 1, "boot_concurrency", "must be >= 1")
        _check(self.boot_retries >= 0, "boot_retries", "must be >= 0")
        _check(self.boot_backoff_sec >= 0, "boot_backoff_sec", "must be >= 0")
        _check(self.boot_backoff_max_sec >= 0, "boot_backoff_max_sec", "must be >= 0")
        _check(self.max_context_tokens >= 0, "max_context_tokens", "must be >= 0")
        _check(self.max_turns >= 1, "max_turns", "must be >= 1")
        _check(self.command_timeout_sec > 0, "command_timeout_sec", "must be > 0")
        _check(self.observation_max_chars >= 0, "observation_max_chars", "must be >= 0")
        _check(self.npm_install_retries >= 1, "npm_install_retries", "must be >= 1")
        _check(self.npm_install_backoff_sec >= 0, "npm_install_backoff_sec", "must be >= 0")
        _check(bool(self.agent.strip()), "agent", "must be a non-empty name")
        if self.tokenizer:
            # Loaded later (by the agent); a path that cannot be a checkpoint fails right here.
            _check(
                os.path.isdir(self.tokenizer),
                "tokenizer",
                f"{self.tokenizer!r} is not a checkpoint directory",
            )
        if self.tool_parser != "auto":
            from .models import available_tool_parsers

            _check(
                self.tool_parser in available_tool_parsers(),
                "tool_parser",
                f"{self.tool_parser!r}: choose auto or one of {', '.join(available_tool_parsers())}",
            )

    @property
    def guard_sec(self) -> float:
        """The outer bound of one episode: ``rollout_guard_sec``, or agent + setup + eval + headroom."""
        if self.rollout_guard_sec > 0:
            return self.rollout_guard_sec
        return (
            self.agent_time_budget_sec
            + self.eval_timeout_sec
            + self.setup_timeout_sec
            + self.guard_headroom_sec
        )

    def protocol_for(self, *, evaluation: bool) -> str:
        """The grading protocol of an evaluation (``True``) or a training episode."""
        return self.eval_protocol if evaluation else self.train_protocol

    def validate_protocols(self) -> None:
        """Check that both protocols are registered and usable (e.g. swebench importable).

        Raises:
            ConfigError: naming the protocol and the fix.
        """
        from .grading import require_protocol

        for name in {self.train_protocol, self.eval_protocol}:
            require_protocol(name)

    def check_rows(self, rows: Iterable[Any]) -> None:
        """Check that this install can grade rows shaped like ``rows`` under both protocols.

        E.g. classic SWE-bench rows with swebench 5.x installed (it builds no eval script for
        them) fail here, naming the row and the ``pip install`` that fixes it, instead of every
        episode ending ``unevaluable``. One row of each shape is checked.

        Raises:
            ConfigError: naming the row, the reason and the fix.
        """
        from .grading import check_rows

        sample = list(rows)
        for name in dict.fromkeys((self.train_protocol, self.eval_protocol)):
            check_rows(sample, name)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        check_protocols: bool = True,
        rows: Iterable[Any] | None = None,
    ) -> SweConfig:
        """Read the configuration from the environment (or ``environ``).

        Unset or empty variables keep their defaults.

        Args:
            environ: the variables to read; ``os.environ`` by default.
            check_protocols: also check that both protocols are usable now.
            rows: dataset rows to be run (e.g. the first few): also check that this install can
                grade their shapes (:meth:`check_rows`), when ``check_protocols``.

        Raises:
            ConfigError: a variable is malformed or out of range (the message names it), or a
                protocol is unknown or unusable.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field, (var, parse) in _ENV_FIELDS.items():
            raw = env.get(var, "").strip()
            if not raw:
                continue
            try:
                values[field] = parse(raw)
            except ValueError:
                raise ConfigError(f"{var}={raw!r} is not a valid {_KIND[parse]}") from None
        try:
            config = cls(**values)  # type: ignore[arg-type]
        except ConfigError as exc:
            field = str(exc).split(" ", 1)[0]
            var = _ENV_FIELDS.get(field, (field, str))[0]
            raise ConfigError(f"{var}: {exc}") from None
        if check_protocols:
            config.validate_protocols()
            if rows is not None:
                config.check_rows(rows)
        return config


def _check(ok: bool, field: str, what: str) -> None:
    if not ok:
        raise ConfigError(f"{field} {what}")


def _parse_name(raw: str) -> str:
    return raw


_BACKEND_CHOICES = "choose one of " + ", ".join(repr(b) for b in BACKENDS)


def _parse_backend(raw: str) -> str:
    if raw not in BACKENDS:
        raise ValueError(raw)
    return raw


def _parse_float(raw: str) -> float:
    value = float(raw)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(raw)
    return value


_KIND: dict[Callable[[str], object], str] = {
    _parse_name: "name",
    _parse_backend: f"backend; {_BACKEND_CHOICES}",
    _parse_float: "number",
    int: "integer",
}

_ENV_FIELDS: dict[str, tuple[str, Callable[[str], object]]] = {
    "backend": ("SWE_BACKEND", _parse_backend),  # first: a wrong backend is reported first
    "train_protocol": ("SWE_TRAIN_PROTOCOL", _parse_name),
    "eval_protocol": ("SWE_EVAL_PROTOCOL", _parse_name),
    "agent": ("SWE_AGENT", _parse_name),
    "policy_url": ("SWE_POLICY_URL", _parse_name),
    "agent_time_budget_sec": ("SWE_AGENT_TIME_BUDGET_SEC", _parse_float),
    "eval_timeout_sec": ("SWE_EVAL_TIMEOUT_SEC", _parse_float),
    "setup_timeout_sec": ("SWE_SETUP_TIMEOUT_SEC", _parse_float),
    "rollout_guard_sec": ("SWE_ROLLOUT_GUARD_SEC", _parse_float),
    "guard_headroom_sec": ("SWE_GUARD_HEADROOM_SEC", _parse_float),
    "boot_concurrency": ("SWE_BOOT_CONCURRENCY", int),
    "boot_retries": ("SWE_BOOT_RETRIES", int),
    "boot_backoff_sec": ("SWE_BOOT_BACKOFF_SEC", _parse_float),
    "boot_backoff_max_sec": ("SWE_BOOT_BACKOFF_MAX_SEC", _parse_float),
    "max_context_tokens": ("SWE_MAX_CONTEXT_TOKENS", int),
    "max_turns": ("SWE_MAX_TURNS", int),
    "command_timeout_sec": ("SWE_COMMAND_TIMEOUT_SEC", _parse_float),
    "observation_max_chars": ("SWE_OBSERVATION_MAX_CHARS", int),
    "npm_install_retries": ("NPM_INSTALL_RETRIES", int),
    "npm_install_backoff_sec": ("NPM_INSTALL_BACKOFF_SEC", _parse_float),
    "tokenizer": ("SWE_TOKENIZER", _parse_name),
    "tool_parser": ("SWE_TOOL_PARSER", _parse_name),
}

#: The environment variable of each field, for documentation and error messages.
ENV_VARS: Mapping[str, str] = {field: var for field, (var, _) in _ENV_FIELDS.items()}
