"""One verl agent-loop batch or one SkyRL generator call on the demo instances against a running
vLLM, per agent; prints episodes, trained tokens, max |rollout - re-score| and wall time.

    TRIO_SWE_TRAINER=verl PYTHONPATH=. /var/cache/trio-swe/verl/bin/python \\
        -m tests.integrations.e2e verl URL CHECKPOINT bash claude-code codex ...

(``python -m trio_swe.testing._engine DIR`` serves the tiny Qwen3 and prints its URL.)
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from trio_swe.config import replace_option

from ..test_episode_support import assert_nothing_left, build_demo
from .support import rescore_worst, swe_config

#: Rows longer than this are not re-scored (memory: full-vocabulary float32 logits).
RESCORE_MAX_TOKENS = 8192


def _trained(prompt: list[int], response: list[int], mask: list[int], lps: list[float]) -> Any:
    start = len(prompt)
    return (
        prompt + response,
        [(start + i, lp) for i, (m, lp) in enumerate(zip(mask, lps, strict=True)) if m],
    )


async def _verl(url: str, ckpt: Path, config: Any, demo: Any, backend: Any) -> list[Any]:
    from omegaconf import OmegaConf

    from trio_swe.integrations.verl import VLLMServerClient

    from .test_verl import SAMPLING, build_loop, verl_row

    cfg = OmegaConf.create(
        {
            "actor_rollout_ref": {
                "model": {"path": str(ckpt)},
                "rollout": {"name": "vllm", "prompt_length": 32768, "response_length": 8192},
            },
            "data": {},
        }
    )
    client = VLLMServerClient(cfg, url, model="tiny-qwen3")
    try:
        loop = build_loop(ckpt, client, config, backend)
        loop.config = cfg  # the long prompts of CLI agents
        outs = await asyncio.gather(*(loop.run(dict(SAMPLING), **verl_row(r)) for r in demo.rows))
    finally:
        await client.aclose()
    return [
        (
            o.extra_fields["reward_extra_info"]["trio_swe_aborted"],
            o.extra_fields["trio_swe"]["abort_reason"],
            _trained(o.prompt_ids, o.response_ids, o.response_mask, o.response_logprobs),
        )
        for o in outs
    ]


async def _skyrl(url: str, ckpt: Path, config: Any, demo: Any, backend: Any) -> list[Any]:
    from transformers import AutoTokenizer

    from trio_swe.integrations.skyrl import TrioSweGenerator

    from .test_skyrl import batch, client_for, validate_generator_output

    client = client_for(url)
    client.tokenizer = AutoTokenizer.from_pretrained(str(ckpt))
    try:
        gen = TrioSweGenerator(client, client.tokenizer, swe_config=config, backend=backend)
        out = await gen.generate(batch(demo.rows))
    finally:
        await client.aclose()
    validate_generator_output(len(demo.rows), out)
    return [
        (
            out["env_metrics"][i]["trio_swe_aborted"],
            out["env_metrics"][i]["trio_swe_abort_reason"],
            _trained(
                out["prompt_token_ids"][i],
                out["response_ids"][i],
                out["loss_masks"][i],
                out["rollout_logprobs"][i],
            ),
        )
        for i in range(len(demo.rows))
    ]


def main() -> None:
    trainer, url, ckpt_s, *agents = sys.argv[1:]
    ckpt = Path(ckpt_s)
    for agent in agents:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            demo, _, backend = build_demo(tmp_path)
            config = replace_option(swe_config(ckpt), "agent", agent)
            config = replace_option(config, "episode.max_context_tokens", 40000)
            run = _verl if trainer == "verl" else _skyrl
            started = time.monotonic()
            rows = asyncio.run(run(url, ckpt, config, demo, backend))
            wall = time.monotonic() - started
            aborted = [reason for flag, reason, _ in rows if flag]
            kept = [t for flag, _, t in rows if not flag and t[1]]
            trained = sum(len(t[1]) for t in kept)
            # The re-score computes full-vocabulary logits: ~11 GB for a 20k-token CLI prompt.
            short = [t for t in kept if len(t[0]) <= RESCORE_MAX_TOKENS]
            worst = rescore_worst(ckpt, short, temperature=1.0) if short else float("nan")
            print(
                f"{trainer} {agent}: {len(rows)} episodes ({len(aborted)} aborted), {trained} "
                f"trained tokens, max |rollout - re-score| = {worst:.2e} over "
                f"{sum(len(t[1]) for t in short)} of them, {wall:.1f} s",
                flush=True,
            )
            for reason in aborted[:2]:
                print(f"  aborted: {str(reason)[:200]}", flush=True)
            assert_nothing_left(tmp_path, backend)


if __name__ == "__main__":
    main()
