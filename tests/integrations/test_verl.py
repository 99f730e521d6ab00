"""verl's agent loop (trio_swe.integrations.verl) with verl's own types, on the real engine.

The loop is built as verl's worker builds it (``hydra.utils.instantiate`` of the registry entry
``@register("trio_swe")`` made, with verl's wrappers) and generates through an
``LLMServerClient``: :class:`VLLMServerClient` against the engine, recorded at that handle.
"""

# ruff: noqa: E402  (the skip outside nox -s verl comes before verl's imports)

from __future__ import annotations

from .conftest import require_trainer

require_trainer("verl")

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import hydra
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import (
    AgentLoopOutput,
    DictConfigWrap,
    ToolListWrap,
    _agent_loop_registry,
)
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from trio_swe.config import SweConfig
from trio_swe.integrations.verl import TrioSweAgentLoop, VLLMServerClient
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing._engine import MODEL_NAME, VLLMEngine

from ..test_episode_support import assert_nothing_left, build_demo
from .support import (
    RESCORE_TOLERANCE,
    Call,
    check_row,
    rescore_worst,
    sandboxes_live,
    swe_config,
)

#: verl's sampling parameters for a training rollout (AgentLoopWorker.generate_sequences).
SAMPLING = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "repetition_penalty": 1.0,
    "logprobs": True,
}


def trainer_config(checkpoint: Path) -> Any:
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(checkpoint)},
                "rollout": {"name": "vllm", "prompt_length": 8192, "response_length": 8192},
            },
            "data": {},
        }
    )


class RecordingClient(VLLMServerClient):
    """The external-vLLM client, keeping what the engine returned per request id."""

    def __init__(self, config: Any, url: str) -> None:
        super().__init__(config, url, model=MODEL_NAME)
        self.calls: dict[str, list[Call]] = defaultdict(list)

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        out: TokenOutput = await super().generate(request_id, **kwargs)
        self.calls[request_id].append(
            (list(kwargs["prompt_ids"]), list(out.token_ids), list(out.log_probs or []))
        )
        return out


def build_loop(
    checkpoint: Path, client: LLMServerClient, config: SweConfig, backend: LocalBackend
) -> TrioSweAgentLoop:
    """As verl's AgentLoopWorker._run_agent_loop builds a registered loop (inside the loop)."""
    cfg = trainer_config(checkpoint)
    loop = hydra.utils.instantiate(
        config=_agent_loop_registry["trio_swe"],
        trainer_config=DictConfigWrap(config=cfg),
        server_manager=client,
        tokenizer=AutoTokenizer.from_pretrained(str(checkpoint)),
        processor=None,
        hf_model_type=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap([]),
        swe_config=config,
        backend=backend,
    )
    assert isinstance(loop, TrioSweAgentLoop)
    return loop


def verl_row(row: dict[str, Any]) -> dict[str, Any]:
    """A dataset row as verl hands it to run(): its columns, plus verl's own."""
    return {**row, "raw_prompt": [{"role": "user", "content": row["prompt"]}], "index": 0}


def test_agent_loop_outputs_are_what_the_engine_sampled(
    engine: VLLMEngine, checkpoint: Path, tmp_path: Path
) -> None:
    demo, _, backend = build_demo(tmp_path)
    config = swe_config(checkpoint)

    async def main() -> tuple[list[AgentLoopOutput], RecordingClient]:
        client = RecordingClient(trainer_config(checkpoint), engine.url)
        try:
            loop = build_loop(checkpoint, client, config, backend)
            outs = await asyncio.gather(
                *(loop.run(dict(SAMPLING), **verl_row(row)) for row in demo.rows)
            )
        finally:
            await client.aclose()
        return list(outs), client

    started = time.monotonic()
    outs, client = asyncio.run(main())
    wall = time.monotonic() - started
    assert len(outs) == len(demo.rows)
    rows = []
    trained = 0
    for out in outs:
        # verl's own validation: the pydantic model, and its tensors.
        AgentLoopOutput.model_validate(out.model_dump())
        tensors = out.as_dict()
        assert tensors["responses"].shape == tensors["response_mask"].shape
        info = out.extra_fields["trio_swe"]
        assert out.extra_fields["reward_extra_info"]["trio_swe_aborted"] == 0.0, info
        calls = client.calls[info["episode_id"]]
        assert out.num_turns == len(calls)
        sampled = check_row(
            out.prompt_ids, out.response_ids, out.response_mask, out.response_logprobs, calls
        )
        assert out.reward_score == 0.0  # a random model fixes nothing
        rows.append((out.prompt_ids + out.response_ids, sampled))
        trained += sum(out.response_mask)
    worst = rescore_worst(checkpoint, rows, temperature=1.0)
    print(
        f"verl agent loop, bash agent: {len(outs)} episodes, {trained} trained tokens, "
        f"max |rollout - re-score| = {worst:.2e}, {wall:.1f} s"
    )
    assert trained > 0
    assert worst <= RESCORE_TOLERANCE
    assert_nothing_left(tmp_path, backend)


