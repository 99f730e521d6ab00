"""The protocol registry: selection, registration, and failing fast with the fix named."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

import trio_swe
from trio_swe import ConfigError, InvalidArgumentError
from trio_swe.grading import (
    EvalResult,
    Graded,
    InstanceMetadata,
    _registry,
    available_protocols,
    evaluability_check,
    get_metadata,
    register_protocol,
    require_protocol,
    run_evaluation,
)
from trio_swe.sandbox import Backend


class _Always:
    """A user protocol: every instance resolves (a toy, for the registry)."""

    def __init__(self, unavailable: str | None = None) -> None:
        self.unavailable = unavailable

    def get_metadata(self, row: Mapping[str, Any]) -> InstanceMetadata:
        return InstanceMetadata(
            protocol="always", instance_id=str(row["id"]), image="img", extra={"k": 1}
        )

    def evaluability_check(self, md: InstanceMetadata) -> str | None:
        return None

    async def grade(
        self, backend: Backend, md: InstanceMetadata, patch: str | bytes, *, timeout_sec: float
    ) -> Graded:
        return Graded(
            result=EvalResult(
                reward=1.0,
                resolved=True,
                applied_cleanly=True,
                reason="resolved",
                protocol="always",
                instance_id=md.instance_id,
            )
        )

    def unavailable_reason(self) -> str | None:
        return self.unavailable


@pytest.fixture
def clean_registry() -> Iterator[None]:
    saved = dict(_registry._registry)
    yield
    _registry._registry.clear()
    _registry._registry.update(saved)


def test_builtin_protocols() -> None:
    assert available_protocols() == ("scaleswe", "swebench")
    assert require_protocol("scaleswe") is not None
    assert trio_swe.require_protocol is require_protocol


def test_unknown_protocol_names_the_known_ones_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        require_protocol("sweebench")
    assert "known protocols: scaleswe, swebench" in str(err.value)
    assert "register_protocol" in str(err.value)


async def test_user_protocol_round_trip(clean_registry: None) -> None:
    register_protocol("always", _Always())
    assert "always" in available_protocols()
    md = get_metadata({"id": 7}, "always")
    assert md.extra == {"k": 1}
    assert evaluability_check(md) is None
    result = await run_evaluation(object(), md, "", timeout_sec=1)  # type: ignore[arg-type]
    assert result.reward == 1.0


def test_registration_rules(clean_registry: None) -> None:
    register_protocol("always", _Always())
    with pytest.raises(InvalidArgumentError, match="already registered"):
        register_protocol("always", _Always())
    register_protocol("always", _Always(), replace=True)
    for bad in ("", "Upper", "has space", "x" * 80, "1abc"):
        with pytest.raises(InvalidArgumentError):
            register_protocol(bad, _Always())
    with pytest.raises(InvalidArgumentError, match="lacks"):
        register_protocol("broken", object())  # type: ignore[arg-type]


def test_unavailable_protocol_fails_at_require(clean_registry: None) -> None:
    register_protocol("needs-gpu", _Always(unavailable="install the gpu extra"))
    assert "needs-gpu" in available_protocols()
    with pytest.raises(ConfigError, match="'needs-gpu' cannot run: install the gpu extra"):
        require_protocol("needs-gpu")


def test_swebench_missing_fails_with_the_install_command() -> None:
    # A fresh interpreter where `import swebench` fails, as on a machine without the extra.
    code = (
        "import sys; sys.modules['swebench'] = None\n"
        "import trio_swe\n"
        "try:\n"
        "    trio_swe.require_protocol('swebench')\n"
        "except trio_swe.ConfigError as e:\n"
        "    print('ERR', e)\n"
        "print('OK', trio_swe.require_protocol('scaleswe') is not None)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "ERR grading protocol 'swebench' cannot run: swebench is not importable" in out.stdout
    assert "pip install 'trio-swe[swebench]'" in out.stdout
    assert "OK True" in out.stdout


def test_importing_trio_swe_does_not_import_swebench() -> None:
    code = "import sys, trio_swe.grading; print('swebench' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
