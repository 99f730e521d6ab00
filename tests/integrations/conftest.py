"""The trainer adapters against the real trainers and the real engine.

verl and SkyRL live in their own environments (``scripts/trainer-env verl|skyrl``), not in the
project's ``.venv``, and these tests need the engine too (``scripts/engine-env``). They run in
``nox -s verl`` / ``nox -s skyrl`` (``TRIO_SWE_TRAINER=verl|skyrl``, the trainer env's python, one
process: one engine per session). Anywhere else they are skipped, naming that command; inside
those sessions a missing trainer or engine is an error, never a skip.
"""

from __future__ import annotations

import os

import pytest

from ..engine.conftest import checkpoint, engine  # noqa: F401  # the session's engine fixtures

TRAINER = os.environ.get("TRIO_SWE_TRAINER", "")


def require_trainer(name: str) -> None:
    """At a test module's top: skip it (naming the command that runs it) unless this is
    ``nox -s <name>``; there, the module's imports that follow fail if the trainer is missing."""
    if name != TRAINER:
        pytest.skip(
            f"needs {name} in its own environment: nox -s {name} "
            f"(TRIO_SWE_TRAINER={name}; scripts/trainer-env {name})",
            allow_module_level=True,
        )