def test_an_aborted_episode_is_a_flagged_row_without_trained_tokens(
    checkpoint: Path, tmp_path: Path
) -> None:
    demo, _, backend = build_demo(tmp_path)
    config = swe_config(checkpoint)

    async def main() -> AgentLoopOutput:
        # Nothing listens there: every generation fails, the episode aborts (policy_error).
        client = VLLMServerClient(trainer_config(checkpoint), "http://127.0.0.1:9")
        try:
            loop = build_loop(checkpoint, client, config, backend)
            out: AgentLoopOutput = await loop.run(dict(SAMPLING), **verl_row(demo.rows[0]))
            return out
        finally:
            await client.aclose()

    out = asyncio.run(main())
    AgentLoopOutput.model_validate(out.model_dump())
    assert out.response_mask == [0]  # nothing to train on
    assert len(out.response_ids) == len(out.response_logprobs or []) == 1
    assert out.reward_score == 0.0
    assert out.extra_fields["reward_extra_info"] == {
        "trio_swe_aborted": 1.0,
        "trio_swe_permanent": 0.0,
        "trio_swe_trained_tokens": 0.0,
    }
    assert out.extra_fields["trio_swe"]["abort_reason"].startswith("policy_error:")
    assert_nothing_left(tmp_path, backend)


class StuckClient(LLMServerClient):
    """An LLMServerClient whose generation never answers, and says when it was cancelled."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, load_balancer_handle=None)
        self.called = asyncio.Event()
        self.cancelled = False

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("unreachable")


def test_cancelling_the_agent_loop_leaves_no_sandbox(checkpoint: Path, tmp_path: Path) -> None:
    demo, _, backend = build_demo(tmp_path)
    config = swe_config(checkpoint)

    async def main() -> StuckClient:
        client = StuckClient(trainer_config(checkpoint))
        loop = build_loop(checkpoint, client, config, backend)
        task = asyncio.ensure_future(loop.run(dict(SAMPLING), **verl_row(demo.rows[0])))
        # The agent's first turn waits on the engine (sent while the sandbox booted), and the
        # sandbox is up: cancel now.
        await client.called.wait()
        await sandboxes_live(backend)
        assert backend.statistics().live == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return client

    client = asyncio.run(main())
    assert client.cancelled  # the trainer's own call was cancelled, not abandoned
    assert_nothing_left(tmp_path, backend)


def test_the_yaml_entry_configures_the_loop(checkpoint: Path, tmp_path: Path) -> None:
    """agent_loop_config_path's entry: the _target_ and swe_env over the environment."""
    path = tmp_path / "agent_loops.yaml"
    path.write_text(
        "- name: trio_swe_yaml\n"
        "  _target_: trio_swe.integrations.verl.TrioSweAgentLoop\n"
        "  swe_env: {SWE_MAX_TURNS: '7', SWE_BACKEND: local}\n"
    )
    (entry,) = OmegaConf.load(path)
    cfg = trainer_config(checkpoint)

    async def main() -> TrioSweAgentLoop:
        loop = hydra.utils.instantiate(
            config=entry,
            trainer_config=DictConfigWrap(config=cfg),
            server_manager=LLMServerClient(cfg),
            tokenizer=AutoTokenizer.from_pretrained(str(checkpoint)),
            processor=None,
            hf_model_type=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap([]),
        )
        assert isinstance(loop, TrioSweAgentLoop)
        return loop

    loop = asyncio.run(main())
    assert loop.swe_config.bash.max_turns == 7
    # verl's settings where the environment leaves them open.
    assert loop.swe_config.bash.tokenizer == str(checkpoint)
    assert loop.swe_config.episode.max_context_tokens == 8192 + 8192
