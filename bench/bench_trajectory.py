"""Trajectory benchmark: agent episodes from Python lists into samples, against slime's builder.

The baseline is slime's own sample builder, ``slime/agent/trajectory.py`` of a slime checkout
named by ``TRIO_SWE_SLIME_DIR`` and loaded at run time (nothing of it is copied here). It runs
the way ``TrajectoryManager.get_trajectory`` runs it for one routing leaf:
``_chain_to_samples`` over the chain's assistant nodes (``_split_chain_into_builders``, each
``_SampleBuilder``'s CLEAN/REALIGN/FORK placement, ``has_trained_response``, ``to_sample`` with
``max_sample_tokens``), so slime's per-turn message routing (``record_turn``) is left out: the
baseline is the token part alone. ``slime.utils.types`` imports torch for its top-p replay
helpers, which the builder never calls; when torch is not installed an empty placeholder module
stands in for it while slime is imported (printed). Without a checkout the slime rows are
skipped, with the reason.

Both sides get the same inputs: per turn the whole prompt, the output ids and their log-probs
as Python lists, as an agent loop or an adapter hands them over. Two kinds of prompt lists:

* fresh: every prompt is a new list of new int objects, as a tokenizer or a JSON decoder
  returns it (slime's adapter re-renders and re-tokenizes the history each turn);
* extended: each prompt is the previous prompt + output + tool result, concatenated as Python
  lists (the int objects are shared from turn to turn).

Episodes have realistic shapes: 30 turns, a 2,000-token first prompt, replies of 100-300 tokens,
tool results of 100-400 tokens (70%) or 1,500-3,500 (30%), cut at 32,768 tokens. The figures
are medians over rounds of the process's CPU time; each round runs every side once, in turn, so
all sides see the same load on a shared machine.

The gateway session's per-turn record (``trio_swe.gateway``'s ``Session.commit``) over the
same episodes, each prompt an ``array("i")`` history as the session holds it: as it was (the
whole history made a list with ``tolist()`` and converted by ``TurnRecord.from_lists`` each
turn, O(N) per turn) against the chain's ``TurnRecorder`` over views of the history (one
memcmp and a copy of the new tokens); the history's copy and append are left untimed.

With fresh lists a last row is the floor: each prompt read once by ``array("I").fromlist``
and nothing else (no check, no record, no sample), the least an exact check does here.

Also: decoding an SGLang ``/generate`` reply (200 and 2,000 output tokens) into the ids and
log-probs a record is made from, against what slime's adapter does with it (``json.loads``
as aiohttp's ``json()`` runs it, then a list comprehension each for the ids and the
log-probs); ``truncate`` of a 1k- and a 128k-token sample (against slicing the lists); msgpack
encoding beside a plain ``bytes`` copy of the same buffers.

Environment: ``TRIO_SWE_SLIME_DIR`` (slime checkout), ``BENCH_TRAJECTORY_EPISODES`` (default 6)
episodes per round, ``BENCH_TRAJECTORY_RUNS`` (default 5) rounds.
"""

from __future__ import annotations

import array
import importlib
import json
import os
import random
import statistics
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import msgspec

from trio_swe import (
    Sample,
    SampleBuilder,
    TurnRecord,
    TurnRecorder,
    decode_sample,
    encode_sample,
    truncate,
)
from trio_swe.gateway._session import _turn_of
from trio_swe.policy._sglang import decode_generate_reply

EPISODES = int(os.environ.get("BENCH_TRAJECTORY_EPISODES", "6"))
RUNS = int(os.environ.get("BENCH_TRAJECTORY_RUNS", "5"))
TURNS = 30
FIRST_PROMPT = 2000
MAX_CONTEXT = 32768
VOCAB = 151_000

ListTurn = tuple[list[int], list[int], list[float]]


# --- slime, loaded from its checkout -----------------------------------------------------------


class Slime:
    """slime's trajectory module and what its builder needs, from a checkout."""

    def __init__(self, trajectory: Any, sample_cls: Any, note: str) -> None:
        self.trajectory = trajectory
        self.manager = trajectory.TrajectoryManager()
        self.base = sample_cls(index=0, group_index=0, prompt="", label=None)
        self.note = note


