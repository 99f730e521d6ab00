"""The engine suite: a real vLLM (``scripts/engine-env``) serving a tiny Qwen3 built here.

One engine per session (it starts in ~40 s and holds ~4 GB), so this suite runs in one process
(``nox -s engine``: ``TRIO_SWE_ENGINE=1``, no xdist). Outside that session it is skipped, with
the command that runs it; inside it, a missing engine environment or an engine that does not
start is an error naming why, never a skip.
"""

from __future__ import annotations

import faulthandler
import os
import tempfile
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


#: An engine already serving (``python -m trio_swe.testing._engine DIR`` prints its URL), its
#: checkpoint folder and (optional) log, to iterate on the suite without a 40 s start per run.
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
        log = Path(os.environ.get("TRIO_SWE_ENGINE_LOG", "/dev/null"))
        yield VLLMEngine(url=RUNNING, checkpoint=checkpoint, log=log)
        return
    with VLLMEngineProcess(checkpoint, workdir=tmp_path_factory.mktemp("vllm")) as running:
        yield running


#: How much of the engine's log a failed test shows (its part of the log, metrics scrapes left
#: out): CI keeps no engine log, and a slow or stuck engine is only explained by it.
LOG_TAIL_LINES = 80

#: Every this many seconds of a test, every thread's stack is written down (by faulthandler's
#: own thread, which needs neither the GIL nor the event loop); a failed test shows them. CI
#: once saw a test make no progress for two minutes while the engine served on time: whether
#: the test's loop was blocked, and where, is only told by such a sample.
STACKS_EVERY_SEC = 30


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    engine = getattr(item, "funcargs", {}).get("engine")
    log = engine.log if isinstance(engine, VLLMEngine) and engine.log.is_file() else None
    start = log.stat().st_size if log else 0
    with tempfile.TemporaryFile() as stacks:
        faulthandler.dump_traceback_later(STACKS_EVERY_SEC, repeat=True, file=stacks)
        try:
            return (yield)
        except BaseException:
            if log is not None:
                item.add_report_section("call", "engine log", _log_since(log, start))
            faulthandler.cancel_dump_traceback_later()
            stacks.seek(0)
            if sampled := stacks.read().decode(errors="replace"):
                item.add_report_section(
                    "call", f"stacks every {STACKS_EVERY_SEC} s", sampled[-20_000:]
                )
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()


def _log_since(log: Path, start: int) -> str:
    with log.open("rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    scrapes = sum("GET /metrics" in line for line in lines)
    kept = [line for line in lines if "GET /metrics" not in line][-LOG_TAIL_LINES:]
    return f"({scrapes} metrics scrapes left out; the last {len(kept)} other lines)\n" + "\n".join(
        kept
    )
