"""Trajectory benchmark: build + truncate + encode samples, typed buffers vs Python lists + json.

The baseline is slime's representation, reimplemented here on the same rules: token ids,
loss mask and log-probs as Python lists, a chunked list common-prefix check per turn, list
slicing for truncation and ``json.dumps`` of the sample dict. Both sides process the same
chains of turns in the same run, in alternating rounds (so both see the same load); figures are
medians over several rounds of the process's CPU time (stable on a shared machine, where wall
time measures the other tenants).

Also: ``truncate`` time for a 1k-token vs a 128k-token sample (should not depend on length),
and msgpack encoding throughput beside a plain ``bytes`` copy of the same buffers (the memory
bandwidth limit).

Environment: ``BENCH_TRAJECTORY_SAMPLES`` (default 1000) samples per run,
``BENCH_TRAJECTORY_RUNS`` (default 5) runs.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

from trio_swe import SampleBuilder, TurnRecord, decode_sample, encode_sample, truncate
from trio_swe.trajectory import Sample

N_SAMPLES = int(os.environ.get("BENCH_TRAJECTORY_SAMPLES", "1000"))
RUNS = int(os.environ.get("BENCH_TRAJECTORY_RUNS", "5"))
TURNS = 8  # policy calls per sample (an agent episode); a 1-turn row is printed too
CHAINS = 4  # distinct chains, cycled (the same inputs for both sides)

ListTurn = tuple[list[int], list[int], list[float]]


def make_chain(total: int, rng: random.Random, n_turns: int = TURNS) -> list[ListTurn]:
    """``n_turns`` turns whose prompts extend the previous prompt+output; ``total`` tokens."""
    per_turn = total // n_turns
    obs, out = per_turn // 2, per_turn - per_turn // 2
    history: list[int] = []
    turns: list[ListTurn] = []
    for _ in range(n_turns):
        prompt = history + [rng.randrange(150_000) for _ in range(obs)]
        output = [rng.randrange(150_000) for _ in range(out)]
        lps = [-rng.random() * 4 for _ in range(out)]
        turns.append((prompt, output, lps))
        history = prompt + output
    return turns


# --- baseline: lists + json, slime's algorithm ------------------------------------------------


def common_prefix_len(a: list[int], b: list[int], chunk: int = 4096) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n:
        j = min(i + chunk, n)
        if a[i:j] != b[i:j]:
            while a[i] == b[i]:
                i += 1
            return i
        i = j
    return n


def baseline_one(turns: list[ListTurn], max_tokens: int) -> bytes:
    tokens: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    last_start: int | None = None
    lead = 0
    for prompt, output, out_lps in turns:
        if last_start is None:
            tokens, mask, lps = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
            lead = len(prompt)
        else:
            lcp = common_prefix_len(tokens, prompt)
            if lcp != len(tokens):
                raise AssertionError("the benchmark's chains are clean")
            new = prompt[len(tokens) :]
            tokens.extend(new)
            mask.extend([0] * len(new))
            lps.extend([0.0] * len(new))
        last_start = len(tokens)
        tokens.extend(output)
        mask.extend([1] * len(output))
        lps.extend(out_lps)
    if len(tokens) > max_tokens:
        tokens, mask, lps = tokens[:max_tokens], mask[:max_tokens], lps[:max_tokens]
    d: dict[str, Any] = {
        "tokens": tokens,
        "response_length": len(tokens) - lead,
        "loss_mask": mask[lead:],
        "rollout_log_probs": lps[lead:],
        "reward": 1.0,
        "status": "completed",
        "metadata": {},
    }
    return json.dumps(d).encode()


# --- trio_swe ---------------------------------------------------------------------------------


def ours_one(builder: SampleBuilder, turns: list[TurnRecord]) -> bytes:
    for t in turns:
        builder.add(t)
    [sample] = builder.finish(reward=1.0)
    return encode_sample(sample)


def to_records(chain: list[ListTurn]) -> list[TurnRecord]:
    return [
        TurnRecord.from_lists(prompt_ids=p, output_ids=o, output_log_probs=lp) for p, o, lp in chain
    ]


def median_time(fn: Callable[[], object], runs: int) -> float:
    """Median CPU time of ``fn`` over ``runs`` runs.

    CPU time of this process, not wall time: the benchmark is single-threaded and CPU-bound,
    and on a shared machine wall time mostly measures the other tenants.
    """
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def interleaved_medians(fns: list[Callable[[], object]], runs: int) -> list[float]:
    """Median CPU time of each of ``fns`` over ``runs`` rounds; a round runs each once, in turn.

    On a shared machine the load changes from second to second; timing one side's runs and
    then the other's would compare two different loads (the 8-turn ratio moved from x77 to
    x134 between runs that way). Alternating puts both sides under the same load.
    """
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.process_time()
            fn()
            ts.append(time.process_time() - t0)
    return [statistics.median(ts) for ts in times]


def fmt_rate(per_sec: float) -> str:
    return f"{per_sec:>12,.0f}/s"


def pipeline(total: int, n_turns: int) -> None:
    rng = random.Random(total)
    chains = [make_chain(total, rng, n_turns) for _ in range(CHAINS)]
    records = [to_records(c) for c in chains]
    max_tokens = total * 9 // 10  # every sample is cut (a truncation on both sides)

    builder = SampleBuilder(max_sample_tokens=max_tokens)
    check = ours_one(builder, records[0])
    base_check = json.loads(baseline_one(chains[0], max_tokens))
    got = decode_sample(check)
    if got.tokens_list() != base_check["tokens"] or got.loss_mask_list() != base_check["loss_mask"]:
        raise AssertionError("the two pipelines disagree")

    def run_ours() -> None:
        for i in range(N_SAMPLES):
            ours_one(builder, records[i % CHAINS])

    def run_ours_from_lists() -> None:
        for i in range(N_SAMPLES):
            ours_one(builder, to_records(chains[i % CHAINS]))

    # The baseline is ~100x slower: fewer samples per run, scaled to a rate.
    n_base = max(10, N_SAMPLES // 20)

    def run_base() -> None:
        for i in range(n_base):
            baseline_one(chains[i % CHAINS], max_tokens)

    # The two sides of the ratio alternate, round by round, so both see the same load.
    t_ours, t_base = interleaved_medians([run_ours, run_base], RUNS)
    t_lists = median_time(run_ours_from_lists, max(1, RUNS // 2))
    r_ours, r_lists, r_base = N_SAMPLES / t_ours, N_SAMPLES / t_lists, n_base / t_base
    turns = f"{n_turns} turn{'s' if n_turns > 1 else ''}"
    print(f"{total // 1024}k-token samples ({turns} each, cut to {max_tokens}):")
    print(
        f"  lists + json (slime)        {fmt_rate(r_base)}   {1e3 / r_base:8.3f} ms/sample"
        f"   ({n_base} samples per run)"
    )
    print(
        f"  trio_swe, buffers in        {fmt_rate(r_ours)}   {1e3 / r_ours:8.3f} ms/sample"
        f"   x{r_ours / r_base:,.0f}  ({N_SAMPLES} samples per run)"
    )
    print(
        f"  trio_swe, lists in          {fmt_rate(r_lists)}   {1e3 / r_lists:8.3f} ms/sample"
        f"   x{r_lists / r_base:,.0f}  (includes TurnRecord.from_lists of every turn)"
    )


def truncation() -> None:
    rng = random.Random(1)
    print("truncate(sample, n // 2):")
    results = {}
    reps = 20_000
    for total in (1024, 131072):
        sample = Sample.from_lists(
            tokens=[rng.randrange(150_000) for _ in range(total)],
            loss_mask=[1] * (total - 100),
            rollout_log_probs=[-0.5] * (total - 100),
        )
        as_lists = (sample.tokens_list(), sample.loss_mask_list(), sample.rollout_log_probs_list())

        def ours(s: Sample = sample, n: int = total // 2) -> None:
            for _ in range(reps):
                truncate(s, n)

        def lists(t: tuple[list[Any], ...] = as_lists, n: int = total // 2) -> None:
            for _ in range(reps // 100):
                t[0][:n], t[1][: n - 100], t[2][: n - 100]

        ours()  # warm up (first-touch of the code paths and buffers)
        t_ours = median_time(ours, RUNS) / reps
        t_lists = median_time(lists, RUNS) / (reps // 100)
        results[total] = t_ours
        print(
            f"  {total:>7,} tokens: trio_swe {t_ours * 1e6:8.2f} us   "
            f"list slicing {t_lists * 1e6:10.2f} us   x{t_lists / t_ours:,.0f}"
        )
    ratio = results[131072] / results[1024]
    print(f"  128k / 1k time ratio: {ratio:.2f} (1.0 = independent of length)")


def encoding() -> None:
    rng = random.Random(2)
    total = 32768
    sample = Sample.from_lists(
        tokens=[rng.randrange(150_000) for _ in range(total)],
        loss_mask=[1] * (total - 1000),
        rollout_log_probs=[-0.5] * (total - 1000),
    )
    nbytes = sample.tokens.nbytes + sample.loss_mask.nbytes + sample.rollout_log_probs.nbytes
    bufs = (sample.tokens, sample.loss_mask, sample.rollout_log_probs)
    reps = 2000

    def enc() -> None:
        for _ in range(reps):
            encode_sample(sample)

    def copy() -> None:
        for _ in range(reps):
            b"".join(bufs)

    data = encode_sample(sample)

    def dec() -> None:
        for _ in range(reps):
            decode_sample(data)

    t_enc = median_time(enc, RUNS) / reps
    t_copy = median_time(copy, RUNS) / reps
    t_dec = median_time(dec, RUNS) / reps
    print(f"encode_sample, {total // 1024}k tokens ({nbytes / 1e3:.0f} kB of buffers):")
    print(f"  bytes copy (b''.join)   {nbytes / t_copy / 1e9:6.2f} GB/s   {t_copy * 1e6:8.2f} us")
    print(
        f"  encode_sample           {nbytes / t_enc / 1e9:6.2f} GB/s   {t_enc * 1e6:8.2f} us"
        f"   ({t_copy / t_enc:.2f} of copy speed)"
    )
    print(
        f"  decode_sample (views)   {nbytes / t_dec / 1e9:6.2f} GB/s   {t_dec * 1e6:8.2f} us"
        "   (no buffer copied; the time is the 0/1 check of the mask)"
    )


def main() -> None:
    print(f"{N_SAMPLES} samples per run, median of {RUNS} runs")
    for total, n_turns in ((8192, 1), (8192, TURNS), (32768, TURNS)):
        pipeline(total, n_turns)
    truncation()
    encoding()


if __name__ == "__main__":
    main()