def load_slime() -> Slime | str:
    """slime's builder from ``$TRIO_SWE_SLIME_DIR``, or the reason it cannot be loaded."""
    root = os.environ.get("TRIO_SWE_SLIME_DIR")
    if not root:
        return "TRIO_SWE_SLIME_DIR is not set (a checkout of THUDM/slime)"
    if not (Path(root) / "slime" / "agent" / "trajectory.py").is_file():
        return f"{root} has no slime/agent/trajectory.py"
    placeholder: types.ModuleType | None = None
    note = "torch installed"
    try:
        importlib.import_module("torch")
    except ImportError:
        # Only names evaluated at import (annotations, dataclass fields) are needed.
        placeholder = types.ModuleType("torch")
        for name in ("Tensor", "dtype", "Size"):
            setattr(placeholder, name, type(name, (), {}))
        placeholder.is_tensor = lambda obj: False  # type: ignore[attr-defined]
        sys.modules["torch"] = placeholder
        note = "torch not installed: an empty placeholder module stood in for it at import"
    sys.path.insert(0, root)
    try:
        trajectory = importlib.import_module("slime.agent.trajectory")
        sample_cls = importlib.import_module("slime.utils.types").Sample
    except Exception as exc:
        return f"importing slime from {root} failed: {type(exc).__name__}: {exc}"
    finally:
        sys.path.remove(root)
        if placeholder is not None and sys.modules.get("torch") is placeholder:
            del sys.modules["torch"]
    return Slime(trajectory, sample_cls, note)


# --- episodes ----------------------------------------------------------------------------------


class Episode:
    """One episode's tokens and turn boundaries. Each turn's lists are made just before they
    are handed to a side (untimed), so every side gets them fresh from memory, as an agent
    loop or an adapter would hand them over."""

    def __init__(self, rng: random.Random) -> None:
        ids = [rng.randrange(VOCAB) for _ in range(FIRST_PROMPT)]
        self.turns: list[tuple[int, int, int]] = []  # (prompt length, output, tool result)
        self.log_probs: list[array.array[float]] = []
        for _ in range(TURNS):
            n_out = rng.randint(100, 300)
            n_result = rng.randint(*(1500, 3500) if rng.random() < 0.3 else (100, 400))
            self.turns.append((len(ids), n_out, n_result))
            ids += [rng.randrange(VOCAB) for _ in range(n_out + n_result)]
            self.log_probs.append(array.array("d", [-rng.random() * 3 for _ in range(n_out)]))
        self.ids = array.array("i", ids)

    def feed(self, *, fresh: bool) -> Iterator[ListTurn]:
        """(prompt, output, log-probs) lists per turn. ``fresh``: every list has new int
        objects (``tolist``, like a JSON decoder's); else each prompt is the previous prompt +
        output + tool result concatenated, sharing their int objects."""
        ids = self.ids
        prompt: list[int] = []
        for k, (n_prompt, n_out, _) in enumerate(self.turns):
            if fresh or not prompt:
                prompt = ids[:n_prompt].tolist()
            output = ids[n_prompt : n_prompt + n_out].tolist()
            yield prompt, output, self.log_probs[k].tolist()
            if not fresh:
                end = n_prompt + n_out + self.turns[k][2]
                prompt = prompt + output + ids[n_prompt + n_out : end].tolist()

    def histories(self) -> Iterator[tuple[array.array[int], list[int], list[float]]]:
        """Per turn the prompt as a new ``array("i")`` (a gateway session's history copy),
        the output ids and their log-probs as the policy returns them (lists)."""
        ids = self.ids
        for k, (n_prompt, n_out, _) in enumerate(self.turns):
            yield (
                ids[:n_prompt],
                ids[n_prompt : n_prompt + n_out].tolist(),
                self.log_probs[k].tolist(),
            )

    def total_tokens(self) -> int:
        n_prompt, n_out, _ = self.turns[-1]
        return n_prompt + n_out


class Side(Protocol):
    """One way of turning an episode's turns into samples, fed turn by turn."""

    name: str

    def start(self, index: int) -> None: ...
    def turn(self, prompt: list[int], output: list[int], lps: list[float]) -> None: ...
    def finish(self) -> list[Any]: ...


