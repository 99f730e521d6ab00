"""The trainer adapters against the real trainers and the real engine.

verl and SkyRL live in their own environments (``scripts/trainer-env verl|skyrl``), not in the
project's ``.venv``, and these tests need the engine too (``scripts/engine-env``). They run in
``nox -s verl`` / ``nox -s skyrl`` (``TRIO_SWE_TRAINER=verl|skyrl``, the trainer env's python, one
process: one engine per session). Anywhere else they are skipped, naming that command; inside
those sessions a missing trainer or engine is an error, never a skip.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from ..engine.conftest import checkpoint, engine  # noqa: F401  # the session's engine fixtures

TRAINER = os.environ.get("TRIO_SWE_TRAINER", "")
HERE = Path(__file__).parent
#: Test module -> the trainer it needs.
_NEEDS = {"test_verl.py": "verl", "test_skyrl.py": "skyrl"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = Path(str(item.fspath))
        if path.parent != HERE:
            continue
        need = _NEEDS.get(path.name)
        if need is not None and need != TRAINER:
            item.add_marker(
                pytest.mark.skip(
                    reason=f"needs {need} (its own environment): nox -s {need} "
                    f"(TRIO_SWE_TRAINER={need}, scripts/trainer-env {need})"
                )
            )


@pytest.fixture(scope="session", autouse=True)
def _trainer_present() -> None:
    """Inside a trainer's session, its package must import: fail, never skip."""
    if TRAINER:
        module = {"verl": "trio_swe.integrations.verl", "skyrl": "trio_swe.integrations.skyrl"}
        importlib.import_module(module[TRAINER])
