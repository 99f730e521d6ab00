"""``SweConfig``: the options of every layer, read from the environment.

Each layer has its own options struct, and :class:`SweConfig` composes them:

======================  =====================  ==================================================
struct                  ``SweConfig`` field    layer
======================  =====================  ==================================================
(``SweConfig`` itself)  ``backend``, ...       what runs: backend, protocols, agent
:class:`EpisodeBudgets`  ``episode``           one episode's budgets and its sample cap
:class:`BootPolicy`     ``boot``               booting sandboxes: concurrency, retries, backoff
:class:`BashAgentOptions`  ``bash``            the built-in bash agent and its policy server
:class:`PolicyOptions`  ``policy``             the policy server's API and the sampling options
:class:`NpmOptions`     ``npm``                CLI agents shipped as npm packages
:class:`RayOptions`     ``ray``                slime's episodes on a shared pool of Ray workers
======================  =====================  ==================================================

Nothing is read at import time: a trainer calls :meth:`SweConfig.from_env` when it starts (and
again whenever it wants to pick up changed variables). A bad value fails right there with a
:class:`~trio_swe.ConfigError` naming the variable, never halfway through a rollout. Building
the structs in Python checks them the same way (a wrong type or an out-of-range value is a
``ConfigError``, not a ``TypeError`` later), and so does :func:`msgspec.structs.replace`, which is
how the CLI applies its flags (:func:`replace_option`).

Each option is documented once, where it is declared: its meaning in the ``Attributes`` of its
struct; its variable, range and default in the field itself. The rest of the project (docs,
other modules) names the variable and refers here. The variables, by struct (:data:`ENV_VARS`
maps each option's dotted path to its variable):

* :class:`SweConfig`: ``SWE_BACKEND``, ``SWE_TRAIN_PROTOCOL``, ``SWE_EVAL_PROTOCOL``,
  ``SWE_AGENT``.
* :class:`EpisodeBudgets`: ``SWE_AGENT_TIME_BUDGET_SEC``, ``SWE_EVAL_TIMEOUT_SEC``,
  ``SWE_SETUP_TIMEOUT_SEC``, ``SWE_ROLLOUT_GUARD_SEC``, ``SWE_GUARD_HEADROOM_SEC``,
  ``SWE_MAX_CONTEXT_TOKENS``, ``SWE_ILL_FORMED_POLICY``, ``SWE_REALIGN_MAX_TOKENS``.
* :class:`BootPolicy`: ``SWE_BOOT_CONCURRENCY``, ``SWE_BOOT_RETRIES``, ``SWE_BOOT_BACKOFF_SEC``,
  ``SWE_BOOT_BACKOFF_MAX_SEC``.
* :class:`BashAgentOptions`: ``SWE_POLICY_URL``, ``SWE_MAX_TURNS``, ``SWE_COMMAND_TIMEOUT_SEC``,
  ``SWE_OBSERVATION_MAX_CHARS``, ``SWE_TOKENIZER``, ``SWE_TOOL_PARSER``.
* :class:`PolicyOptions`: ``SWE_POLICY_API``, ``SWE_TEMPERATURE``, ``SWE_TOP_P``,
  ``SWE_MAX_NEW_TOKENS``, ``SWE_SEED``.
* :class:`NpmOptions`: ``NPM_INSTALL_RETRIES``, ``NPM_INSTALL_BACKOFF_SEC``, ``SWE_NPM_PACKAGE``,
  ``SWE_NPM_START_CMD``, ``SWE_NPM_CHECK_CMD``, ``SWE_NPM_PREFIX``.
* :class:`RayOptions`: ``SWE_RAY_WORKERS``, ``SWE_RAY_CONCURRENCY``, ``SWE_RAY_ADDRESS``,
  ``SWE_RAY_POOL``, ``SWE_RAY_NAMESPACE``, ``SWE_RAY_MAX_BOOTING``, ``SWE_RAY_MAX_ALIVE``,
  ``SWE_RAY_DETACHED``.

Not options of ``SweConfig`` (each documented where it is read): a backend's own settings
(``E2B_*``, ``SSL_CERT_FILE``: :class:`~trio_swe.E2BBackend`;
``DOCKER_HOST``, ``SWE_DOCKER_BASE_IMAGE``: :class:`~trio_swe.DockerBackend`), the CLI agents'
install cache (``SWE_AGENT_CACHE``, :mod:`trio_swe.agents._install`) and gateway sockets
(``SWE_GATEWAY_SOCKET_DIR``, :mod:`trio_swe.agents._cli`), and ``trio-swe run --ray``'s connect
timeout (``SWE_RAY_CONNECT_TIMEOUT_SEC``, :mod:`trio_swe.cli._ray`).

Numbers are decimal ASCII (``1_000``, ``+5`` and non-ASCII digits are refused), finite, and
within the range each field states. Flags are ``1``/``0`` (or ``true``/``false``). The ``SWE_RAY_*``
options are plain data here: reading them needs no Ray (``trio-swe[ray]`` is an optional extra),
only running the pool does (:mod:`trio_swe.ray`).

Adding an option: put a field on the struct of its layer, typed with its constraints and its
variable, document it in the struct's ``Attributes``, and list its variable above::

    class BashAgentOptions(_Options, frozen=True, kw_only=True):
        ...
        tokenizer: Annotated[str, env("SWE_TOKENIZER")] = ""

``from_env`` reads it, the error for a bad value names the variable, ``ENV_VARS`` lists it, and
the tests that check every field has a variable (``tests/test_config.py``) cover it. A new
layer is a new ``_Options`` struct and a field of that type on :class:`SweConfig`.
"""