class SlimeSide:
    """slime: per turn the TurnRecord its adapter makes; at the end its builder over the
    chain's assistant nodes (as get_trajectory runs it per routing leaf)."""

    name = "slime _SampleBuilder (baseline)"

    def __init__(self, slime: Slime) -> None:
        self.slime = slime
        self.chain: list[Any] = []

    def start(self, index: int) -> None:
        self.chain = []

    def turn(self, prompt: list[int], output: list[int], lps: list[float]) -> None:
        traj = self.slime.trajectory
        node = traj.MessageNode(role="assistant", message=None)
        node.turn = traj.TurnRecord(
            prompt_ids=prompt, output_ids=output, finish_reason="stop", output_log_probs=lps
        )
        self.chain.append(node)

    def finish(self) -> list[Any]:
        slime = self.slime
        samples: list[Any] = slime.manager._chain_to_samples(
            self.chain, base_sample=slime.base, extra_metadata=None, max_sample_tokens=MAX_CONTEXT
        )
        for s in samples:
            s.reward = 1.0
        return samples


class RecorderSide:
    name = "trio_swe TurnRecorder + SampleBuilder"

    def start(self, index: int) -> None:
        self.recorder = TurnRecorder()
        self.builder = SampleBuilder(max_sample_tokens=MAX_CONTEXT)

    def turn(self, prompt: list[int], output: list[int], lps: list[float]) -> None:
        self.builder.add(
            self.recorder.record(prompt_ids=prompt, output_ids=output, output_log_probs=lps)
        )

    def finish(self) -> list[Sample]:
        return self.builder.finish(reward=1.0)


class FromListsSide(RecorderSide):
    name = "trio_swe TurnRecord.from_lists + SampleBuilder"

    def turn(self, prompt: list[int], output: list[int], lps: list[float]) -> None:
        self.builder.add(
            TurnRecord.from_lists(prompt_ids=prompt, output_ids=output, output_log_probs=lps)
        )


class PrebuiltSide(RecorderSide):
    """The builder alone: the records were made before (untimed); the lists are ignored."""

    name = "trio_swe SampleBuilder, records prebuilt"

    def __init__(self, records: list[list[TurnRecord]]) -> None:
        self.records = records

    def start(self, index: int) -> None:
        super().start(index)
        self.pending = iter(self.records[index])

    def turn(self, prompt: list[int], output: list[int], lps: list[float]) -> None:
        self.builder.add(next(self.pending))


class FloorSide(RecorderSide):
    """Not a way to build samples: each prompt read once by ``array("I").fromlist`` and
    nothing else, the least any exact check of a fresh list does here."""

    name = "floor: each prompt read once, nothing kept"

    def start(self, index: int) -> None:
        pass

    def turn(self, prompt: list[int], output: list[int], lps: list[float]) -> None:
        array.array("I").fromlist(prompt)

    def finish(self) -> list[Sample]:
        return []


def run_side(side: Side, episode: Episode, index: int, *, fresh: bool) -> tuple[float, list[Any]]:
    """CPU time of ``side`` over one episode (the lists' making excluded), and its samples."""
    clock = time.process_time
    side.start(index)
    spent = 0.0
    for prompt, output, lps in episode.feed(fresh=fresh):
        t0 = clock()
        side.turn(prompt, output, lps)
        spent += clock() - t0
    t0 = clock()
    samples = side.finish()
    return spent + clock() - t0, samples


def check_same(ours: list[Sample], theirs: list[Any]) -> None:
    """Our samples hold slime's tokens and mask, and its log-probs to float32 precision."""
    if len(ours) != len(theirs):
        raise AssertionError(f"{len(ours)} samples against slime's {len(theirs)}")
    for a, b in zip(ours, theirs, strict=True):
        if a.tokens_list() != b.tokens or a.loss_mask_list() != b.loss_mask:
            raise AssertionError("tokens or loss mask differ from slime's")
        if a.response_length != b.response_length:
            raise AssertionError("response lengths differ from slime's")
        lps = a.rollout_log_probs_list()
        if any(abs(x - y) > 1e-6 for x, y in zip(lps, b.rollout_log_probs, strict=True)):
            raise AssertionError("log-probs differ from slime's")


