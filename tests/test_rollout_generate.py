"""generate(): slime's custom-generate signature, from asyncio, with slime-shaped samples."""

from __future__ import annotations

import asyncio
import copy
import enum
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from trio_swe import aio, generate
from trio_swe.demo import DemoSet, build_demo_set, open_scripted_policy_server

from .test_episode_support import assert_sample_matches_script, script_text


@dataclass
class SlimeLikeSample:
    """The fields of slime's ``Sample`` that a custom generate function reads and writes."""

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    prompt: str = ""
    label: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    session_id: str | None = None
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    reward: float | None = None
    remove_sample: bool = False
    status: Status = Status.PENDING


async def _serve(demo: DemoSet, port: asyncio.Future[int]) -> None:
    async with open_scripted_policy_server(demo.scripts) as server:
        port.set_result(server.port)
        await trio.sleep_forever()


@pytest.mark.slow
def test_generate_returns_slime_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWE_AGENT_TIME_BUDGET_SEC", "60")
    monkeypatch.setenv("SWE_EVAL_TIMEOUT_SEC", "60")
    monkeypatch.setenv("SWE_MAX_TURNS", "10")
    demo = build_demo_set(tmp_path / "repos")
    by_id = {row["label"]: row for row in demo.rows}

    def sample_of(iid: str) -> SlimeLikeSample:
        row = copy.deepcopy(by_id[iid])
        return SlimeLikeSample(prompt=row["prompt"], label=row["label"], metadata=row["metadata"])

    async def main() -> dict[str, Any]:
        port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.ensure_future(aio.run(_serve, demo, port))
        args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=await port)
        params = {"temperature": 1.0, "max_new_tokens": 2048}
        broken = SlimeLikeSample(prompt="?", label="broken", metadata={"instance_id": "b"})
        out = await asyncio.gather(
            generate(args, sample_of("demo__calc-1"), params),
            generate(args, sample_of("demo__leap-1"), params),
            generate(args, sample_of("demo__stack-1"), params),
            generate(args, sample_of("demo__words-1"), params, evaluation=True),
            generate(args, broken, params),
        )
        server.cancel()
        try:
            await server
        except asyncio.CancelledError:
            pass
        return dict(zip(["calc", "leap", "stack", "eval", "broken"], out, strict=True))

    out = asyncio.run(main())
    S = SlimeLikeSample.Status
    (calc,) = out["calc"]
    assert calc.status is S.COMPLETED
    assert calc.reward == 1.0
    assert not calc.remove_sample
    assert calc.metadata["grading_solved"] is True
    assert calc.metadata["instance_id"] == "demo__calc-1"
    assert len(calc.loss_mask) == len(calc.rollout_log_probs) == calc.response_length
    assert calc.label == "demo__calc-1"  # the base sample's own fields carry over
    # The slime-shaped lists still line up with the script.
    from trio_swe import Sample

    back = Sample.from_slime_dict(vars(calc))
    assert_sample_matches_script(back, [script_text(c) for c in demo.scripts["demo__calc-1"]])

    (leap,) = out["leap"]
    assert leap.reward == 0.0
    assert leap.status is S.COMPLETED
    (stack,) = out["stack"]
    assert stack.reward == 0.0
    assert stack.metadata["agent_exit_code"] == 0
    assert stack.metadata["episode_status"] == "completed"
    (evaluated,) = out["eval"]
    assert evaluated.reward == 1.0
    assert evaluated.remove_sample  # evaluation samples are not trained on
    assert evaluated.status is S.COMPLETED
    (broken,) = out["broken"]
    assert broken.status is S.FAILED  # an unreadable row is permanent: never requeued
    assert broken.remove_sample
    assert broken.metadata["abort_reason"].startswith("metadata:")