from __future__ import annotations

import contextvars
import math
import os
import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from ._errors import ConfigError

__all__ = [
    "BACKENDS",
    "ENV_VARS",
    "BashAgentOptions",
    "BootPolicy",
    "EpisodeBudgets",
    "NpmOptions",
    "RayOptions",
    "SweConfig",
    "env",
    "replace_option",
]

#: The built-in values of ``SWE_BACKEND`` (see :func:`trio_swe.sandbox.available_backends`).
BACKENDS: tuple[str, ...] = ("local", "e2b", "docker")

#: Seconds: positive, finite, at most a year.
_YEAR = 365 * 24 * 3600.0


def env(name: str, *, none: str | None = None, **constraints: Any) -> msgspec.Meta:
    """The metadata of an option: its environment variable and its constraints (``ge``, ...).

    ``none``: the word that, as the variable's value, means ``None`` (``SWE_RAY_WORKERS=auto``).
    """
    extra = {"env": name} if none is None else {"env": name, "none": none}
    return msgspec.Meta(extra=extra, **constraints)


Seconds = Annotated[float, msgspec.Meta(gt=0, le=_YEAR)]
SecondsOrZero = Annotated[float, msgspec.Meta(ge=0, le=_YEAR)]
Count = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Positive = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1)]
Name = Annotated[str, msgspec.Meta(pattern=r"\S")]
_URL_PATTERN = r"^https?://[^/\s:]+(:[0-9]{1,5})?(/\S*)?$"
Url = Annotated[str, msgspec.Meta(pattern=_URL_PATTERN)]
_WORD_PATTERN = r"^[A-Za-z0-9._-]+$"
Word = Annotated[str, msgspec.Meta(pattern=_WORD_PATTERN)]
_NO_SPACE_PATTERN = r"^\S+$"

_VALIDATING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "trio_swe_config_validating", default=False
)

S = TypeVar("S", bound="_Options")


class _Options(msgspec.Struct, frozen=True, kw_only=True):
    """Base of the options structs: checked against their own annotations when built."""

    def __post_init__(self) -> None:
        if _VALIDATING.get():
            return  # an inner struct rebuilt by the check below
        token = _VALIDATING.set(True)
        try:
            msgspec.convert(msgspec.to_builtins(self), type(self))
        except msgspec.ValidationError as exc:
            raise ConfigError(f"{type(self).__name__}: {exc}") from None
        finally:
            _VALIDATING.reset(token)