# --- timing -------------------------------------------------------------------------------------


def interleaved_medians(fns: Sequence[Callable[[], object]], runs: int) -> list[list[float]]:
    """CPU times of each of ``fns`` over ``runs`` rounds; a round runs each once, in turn.

    CPU time, not wall time: the work is single-threaded and CPU-bound, and on a shared machine
    wall time mostly measures the other tenants. Alternating puts all sides under one load.
    """
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(runs):
        for fn, ts in zip(fns, times, strict=True):
            t0 = time.process_time()
            fn()
            ts.append(time.process_time() - t0)
    return times


def episodes_rows(slime: Slime | str, *, fresh: bool) -> None:
    rng = random.Random(13)
    episodes = [Episode(rng) for _ in range(EPISODES)]
    records = [
        [
            TurnRecord.from_lists(prompt_ids=p, output_ids=o, output_log_probs=lp)
            for p, o, lp in e.feed(fresh=True)
        ]
        for e in episodes
    ]
    lengths = [e.total_tokens() for e in episodes]
    cut = sum(n > MAX_CONTEXT for n in lengths)
    kind = "fresh lists (new int objects each turn)" if fresh else "extended lists"
    print(
        f"{kind}: {EPISODES} episodes of {TURNS} turns, {min(lengths):,}-{max(lengths):,} tokens"
        f" ({cut} cut to {MAX_CONTEXT:,}), {sum(t[0] for e in episodes for t in e.turns):,}"
        " prompt tokens in all"
    )
    sides: list[Side] = [RecorderSide(), FromListsSide(), PrebuiltSide(records)]
    if isinstance(slime, Slime):
        sides.insert(0, SlimeSide(slime))
        for i, e in enumerate(episodes):  # the same samples, before anything is timed
            theirs = run_side(sides[0], e, i, fresh=fresh)[1]
            for side in sides[1:]:
                check_same(run_side(side, e, i, fresh=fresh)[1], theirs)
    if fresh:
        sides.append(FloorSide())
    # Rounds; in each, every episode is run by every side in turn (the load of the machine
    # changes from second to second: all sides see the same).
    times: list[list[float]] = [[] for _ in sides]
    for _ in range(RUNS):
        spent = [0.0] * len(sides)
        for i, e in enumerate(episodes):
            for k, side in enumerate(sides):
                spent[k] += run_side(side, e, i, fresh=fresh)[0]
        for k, t in enumerate(spent):
            times[k].append(t)
    base = times[0] if isinstance(slime, Slime) else None
    for side, ts in zip(sides, times, strict=True):
        per = statistics.median(ts) / EPISODES
        line = f"  {side.name:48s} {per * 1e3:8.2f} ms/episode"
        if base is not None and ts is not base:
            ratios = sorted(b / t for b, t in zip(base, ts, strict=True))
            line += (
                f"   x{statistics.median(base) / statistics.median(ts):.2f} slime's speed"
                f" (rounds x{ratios[0]:.2f}-x{ratios[-1]:.2f})"
            )
        print(line)
    if not isinstance(slime, Slime):
        print(f"  slime rows skipped: {slime}")


