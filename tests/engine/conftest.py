"""The engine suite: a real vLLM (``scripts/engine-env``) serving a tiny Qwen3 built here.

One engine per session (it starts in ~40 s and holds ~4 GB), so this suite runs in one process
(``nox -s engine``: ``TRIO_SWE_ENGINE=1``, no xdist). Outside that session it is skipped, with
the command that runs it; inside it, a missing engine environment or an engine that does not
start is an error naming why, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from trio_swe.testing._engine import VLLMEngine, VLLMEngineProcess, build_checkpoint

ENGINE = os.environ.get("TRIO_SWE_ENGINE") == "1"
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENGINE:
        return
    skip = pytest.mark.skip(reason="the real-engine suite: nox -s engine (TRIO_SWE_ENGINE=1)")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(skip)


#: An engine already serving (``python -m trio_swe.testing._engine DIR`` prints its URL) and
#: its checkpoint folder, to iterate on the suite without a 40 s start per run.
RUNNING = os.environ.get("TRIO_SWE_ENGINE_URL")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny seeded Qwen3 with Qwen3's real tokenizer and chat template."""
    if RUNNING:
        return Path(os.environ["TRIO_SWE_ENGINE_CHECKPOINT"])
    return build_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="session")
def engine(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    """vLLM serving :func:`checkpoint` on 127.0.0.1 for the whole session."""
    if RUNNING:
        yield VLLMEngine(url=RUNNING, checkpoint=checkpoint, log=Path("/dev/null"))
        return
    with VLLMEngineProcess(checkpoint, workdir=tmp_path_factory.mktemp("vllm")) as running:
        yield running