class EpisodeBudgets(_Options, frozen=True, kw_only=True):
    """One episode's budgets (seconds) and its sample cap.

    Attributes:
        agent_time_budget_sec: the agent's wall-clock budget.
        eval_timeout_sec: the graded test run's budget.
        setup_timeout_sec: the workspace pre-commands' budget.
        rollout_guard_sec: outer bound of one episode; 0 means :attr:`guard_sec` is computed.
        guard_headroom_sec: added to the agent, setup and eval budgets for the computed guard
            (the time boot, patch and kill take).
        max_context_tokens: cap of a sample's tokens, and of one turn's prompt + output (the
            agent's ``task.max_context_tokens``) (``0``: no cap).
        ill_formed_policy: ``mask`` keeps an ill-formed turn's tokens as context (loss 0; a
            sample with no trained token is dropped), ``train`` trains them like any other.
        realign_max_tokens: a turn whose prompt rewrites the tail of the last response (a
            client re-rendering its history) realigns the sample onto the new tokens when that
            response was shorter than this (slime's gate, 1024 there), dropping the sampled
            tokens it rewrote; 0 (the default) starts a new sample instead, so every token the
            engine sampled is trained once, with its log-prob.
    """

    agent_time_budget_sec: Annotated[Seconds, env("SWE_AGENT_TIME_BUDGET_SEC")] = 1800.0
    eval_timeout_sec: Annotated[Seconds, env("SWE_EVAL_TIMEOUT_SEC")] = 600.0
    setup_timeout_sec: Annotated[Seconds, env("SWE_SETUP_TIMEOUT_SEC")] = 600.0
    rollout_guard_sec: Annotated[SecondsOrZero, env("SWE_ROLLOUT_GUARD_SEC")] = 0.0
    guard_headroom_sec: Annotated[SecondsOrZero, env("SWE_GUARD_HEADROOM_SEC")] = 180.0
    max_context_tokens: Annotated[Count, env("SWE_MAX_CONTEXT_TOKENS")] = 0
    ill_formed_policy: Annotated[Literal["mask", "train"], env("SWE_ILL_FORMED_POLICY")] = "mask"
    realign_max_tokens: Annotated[Count, env("SWE_REALIGN_MAX_TOKENS")] = 0

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


class BootPolicy(_Options, frozen=True, kw_only=True):
    """How sandboxes boot: how many at once, and the retries of a failed boot.

    Attributes:
        concurrency: sandboxes booting at once across all episodes of a trio run.
        retries: boot retries after the first attempt (so ``1 + retries`` attempts).
        backoff_sec: base of the full-jitter exponential backoff between attempts.
        backoff_max_sec: cap of one backoff.
    """

    concurrency: Annotated[Positive, env("SWE_BOOT_CONCURRENCY")] = 16
    retries: Annotated[Count, env("SWE_BOOT_RETRIES")] = 2
    backoff_sec: Annotated[SecondsOrZero, env("SWE_BOOT_BACKOFF_SEC")] = 1.0
    backoff_max_sec: Annotated[SecondsOrZero, env("SWE_BOOT_BACKOFF_MAX_SEC")] = 30.0