def gateway_rows() -> None:
    rng = random.Random(13)
    episodes = [Episode(rng) for _ in range(EPISODES)]
    clock = time.process_time

    def before(e: Episode) -> tuple[float, list[TurnRecord]]:
        spent, turns = 0.0, []
        for history, out, lps in e.histories():
            t0 = clock()
            prompt_ids = history.tolist()  # the session's draft() as it was
            spent += clock() - t0
            history.extend(out)  # append_output (untimed, both sides)
            t0 = clock()
            turns.append(
                TurnRecord.from_lists(prompt_ids=prompt_ids, output_ids=out, output_log_probs=lps)
            )
            spent += clock() - t0
        return spent, turns

    def after(e: Episode) -> tuple[float, list[TurnRecord]]:
        spent, turns, recorder = 0.0, [], TurnRecorder()
        for history, out, lps in e.histories():
            n = len(history)
            history.extend(out)
            t0 = clock()
            turns.append(
                _turn_of(
                    recorder, history, n, log_probs=lps, finish_reason="stop", ill_formed=False
                )
            )
            spent += clock() - t0
        return spent, turns

    for e in episodes:  # the same records, before anything is timed
        if before(e)[1] != after(e)[1]:
            raise AssertionError("the session's records differ from from_lists'")
    times: list[list[float]] = [[], []]
    for _ in range(RUNS):
        spent = [0.0, 0.0]
        for e in episodes:
            spent[0] += before(e)[0]
            spent[1] += after(e)[0]
        times[0].append(spent[0])
        times[1].append(spent[1])
    t_before, t_after = (statistics.median(t) / EPISODES for t in times)
    print(
        f"gateway session, per-turn record over a {TURNS}-turn episode's array('i') history:\n"
        f"  history.tolist() + TurnRecord.from_lists (as it was) {t_before * 1e3:8.2f} ms/episode\n"
        f"  the chain's TurnRecorder over views of the history  {t_after * 1e3:8.2f} ms/episode"
        f"   x{t_before / t_after:.1f}"
    )


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def sglang_reply(n: int, rng: random.Random) -> bytes:
    """A /generate reply body as SGLang sends it (``return_logprob: true``)."""
    entries = [[-rng.random() * 3, rng.randrange(VOCAB), None] for _ in range(n)]
    meta = {
        "id": "0123456789abcdef",
        "finish_reason": {"type": "stop", "matched": 151645},
        "prompt_tokens": 30_000,
        "completion_tokens": n,
        "cached_tokens": 29_000,
        "output_token_logprobs": entries,
        "e2e_latency": 1.25,
    }
    text = "x" * (4 * n)  # the decoded text, which neither side needs
    return msgspec.json.encode(
        {"text": text, "output_ids": [e[1] for e in entries], "meta_info": meta}
    )


def slime_reply(body: bytes) -> tuple[list[int], list[float], str]:
    """What slime's adapter does with the reply (call_sglang_generate, described there)."""
    data = json.loads(body)
    meta = data.get("meta_info") or {}
    entries = meta.get("output_token_logprobs") or []
    ids = [x[1] for x in entries]
    lps = [float(x[0]) for x in entries]
    return ids, lps, (meta.get("finish_reason") or {}).get("type", "stop") or "stop"


def replies() -> None:
    rng = random.Random(3)
    print("SGLang /generate reply -> output ids and log-probs (lists both sides):")
    for n in (200, 2000):
        body = sglang_reply(n, rng)
        out = decode_generate_reply(body)
        ids, lps, _ = slime_reply(body)
        if out.output_ids != ids or out.log_probs != lps:
            raise AssertionError("the two decoders disagree")
        reps = max(20, 40_000 // n)

        def ours(b: bytes = body, reps: int = reps) -> None:
            for _ in range(reps):
                decode_generate_reply(b)

        def theirs(b: bytes = body, reps: int = reps) -> None:
            for _ in range(reps):
                slime_reply(b)

        t_theirs, t_ours = (
            statistics.median(t) / reps for t in interleaved_medians([theirs, ours], RUNS)
        )
        print(
            f"  {n:>5,} tokens ({len(body) / 1e3:5.1f} kB): slime's json.loads + comprehensions"
            f" {t_theirs * 1e6:8.1f} us   decode_generate_reply {t_ours * 1e6:8.1f} us"
            f"   x{t_theirs / t_ours:.2f}"
        )


def truncation() -> None:
    rng = random.Random(1)
    print("truncate(sample, n // 2), baseline: slicing the sample's three lists:")
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
    slime = load_slime()
    where = f"slime from {os.environ.get('TRIO_SWE_SLIME_DIR')}"
    print(f"{where} ({slime.note})" if isinstance(slime, Slime) else f"slime: {slime}")
    print(f"median CPU time of {RUNS} rounds; ratios: slime's time / ours (higher is faster)")
    episodes_rows(slime, fresh=True)
    episodes_rows(slime, fresh=False)
    gateway_rows()
    replies()
    truncation()
    encoding()


if __name__ == "__main__":
    main()
