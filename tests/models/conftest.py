"""The real Qwen3 chat model, loaded once per test process."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe.models import BASH_TOOL, EDIT_TOOL, ChatModel

from ..qwen3 import qwen3_dir


@pytest.fixture(scope="session")
def qwen3_path() -> Path:
    return qwen3_dir()


@pytest.fixture(scope="session")
def qwen3(qwen3_path: Path) -> ChatModel:
    """Qwen3's tokenizer and template with the built-in agent's tools."""
    return ChatModel.from_checkpoint(qwen3_path, tools=[BASH_TOOL, EDIT_TOOL])