class BashAgentOptions(_Options, frozen=True, kw_only=True):
    """The built-in bash agent and the policy server it calls.

    Attributes:
        policy_url: base URL of the policy server (``http://`` or ``https://``); its API is
            ``policy.api``.
        max_turns: policy calls per run.
        command_timeout_sec: limit of one command.
        observation_max_chars: how much of a command's output the policy is shown.
        tokenizer: checkpoint folder whose tokenizer and chat template the bash agent speaks
            (its tool-call dialect); empty: the byte tokenizer and its text dialect. A path that
            is not a directory is a ``ConfigError``; slime's ``generate()`` prefers
            ``args.hf_checkpoint``.
        tool_parser: the checkpoint's tool-call format (``hermes``, ``qwen3_coder``, or one
            registered), or ``auto``: inferred from the chat template.
    """

    policy_url: Annotated[Url, env("SWE_POLICY_URL")] = "http://127.0.0.1:30000"
    max_turns: Annotated[Positive, env("SWE_MAX_TURNS")] = 50
    command_timeout_sec: Annotated[Seconds, env("SWE_COMMAND_TIMEOUT_SEC")] = 300.0
    observation_max_chars: Annotated[Count, env("SWE_OBSERVATION_MAX_CHARS")] = 4000
    tokenizer: Annotated[str, env("SWE_TOKENIZER")] = ""
    tool_parser: Annotated[Name, env("SWE_TOOL_PARSER")] = "auto"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer and not os.path.isdir(self.tokenizer):
            # Loaded later (by the agent); a path that cannot be a checkpoint fails right here.
            raise ConfigError(f"tokenizer {self.tokenizer!r} is not a checkpoint directory")
        if self.tool_parser != "auto":
            from .models import available_tool_parsers

            choices = available_tool_parsers()
            if self.tool_parser not in choices:
                raise ConfigError(
                    f"tool_parser {self.tool_parser!r}: choose auto or one of {', '.join(choices)}"
                )


class PolicyOptions(_Options, frozen=True, kw_only=True):
    """The policy server's API and the sampling options of every call (the URL is
    ``bash.policy_url``).

    Attributes:
        api: ``sglang`` (``/generate``), ``vllm`` (``/inference/v1/generate``) or
            ``vllm-completions`` (``/v1/completions`` with prompt ids).
        temperature: sampling temperature.
        top_p: nucleus sampling's p (1: off).
        max_new_tokens: cap of one turn's sampled tokens; 0 leaves it to the agent.
        seed: the run's base seed (each episode and turn derives its own from it); None (the
            variable's ``none``) leaves sampling to the engine's own randomness.
    """

    api: Annotated[Name, env("SWE_POLICY_API")] = "sglang"
    temperature: Annotated[float, env("SWE_TEMPERATURE", ge=0, le=100)] = 1.0
    top_p: Annotated[float, env("SWE_TOP_P", gt=0, le=1)] = 1.0
    max_new_tokens: Annotated[Count, env("SWE_MAX_NEW_TOKENS")] = 0
    seed: Annotated[Count | None, env("SWE_SEED", none="none")] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        from .policy import POLICY_APIS

        if self.api not in POLICY_APIS:
            raise ConfigError(f"policy api {self.api!r}: choose one of {', '.join(POLICY_APIS)}")

    def sampling_params(self) -> dict[str, Any]:
        """The sampling parameters (SGLang's names) these options set."""
        params: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p}
        if self.max_new_tokens:
            params["max_new_tokens"] = self.max_new_tokens
        if self.seed is not None:
            params["seed"] = self.seed
        return params


#: Cap of one wait between npm install attempts (the backoff's base is ``NPM_INSTALL_BACKOFF_SEC``).
NPM_BACKOFF_MAX_SEC = 60.0


class NpmOptions(_Options, frozen=True, kw_only=True):
    """CLI agents shipped as npm packages (the ``npm-cli`` agent and :func:`install_npm_cli`).

    Attributes:
        install_retries: attempts of ``npm install`` (of every CLI agent's install).
        install_backoff_sec: base of the full-jitter exponential backoff between attempts
            (each wait at most :data:`NPM_BACKOFF_MAX_SEC`).
        package: host path of the package tarball (``npm pack``); ``npm-cli`` needs it.
        start_cmd: the CLI's start command template (``{prompt}``, ``{workdir}``,
            ``{session_id}``: see :class:`~trio_swe.agents.NpmCliAgent`); ``npm-cli`` needs it.
        check_cmd: a command that proves the install worked.
        prefix: npm's global prefix inside the sandbox.
    """

    install_retries: Annotated[Positive, env("NPM_INSTALL_RETRIES")] = 3
    install_backoff_sec: Annotated[SecondsOrZero, env("NPM_INSTALL_BACKOFF_SEC")] = 2.0
    package: Annotated[str, env("SWE_NPM_PACKAGE")] = ""
    start_cmd: Annotated[str, env("SWE_NPM_START_CMD")] = ""
    check_cmd: Annotated[Name, env("SWE_NPM_CHECK_CMD")] = "true"
    prefix: Annotated[str, env("SWE_NPM_PREFIX", pattern=r"^/")] = "/usr/local"


