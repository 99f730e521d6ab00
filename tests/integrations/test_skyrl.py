"""SkyRL's generator (trio_swe.integrations.skyrl) with SkyRL's own types, on the real engine.

The generator generates through SkyRL's ``RemoteInferenceClient`` (SkyRL's external-engine
client: ``/inference/v1/generate``) against the engine, recorded at that client, and its output
goes through SkyRL's own ``validate_generator_output``.
"""

# ruff: noqa: E402, I001  (the skip first; trio_swe.integrations.skyrl before skyrl: its shim)

from __future__ import annotations

from .conftest import require_trainer

require_trainer("skyrl")

import asyncio
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from trio_swe.integrations.skyrl import TrioSweGenerator  # before skyrl: its TypedDict shim

from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import (
    RemoteInferenceClient,
)
from skyrl.train.generators.base import GeneratorInput, GeneratorOutput, TrajectoryID
from skyrl.train.utils.trainer_utils import validate_generator_output
from transformers import AutoTokenizer

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

#: SkyRL's sampling parameters in vLLM's names (generator.sampling_params for vLLM).
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "logprobs": 0}


class RecordingClient(RemoteInferenceClient):  # type: ignore[misc]
    """SkyRL's remote client, keeping what the engine returned per session id."""

    calls: dict[str, list[Call]]

    async def generate(self, input_batch: Any, model: str | None = None) -> Any:
        out = await super().generate(input_batch, model=model)
        (prompt,) = input_batch["prompt_token_ids"]
        (session,) = input_batch["session_ids"]
        self.calls[session].append(
            (list(prompt), list(out["response_ids"][0]), list(out["response_logprobs"][0]))
        )
        return out


def client_for(url: str, cls: type[RemoteInferenceClient] = RemoteInferenceClient) -> Any:
    return cls(proxy_url=url, server_urls=[url], data_parallel_size=1, model_name=MODEL_NAME)


def batch(rows: list[dict[str, Any]]) -> GeneratorInput:
    return {
        "prompts": [[{"role": "user", "content": row["prompt"]}] for row in rows],
        "env_classes": ["trio_swe"] * len(rows),
        "env_extras": rows,
        "sampling_params": dict(SAMPLING),
        "trajectory_ids": [TrajectoryID(row["label"], 0) for row in rows],
        "batch_metadata": None,
    }


def test_generator_output_is_what_the_engine_sampled(
    engine: VLLMEngine, checkpoint: Path, tmp_path: Path
) -> None:
    demo, _, backend = build_demo(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))

    async def main() -> tuple[GeneratorOutput, RecordingClient]:
        client = client_for(engine.url, RecordingClient)
        client.tokenizer = tokenizer  # local detokenize, as SkyRL builds it
        client.calls = defaultdict(list)
        try:
            generator = TrioSweGenerator(
                client, tokenizer, swe_config=swe_config(checkpoint), backend=backend
            )
            out: GeneratorOutput = await generator.generate(batch(demo.rows))
        finally:
            await client.aclose()
        return out, client

    started = time.monotonic()
    out, client = asyncio.run(main())
    wall = time.monotonic() - started
    n = len(demo.rows)
    validate_generator_output(n, out)  # SkyRL's own check
    assert [t.instance_id for t in out["trajectory_ids"]] == [r["label"] for r in demo.rows]
    assert out["rollout_metrics"]["trio_swe/aborted"] == 0
    rows = []
    for i in range(n):
        metrics = out["env_metrics"][i]
        assert metrics["trio_swe_aborted"] == 0.0, metrics
        assert metrics["trio_swe_instance_id"] == demo.rows[i]["label"]  # input order
        calls = client.calls[metrics["trio_swe_episode_id"]]
        sampled = check_row(
            out["prompt_token_ids"][i],
            out["response_ids"][i],
            out["loss_masks"][i],
            out["rollout_logprobs"][i],
            calls,
        )
        assert out["stop_reasons"][i] in ("stop", "length")
        assert out["rewards"][i] == 0.0  # a random model fixes nothing
        rows.append((out["prompt_token_ids"][i] + out["response_ids"][i], sampled))
    trained = sum(sum(m) for m in out["loss_masks"])
    assert trained > 0
    assert out["rollout_metrics"]["trio_swe/trained_tokens"] == trained
    worst = rescore_worst(checkpoint, rows, temperature=1.0)
    print(
        f"SkyRL generator, bash agent: {n} episodes, {trained} trained tokens, "
        f"max |rollout - re-score| = {worst:.2e}, {wall:.1f} s"
    )
    assert worst <= RESCORE_TOLERANCE
    assert_nothing_left(tmp_path, backend)


def test_an_aborted_episode_is_a_flagged_row_without_trained_tokens(
    checkpoint: Path, tmp_path: Path
) -> None:
    demo, _, backend = build_demo(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    rows = demo.rows[:2]

    async def main() -> GeneratorOutput:
        client = client_for("http://127.0.0.1:9")  # nothing listens: every generation fails
        try:
            generator = TrioSweGenerator(
                client, tokenizer, swe_config=swe_config(checkpoint), backend=backend
            )
            out: GeneratorOutput = await generator.generate(batch(rows))
            return out
        finally:
            await client.aclose()

    out = asyncio.run(main())
    validate_generator_output(len(rows), out)
    assert out["loss_masks"] == [[0], [0]]
    assert out["rewards"] == [0.0, 0.0]
    assert out["stop_reasons"] == ["abort", "abort"]
    assert out["rollout_metrics"]["trio_swe/aborted"] == 2
    for metrics in out["env_metrics"]:
        assert metrics["trio_swe_aborted"] == 1.0
        assert metrics["trio_swe_abort_reason"].startswith("policy_error:")
    assert_nothing_left(tmp_path, backend)


class StuckClient(RemoteInferenceClient):  # type: ignore[misc]
    """A client whose generation never answers, and says when it was cancelled."""

    called: asyncio.Event
    cancelled: int

    async def generate(self, input_batch: Any, model: str | None = None) -> Any:
        self.called.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_cancelling_the_generator_leaves_no_sandbox(checkpoint: Path, tmp_path: Path) -> None:
    demo, _, backend = build_demo(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    rows = demo.rows[:3]

    async def main() -> StuckClient:
        client = client_for("http://127.0.0.1:9", StuckClient)
        client.called = asyncio.Event()
        client.cancelled = 0
        generator = TrioSweGenerator(
            client, tokenizer, swe_config=swe_config(checkpoint), backend=backend
        )
        task = asyncio.ensure_future(generator.generate(batch(rows)))
        # An agent's first turn waits on the engine (sent while its sandbox booted), and a
        # sandbox is up: cancel now.
        await client.called.wait()
        await sandboxes_live(backend)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return client

    client = asyncio.run(main())
    assert client.cancelled >= 1
    assert_nothing_left(tmp_path, backend)
