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
    assert config.npm_install_retries == 3
    assert config.npm_install_backoff_sec == 2.0
    # The guard covers the agent, setup and eval budgets plus headroom.
    assert config.guard_sec == 1800 + 600 + 600 + 180


def test_every_field_has_a_variable() -> None:
    assert set(ENV_VARS) == set(SweConfig.__struct_fields__)


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
    assert config.agent_time_budget_sec == 90.5
    assert config.boot_concurrency == 3
    assert config.guard_sec == 1000
    assert config.npm_install_retries == 5
    assert config.npm_install_backoff_sec == 0.5
    assert config.max_context_tokens == 32768
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