class RayOptions(_Options, frozen=True, kw_only=True):
    """slime's ``generate()`` on a pool of Ray workers shared by every rollout process.

    Plain data: :func:`trio_swe.ray.shared_pool` runs the pool (and needs ``trio-swe[ray]``).

    Attributes:
        workers: workers in the pool of slime's ``generate()``; ``None`` (the variable's
            ``auto``): one per node; ``0`` (or unset): no Ray, episodes run in the calling
            process (see :attr:`enabled`).
        concurrency: agents at once per worker (as many more episodes boot, wait for an agent
            slot or grade beside them: ``WorkerPool``'s default ``boot_ahead``).
        address: the cluster to join when Ray is not initialised yet.
        pool: name of the shared pool (its workers are ``NAME-i``).
        namespace: Ray namespace of the pool and its limiter.
        max_booting: cluster-wide cap on sandboxes booting at once (``0``: none).
        max_alive: cluster-wide cap on sandboxes alive at once (``0``: none).
        detached: the workers outlive the process that started them.
    """

    workers: Annotated[Count | None, env("SWE_RAY_WORKERS", none="auto")] = 0
    concurrency: Annotated[Positive, env("SWE_RAY_CONCURRENCY")] = 16
    address: Annotated[str, env("SWE_RAY_ADDRESS", pattern=_NO_SPACE_PATTERN)] = "auto"
    pool: Annotated[Word, env("SWE_RAY_POOL")] = "trio_swe-pool"
    namespace: Annotated[Word, env("SWE_RAY_NAMESPACE")] = "trio_swe"
    max_booting: Annotated[Count, env("SWE_RAY_MAX_BOOTING")] = 0
    max_alive: Annotated[Count, env("SWE_RAY_MAX_ALIVE")] = 0
    detached: Annotated[bool, env("SWE_RAY_DETACHED")] = False

    @property
    def enabled(self) -> bool:
        """Episodes go to the Ray pool (``SWE_RAY_WORKERS`` is a number >= 1 or ``auto``)."""
        return self.workers != 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RayOptions | None:
        """The ``SWE_RAY_*`` options alone, or None when ``SWE_RAY_WORKERS`` is unset or ``0``.

        :meth:`SweConfig.from_env` reads the same variables into ``config.ray``.

        Raises:
            ConfigError: a variable is malformed or out of range (the message names it).
        """
        options = _from_environ(cls, os.environ if environ is None else environ)
        return options if options.enabled else None


