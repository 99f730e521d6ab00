"""One asynchronous GRPO step against a running engine: the loop users copy into a trainer.

It starts nothing itself. The engine (vLLM serving CHECKPOINT; ``--logprobs-mode
processed_logprobs``, so the rollout log-probs are those of the tempered distribution) and the
dataset are given; trio_swe boots the sandboxes. The program awaits groups of episodes from
``run_rollouts`` as they finish (``--n-per-instance`` episodes per instance, each with its own
sandbox and seed), computes group-normalised advantages, re-scores every sample with the
checkpoint's own weights in torch, checks that the importance ratio of every trained token is 1
within ``--tolerance`` (on-policy at step 0: what the trainer computes is what the engine
sampled), takes one optimizer step on the policy-gradient loss, and reports the loss, the ratio
statistics and tokens per second. Exit 0 when every ratio was within tolerance, 1 otherwise.

Run it in the engine's environment (torch is there) with trio_swe installed::

    /var/cache/trio-swe/engine/bin/python examples/grpo_step.py \\
        --policy-url http://127.0.0.1:8000 --checkpoint DIR [--rows rows.jsonl]

Without ``--rows`` it runs on the bundled demo instances (built in a temporary folder).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from trio_swe import EpisodeResult, SweConfig, run_rollouts
from trio_swe.agents import BashAgent
from trio_swe.config import replace_option
from trio_swe.demo import build_demo_set
from trio_swe.grading import get_metadata
from trio_swe.models import ChatModel
from trio_swe.policy import VLLMPolicy
from trio_swe.results import group_advantages
from trio_swe.sandbox.local import LocalBackend


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy-url", required=True, help="the vLLM engine")
    parser.add_argument("--checkpoint", required=True, type=Path, help="the weights it serves")
    parser.add_argument("--rows", type=Path, help="JSONL dataset (default: the demo instances)")
    parser.add_argument("--limit", type=int, default=2, help="instances (default: 2)")
    parser.add_argument("--n-per-instance", type=int, default=4, help="group size (default: 4)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="the run's base seed")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="max |ratio - 1|")
    return parser.parse_args(argv)


def instances(args: argparse.Namespace, workdir: Path) -> list[Any]:
    if args.rows is not None:
        import json

        rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    else:
        rows = build_demo_set(workdir / "repos").rows
    return [get_metadata(row, "scaleswe") for row in rows[: args.limit]]


def config() -> SweConfig:
    cfg = SweConfig.from_env()
    # An untrained model's turns are mostly ill-formed tool calls: train them (the reward
    # teaches the format) rather than masking them away.
    return replace_option(cfg, "episode.ill_formed_policy", "train")


async def rollouts(args: argparse.Namespace, workdir: Path) -> list[list[EpisodeResult]]:
    """The groups, each handed over once all its members finished (as a trainer consumes them)."""
    model = ChatModel.from_checkpoint(args.checkpoint, tools=BashAgent.TOOLS)
    mds = instances(args, workdir)
    groups: dict[str, list[EpisodeResult]] = {}
    complete: list[list[EpisodeResult]] = []
    params = {
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
    }
    async with VLLMPolicy(args.policy_url, vocab_size=len(model)) as policy:
        agent = BashAgent(policy, model, max_turns=args.max_turns)
        async with run_rollouts(
            mds,
            agent,
            backend=LocalBackend(state_dir=workdir / "state"),
            config=config(),
            concurrency=args.concurrency,
            n_per_instance=args.n_per_instance,
            sampling_params=params,
            network=False,
        ) as results:
            async for result in results:
                members = groups.setdefault(result.group, [])
                members.append(result)
                if len(members) == args.n_per_instance:
                    complete.append(members)
                    print(f"group {result.group}: rewards {[r.reward for r in members]}")
    return complete


def train_step(args: argparse.Namespace, groups: list[list[EpisodeResult]]) -> dict[str, float]:
    """Re-score, check the ratios, one optimizer step. Torch is imported here only."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    results = [r for group in groups for r in group]
    advantages = group_advantages(results)
    losses: list[torch.Tensor] = []
    deviations: list[float] = []
    trained_tokens = 0
    for result in results:
        if result.episode_id not in advantages:
            continue  # aborted: an infrastructure outcome, never trained on
        advantage = advantages[result.episode_id]
        for sample in result.samples:
            ids = torch.tensor([sample.tokens_list()], dtype=torch.long)
            n = sample.response_length
            mask = torch.tensor(sample.loss_mask_list(), dtype=torch.float32)
            old = torch.tensor(sample.rollout_log_probs_list(), dtype=torch.float32)
            logits = model(ids).logits[0, :-1] / args.temperature
            new_all = torch.log_softmax(logits.float(), dim=-1)
            new_all = new_all.gather(1, ids[0, 1:, None])[:, 0]
            new = new_all[-n:]  # the response region: token i's log-prob given those before
            ratio = torch.exp(new - old)
            trained = mask.bool()
            deviations.extend((ratio[trained] - 1).abs().tolist())
            trained_tokens += int(trained.sum())
            # The policy-gradient loss (PPO's ratio, unclipped at step 0), per trained token.
            losses.append(-(advantage * ratio * mask).sum())
    if not losses:
        raise SystemExit("no sample to train on (every episode aborted?)")
    loss = torch.stack(losses).sum() / max(trained_tokens, 1)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {
        "loss": float(loss.detach()),
        "trained_tokens": float(trained_tokens),
        "ratio_max_dev": max(deviations),
        "ratio_mean_dev": math.fsum(deviations) / len(deviations),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="grpo-step-") as tmp:
        started = time.perf_counter()
        groups = trio.run(rollouts, args, Path(tmp))
        rolled = time.perf_counter()
    stats = train_step(args, groups)
    done = time.perf_counter()
    episodes = sum(len(g) for g in groups)
    print(
        f"{len(groups)} groups, {episodes} episodes in {rolled - started:.1f} s; "
        f"{int(stats['trained_tokens'])} trained tokens; loss {stats['loss']:.6f}; "
        f"|ratio - 1| max {stats['ratio_max_dev']:.2e} mean {stats['ratio_mean_dev']:.2e}; "
        f"step {done - rolled:.1f} s ({stats['trained_tokens'] / (done - rolled):.0f} tokens/s)"
    )
    return 0 if stats["ratio_max_dev"] <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
