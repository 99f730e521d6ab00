"""SweConfig.from_env: defaults, parsing, validation naming the variable, protocol checks."""

from __future__ import annotations

import pytest

from trio_swe import ConfigError, SweConfig
from trio_swe.config import ENV_VARS


def test_defaults_when_nothing_is_set() -> None:
    config = SweConfig.from_env({})
    assert config == SweConfig()
    assert config.train_protocol == config.eval_protocol == "scaleswe"
    assert config.agent == "bash"
    assert config.npm.install_retries == 3
    assert config.npm.install_backoff_sec == 2.0
    # The guard covers the agent, setup and eval budgets plus headroom.
    assert config.guard_sec == 1800 + 600 + 600 + 180


def _leaf_options(cls: type, prefix: str = "") -> set[str]:
    import msgspec

    out: set[str] = set()
    for name in cls.__struct_fields__:  # type: ignore[attr-defined]
        default = getattr(cls(), name)
        if isinstance(default, msgspec.Struct):
            out |= _leaf_options(type(default), f"{prefix}{name}.")
        else:
            out.add(prefix + name)
    return out


def test_every_field_has_a_variable() -> None:
    assert set(ENV_VARS) == _leaf_options(SweConfig)
    assert len(set(ENV_VARS.values())) == len(ENV_VARS)  # one variable per option


def test_values_are_read_and_converted() -> None:
    env = {
        "SWE_EVAL_PROTOCOL": "swebench",
        "SWE_AGENT_TIME_BUDGET_SEC": "90.5",
        "SWE_BOOT_CONCURRENCY": "3",
        "SWE_ROLLOUT_GUARD_SEC": "1000",
        "NPM_INSTALL_RETRIES": "5",
        "NPM_INSTALL_BACKOFF_SEC": "0.5",
        "SWE_MAX_CONTEXT_TOKENS": "32768",
        "SWE_AGENT": " ",  # blank keeps the default
        "SWE_BACKEND": "e2b",
    }
    config = SweConfig.from_env(env, check_protocols=False)
    assert config.eval_protocol == "swebench"
    assert config.train_protocol == "scaleswe"
    assert config.episode.agent_time_budget_sec == 90.5
    assert config.boot.concurrency == 3
    assert config.guard_sec == 1000
    assert config.npm.install_retries == 5
    assert config.npm.install_backoff_sec == 0.5
    assert config.episode.max_context_tokens == 32768
    assert config.agent == "bash"
    assert config.backend == "e2b"
    assert config.protocol_for(evaluation=True) == "swebench"
    assert config.protocol_for(evaluation=False) == "scaleswe"


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("SWE_BOOT_CONCURRENCY", "many"),
        ("SWE_BOOT_CONCURRENCY", "0"),
        ("SWE_AGENT_TIME_BUDGET_SEC", "-1"),
        ("SWE_EVAL_TIMEOUT_SEC", "nan"),
        ("NPM_INSTALL_RETRIES", "0"),
        ("NPM_INSTALL_BACKOFF_SEC", "soon"),
        ("SWE_MAX_CONTEXT_TOKENS", "1.5"),
        ("SWE_BOOT_RETRIES", "-2"),
        ("SWE_BACKEND", "podman"),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var):
        SweConfig.from_env({var: value}, check_protocols=False)


def test_unknown_backend_names_the_choices_at_load_and_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"SWE_BACKEND='podman'.*'local', 'e2b', 'docker'"):
        SweConfig.from_env({"SWE_BACKEND": "podman", "SWE_BOOT_CONCURRENCY": "0"})
    with pytest.raises(ConfigError, match=r"backend 'podman'.*'local', 'e2b', 'docker'"):
        SweConfig(backend="podman")
    assert SweConfig.from_env({"SWE_BACKEND": "docker"}).backend == "docker"


def test_unknown_protocol_fails_when_loaded() -> None:
    with pytest.raises(ConfigError, match="no-such-protocol"):
        SweConfig.from_env({"SWE_TRAIN_PROTOCOL": "no-such-protocol"})
    with pytest.raises(ConfigError, match="no-such-protocol"):
        SweConfig.from_env({"SWE_EVAL_PROTOCOL": "no-such-protocol"})