class SweConfig(_Options, frozen=True, kw_only=True):
    """Configuration of episodes and rollouts (see the module docstring for the variables).

    Attributes:
        backend: sandbox backend of ``generate()`` and ``trio-swe run``: ``local``, ``e2b``,
            ``docker``, or one registered (:func:`~trio_swe.sandbox.register_backend`).
        train_protocol: grading protocol of training episodes.
        eval_protocol: grading protocol of evaluation episodes.
        agent: the agent's name in the registry (:mod:`trio_swe.agents`).
        episode: the episode's budgets, :class:`EpisodeBudgets`.
        boot: how sandboxes boot, :class:`BootPolicy`.
        bash: the bash agent and its policy server, :class:`BashAgentOptions`.
        policy: the policy server's API and the sampling options, :class:`PolicyOptions`.
        npm: CLI agents from npm, :class:`NpmOptions`.
        ray: slime's episodes on a shared pool of Ray workers, :class:`RayOptions`.
    """

    backend: Annotated[Name, env("SWE_BACKEND")] = "local"
    train_protocol: Annotated[Name, env("SWE_TRAIN_PROTOCOL")] = "scaleswe"
    eval_protocol: Annotated[Name, env("SWE_EVAL_PROTOCOL")] = "scaleswe"
    agent: Annotated[Name, env("SWE_AGENT")] = "bash"
    episode: EpisodeBudgets = msgspec.field(default_factory=EpisodeBudgets)
    boot: BootPolicy = msgspec.field(default_factory=BootPolicy)
    bash: BashAgentOptions = msgspec.field(default_factory=BashAgentOptions)
    policy: PolicyOptions = msgspec.field(default_factory=PolicyOptions)
    npm: NpmOptions = msgspec.field(default_factory=NpmOptions)
    ray: RayOptions = msgspec.field(default_factory=RayOptions)

    def __post_init__(self) -> None:
        super().__post_init__()
        from .sandbox import available_backends

        choices = available_backends()
        if self.backend not in choices:
            raise ConfigError(
                f"backend {self.backend!r}: choose one of {', '.join(repr(n) for n in choices)}"
            )

    @property
    def guard_sec(self) -> float:
        """The outer bound of one episode (:attr:`EpisodeBudgets.guard_sec`)."""
        return self.episode.guard_sec

    def protocol_for(self, *, evaluation: bool) -> str:
        """The grading protocol of an evaluation (``True``) or a training episode."""
        return self.eval_protocol if evaluation else self.train_protocol

    def validate_protocols(self) -> None:
        """Check that both protocols are registered and usable (e.g. swebench importable).

        Raises:
            ConfigError: naming the protocol and the fix.
        """
        from .grading import require_protocol

        checked: set[str] = set()
        for var, name in (
            ("SWE_TRAIN_PROTOCOL", self.train_protocol),
            ("SWE_EVAL_PROTOCOL", self.eval_protocol),
        ):
            if name in checked:
                continue
            checked.add(name)
            try:
                require_protocol(name)
            except ConfigError as exc:
                raise ConfigError(f"{var}={name!r}: {exc}") from None

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

        Unset or empty variables keep their defaults. ``SWE_BACKEND`` is checked first, then
        every other variable, then (``check_protocols``) the protocols. The agent's name is
        checked where agents are made (:func:`trio_swe.agents.check_agent`, at a run's start):
        the configuration sits below the agents it configures.

        Args:
            environ: the variables to read; ``os.environ`` by default.
            check_protocols: also check that both protocols are usable now.
            rows: dataset rows to be run (e.g. the first few): also check that this install can
                grade their shapes (:meth:`check_rows`), when ``check_protocols``.

        Raises:
            ConfigError: a variable is malformed or out of range (the message names it), the
                backend is unknown (the message names the choices), or a protocol is
                unknown or unusable.
        """
        config = _from_environ(cls, os.environ if environ is None else environ)
        if check_protocols:
            config.validate_protocols()
            if rows is not None:
                config.check_rows(rows)
        return config

    @staticmethod
    def _check_backend(var: str, name: str) -> None:
        from .sandbox import available_backends

        choices = available_backends()
        if name not in choices:
            raise ConfigError(
                f"{var}={name!r} is not a backend; choose one of "
                f"{', '.join(repr(n) for n in choices)}"
            )


def _from_environ(cls: type[S], source: Mapping[str, str]) -> S:
    """``cls`` with every option whose variable is set in ``source``; errors name the variable.

    Unset or blank variables keep their defaults. ``SWE_BACKEND`` (first in SweConfig) is
    checked before the others.
    """
    given: list[tuple[tuple[str, ...], str, str, Any]] = []
    for path, var, annotation in _options(cls):
        raw = source.get(var, "").strip()
        if not raw:
            continue
        value: Any = None  # the variable's word for None (``auto``), else converted
        if raw != _none_word(annotation):
            try:
                value = msgspec.convert(raw, annotation, strict=False)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"{var}={raw!r}: {_describe(exc)}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{var}={raw!r}: must be a finite number")
        if path == ("backend",):
            SweConfig._check_backend(var, value)
        given.append((path, var, raw, value))
    try:
        return _build(cls, given)
    except (ConfigError, msgspec.ValidationError):
        # A check across a struct failed (a path that must exist, a name that must be
        # registered): find the variable it is about, to name it.
        for one in given:
            try:
                _build(cls, [one])
            except (ConfigError, msgspec.ValidationError) as exc:
                _, var, raw, _ = one
                raise ConfigError(f"{var}={raw!r}: {_describe(exc)}") from None
        raise


_PATTERNS = {
    _URL_PATTERN: "must be an http:// or https:// URL with a host (and a port, if any)",
    _WORD_PATTERN: "use letters, digits, '-', '_' and '.'",
    _NO_SPACE_PATTERN: "must not contain spaces",
    r"\S": "must not be blank",
    r"^/": "must be an absolute path",
}


def _build(cls: type[S], given: list[tuple[tuple[str, ...], str, str, Any]]) -> S:
    """``cls`` with the given options set (nested by their paths), checked."""
    values: dict[str, Any] = {}
    for path, _, _, value in given:
        *parents, leaf = path
        node = values
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return msgspec.convert(values, cls)


def _describe(exc: Exception) -> str:
    """The message without msgspec's ``- at `$`` path, nor a struct's name (the variable names
    the place)."""
    text = str(exc).split(" - at `$", 1)[0]
    for prefix in (
        "SweConfig: ",
        "EpisodeBudgets: ",
        "BootPolicy: ",
        "BashAgentOptions: ",
        "NpmOptions: ",
        "RayOptions: ",
    ):
        text = text.removeprefix(prefix)
    for pattern, meaning in _PATTERNS.items():
        if text.endswith(f"matching regex {pattern!r}"):
            return meaning
    return text


def _options(cls: type[msgspec.Struct]) -> Iterator[tuple[tuple[str, ...], str, Any]]:
    """Every option under ``cls``: (path of field names, variable, annotated type)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    for field in msgspec.structs.fields(cls):
        annotation = hints[field.name]
        if isinstance(annotation, type) and issubclass(annotation, _Options):
            for path, var, inner in _options(annotation):
                yield (field.name, *path), var, inner
            continue
        name = _env_of(annotation)
        if name is not None:
            yield (field.name,), name, annotation


def _env_of(annotation: Any) -> str | None:
    """The option's variable (``env(NAME)``), if any."""
    return _extra(annotation, "env")


def _none_word(annotation: Any) -> str | None:
    """The value of the option's variable that means None (``env(..., none=...)``), if any."""
    return _extra(annotation, "none")


def _extra(annotation: Any, key: str) -> str | None:
    """``key`` of the innermost ``msgspec.Meta(extra=...)`` on ``annotation`` that has it."""
    for meta in reversed(_metas(annotation)):
        extra = meta.extra or {}
        if key in extra:
            return str(extra[key])
    return None


def _metas(annotation: Any) -> list[msgspec.Meta]:
    if typing.get_origin(annotation) is not Annotated:
        return []
    base, *extras = typing.get_args(annotation)
    return [*_metas(base), *(m for m in extras if isinstance(m, msgspec.Meta))]


#: The environment variable of each option, by its dotted path (``"boot.concurrency"``).
ENV_VARS: Mapping[str, str] = {".".join(path): var for path, var, _ in _options(SweConfig)}


def replace_option(config: SweConfig, path: str, value: object) -> SweConfig:
    """``config`` with the option at dotted ``path`` set to ``value`` (checked; structs.replace).

    Example: ``replace_option(config, "episode.agent_time_budget_sec", 90.0)``.

    Raises:
        ConfigError: the value is out of range or of the wrong type (naming the option).
    """
    head, _, rest = path.partition(".")
    if head not in config.__struct_fields__:
        raise ConfigError(f"no option {path!r}")
    try:
        if not rest:
            return msgspec.structs.replace(config, **{head: value})
        inner = getattr(config, head)
        leaf = rest
        if "." in rest or leaf not in inner.__struct_fields__:
            raise ConfigError(f"no option {path!r}")
        return msgspec.structs.replace(
            config, **{head: msgspec.structs.replace(inner, **{leaf: value})}
        )
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