# --- every option: typed errors naming the variable; the CLI agrees with the environment ----

import argparse  # noqa: E402
import typing  # noqa: E402

from trio_swe.config import (  # noqa: E402
    BashAgentOptions,
    BootPolicy,
    EpisodeBudgets,
    NpmOptions,
    _options,
    replace_option,
)

#: Values every option of its kind refuses.
_BAD_STRINGS = {
    "SWE_ILL_FORMED_POLICY": ["drop", "MASK"],
    "SWE_POLICY_API": ["openai", "vLLM"],
    "SWE_BACKEND": ["no-such-backend"],
    "SWE_TRAIN_PROTOCOL": ["no-such-protocol"],
    "SWE_EVAL_PROTOCOL": ["no-such-protocol"],
    "SWE_POLICY_URL": ["localhost:30000", "ftp://host", "http://", "http://host:port"],
    "SWE_NPM_PREFIX": ["usr/local"],
    "SWE_TOKENIZER": ["/no/such/checkpoint"],
    "SWE_TOOL_PARSER": ["xml"],
    "SWE_RAY_ADDRESS": ["10.0.0.1 :6379"],
    "SWE_RAY_POOL": ["a pool", "a/b"],
    "SWE_RAY_NAMESPACE": ["a pool", "a/b"],
    "SWE_RAY_DETACHED": ["maybe", "2"],
}


def _bad_values(var: str, annotation: object) -> list[str]:
    base = typing.get_args(annotation)[0] if typing.get_args(annotation) else annotation
    while typing.get_args(base):
        base = typing.get_args(base)[0]
    if base is int:
        return ["many", "1_000", "\u0663", "+5", "1.5", "-1", "99999999999"]
    if base is float:
        return ["soon", "1_000", "\u0663", "+5", "nan", "inf", "-1"]
    return _BAD_STRINGS.get(var, [])


_CASES = [
    (var, value)
    for _, var, annotation in _options(SweConfig)
    for value in _bad_values(var, annotation)
]


def test_every_numeric_and_checked_variable_has_bad_values() -> None:
    checked = {var for var, _ in _CASES}
    unchecked = set(ENV_VARS.values()) - checked
    # Free-form strings: a package path and command lines (any text is a valid command); the
    # agent's name is checked against the registry at start (check_agent), not by the config.
    assert unchecked == {"SWE_NPM_PACKAGE", "SWE_NPM_START_CMD", "SWE_NPM_CHECK_CMD", "SWE_AGENT"}


@pytest.mark.parametrize(("var", "value"), _CASES)
def test_every_variable_refuses_bad_values_by_name(var: str, value: str) -> None:
    with pytest.raises(ConfigError, match=var) as info:
        SweConfig.from_env({var: value})
    assert repr(value) in str(info.value)


def test_an_unknown_agent_fails_at_start_naming_the_choices() -> None:
    from trio_swe.agents import check_agent

    config = SweConfig.from_env({"SWE_AGENT": "no-such-agent"})
    with pytest.raises(
        ConfigError, match=r"SWE_AGENT=.no-such-agent.*choose one of bash, .*npm-cli"
    ):
        check_agent(config.agent)


@pytest.mark.parametrize(
    "build",
    [
        lambda: BootPolicy(concurrency="3"),  # type: ignore[arg-type]
        lambda: BootPolicy(concurrency=0),
        lambda: EpisodeBudgets(agent_time_budget_sec=float("nan")),
        lambda: BashAgentOptions(policy_url="localhost"),
        lambda: NpmOptions(install_retries=0),
        lambda: SweConfig(boot="3"),  # type: ignore[arg-type]
        lambda: SweConfig(agent=""),
    ],
)
def test_building_options_in_python_checks_them_as_config_errors(build: object) -> None:
    with pytest.raises(ConfigError):
        build()  # type: ignore[operator]


def test_replace_checks_the_value_and_names_the_option() -> None:
    config = SweConfig()
    assert replace_option(config, "boot.concurrency", 3).boot.concurrency == 3
    with pytest.raises(ConfigError, match=r"boot\.concurrency"):
        replace_option(config, "boot.concurrency", 0)
    with pytest.raises(ConfigError, match="no option"):
        replace_option(config, "boot.nope", 1)


@pytest.mark.parametrize(
    ("flag", "var", "value"),
    [
        ("--backend", "SWE_BACKEND", "e2b"),
        ("--agent", "SWE_AGENT", "npm-cli"),
        ("--protocol", "SWE_TRAIN_PROTOCOL", "swebench"),
        ("--policy-url", "SWE_POLICY_URL", "https://policy.example:8443/v1"),
        ("--agent-budget", "SWE_AGENT_TIME_BUDGET_SEC", "90.5"),
        ("--eval-timeout", "SWE_EVAL_TIMEOUT_SEC", "30"),
        ("--max-context-tokens", "SWE_MAX_CONTEXT_TOKENS", "32768"),
    ],
)
def test_the_cli_and_the_environment_agree(flag: str, var: str, value: str) -> None:
    from trio_swe.cli._parser import build_parser as _parser
    from trio_swe.cli.run import config_from_args as _config_from_args

    args = _parser().parse_args(["run", "rows.jsonl", flag, value])
    env = {var: value}
    if var == "SWE_TRAIN_PROTOCOL":
        env["SWE_EVAL_PROTOCOL"] = value  # --protocol sets both
    from_flag = _config_from_args(args, {})
    from_env = SweConfig.from_env(env, check_protocols=False)
    assert from_flag == from_env


def test_a_bad_flag_is_named() -> None:
    from trio_swe.cli._parser import build_parser as _parser
    from trio_swe.cli.run import config_from_args as _config_from_args

    for argv, pattern in [
        (["--agent-budget", "-1"], r"--agent-budget -1\.0"),
        (["--policy-url", "nope"], r"--policy-url 'nope'"),
        (["--agent", "nope"], r"--agent 'nope'.*bash"),
        (["--protocol", "nope"], r"--protocol 'nope'"),
        (["--backend", "nope"], r"--backend 'nope'.*'local', 'e2b'"),
    ]:
        args: argparse.Namespace = _parser().parse_args(["run", "rows.jsonl", *argv])
        with pytest.raises(ConfigError, match=pattern):
            _config_from_args(args, {})


# --- SWE_RAY_*: composed into SweConfig, read without Ray -----------------------------------


def test_ray_variables_are_part_of_the_config() -> None:
    from trio_swe.config import RayOptions

    assert SweConfig.from_env({}).ray == RayOptions()
    assert not SweConfig().ray.enabled  # unset: episodes run in the calling process
    env = {"SWE_RAY_WORKERS": "3", "SWE_RAY_MAX_BOOTING": "4", "SWE_RAY_DETACHED": "true"}
    config = SweConfig.from_env(env, check_protocols=False)
    assert config.ray == RayOptions(workers=3, max_booting=4, detached=True)
    assert config.ray == RayOptions.from_env(env)  # the ray layer's own reading agrees
    auto = SweConfig.from_env({"SWE_RAY_WORKERS": "auto"}, check_protocols=False).ray
    assert auto.enabled
    assert auto.workers is None  # one per node
    assert RayOptions.from_env({"SWE_RAY_WORKERS": "0"}) is None
    with pytest.raises(ConfigError, match="SWE_RAY_WORKERS='many'"):
        SweConfig.from_env({"SWE_RAY_WORKERS": "many"})
    with pytest.raises(ConfigError):
        RayOptions(concurrency=0)


def test_reading_the_config_does_not_import_ray() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from trio_swe.config import SweConfig; "
        "c = SweConfig.from_env({'SWE_RAY_WORKERS': '2'}); "
        "assert c.ray.workers == 2; assert 'ray' not in sys.modules, 'ray was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
