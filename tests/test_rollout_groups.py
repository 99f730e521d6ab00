"""Groups for GRPO (issue 23 item 3): n episodes per instance, each with its own sandbox and
seed, results carrying their group, advantages from a results file, resume within a group.

Real episodes on the local backend against the demo's scripted policy server, which records
the sampling parameters of every generation it serves.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import pytest

from trio_swe import EpisodeResult, ResultsWriter, read_results, run_rollouts
from trio_swe.agents import BashAgent
from trio_swe.demo import open_scripted_policy_server
from trio_swe.gateway import Session
from trio_swe.gateway._chat import parse_request
from trio_swe.models import ChatModel
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.results import group_advantages
from trio_swe.rollout import GroupMember, episode_seed, plan_groups

from .gateway._support import qwen3_tokenizer
from .test_episode_support import assert_nothing_left, build_demo, demo_config

PICK = ("demo__calc-1", "demo__stack-1")  # reward 1 and reward 0


async def _run(
    tmp_path: Path, instances: Any, **kwargs: Any
) -> tuple[list[EpisodeResult], list[dict[str, Any]]]:
    demo, _, backend = build_demo(tmp_path)
    results: list[EpisodeResult] = []
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        async with run_rollouts(
            instances, agent, backend=backend, config=demo_config(), network=False, **kwargs
        ) as stream:
            async for result in stream:
                results.append(result)
        seen = list(server.sampling_params_seen)
    assert_nothing_left(tmp_path, backend)
    return results, seen


async def test_groups_of_three_each_with_its_own_seed_reaching_the_policy(
    tmp_path: Path,
) -> None:
    _, mds, _ = build_demo(tmp_path / "plan")
    picked = [md for md in mds if md.instance_id in PICK]
    results, seen = await _run(tmp_path, picked, n_per_instance=3, concurrency=4)

    assert len(results) == 6
    assert all(r.status == "completed" for r in results), [r.error for r in results]
    groups = collections.defaultdict(list)
    for r in results:
        assert r.group_id == r.instance_id
        groups[r.group_id].append(r.group_index)
    assert {g: sorted(i) for g, i in groups.items()} == {g: [0, 1, 2] for g in PICK}
    # Each episode's seed is its own and derived from its group and index (no run seed).
    assert {r.seed for r in results} == {episode_seed(r.group_id, r.group_index) for r in results}
    assert len({r.seed for r in results}) == 6
    # Every generation the server served had a seed, and no two shared one: episode seed +
    # turn index.
    seeds = [p.get("seed") for p in seen]
    assert None not in seeds
    assert len(seeds) == sum(r.n_turns for r in results) > 6
    assert len(set(seeds)) == len(seeds)
    for r in results:
        assert r.seed is not None
        assert set(range(r.seed, r.seed + r.n_turns)) <= set(seeds)

    # Advantages from the file alone: the demo's rewards are equal within a group.
    path = tmp_path / "results.msgpack"
    with ResultsWriter(path) as writer:
        for r in results:
            writer.write(r)
    back, _ = read_results(path)
    assert {(r.group_id, r.group_index) for r in back} == {
        (r.group_id, r.group_index) for r in results
    }
    assert group_advantages(back) == {r.episode_id: 0.0 for r in results}


async def test_a_run_seed_gives_other_seeds_and_no_seed_stays_unseeded(tmp_path: Path) -> None:
    _, mds, _ = build_demo(tmp_path / "plan")
    calc = [md for md in mds if md.instance_id == "demo__calc-1"]
    seeded, seen = await _run(tmp_path / "a", calc, sampling_params={"seed": 1234})
    assert (
        seeded[0].seed == episode_seed("demo__calc-1", 0, 1234) != episode_seed("demo__calc-1", 0)
    )
    assert [p["seed"] for p in seen] == [seeded[0].seed + i for i in range(seeded[0].n_turns)]
    # One episode per instance and no run seed: unseeded, as before groups.
    plain, seen = await _run(tmp_path / "b", calc)
    assert plain[0].seed is None
    assert plain[0].group_id == "demo__calc-1"
    assert all("seed" not in p for p in seen)


async def test_resume_runs_only_the_missing_members_of_a_group(tmp_path: Path) -> None:
    _, mds, _ = build_demo(tmp_path / "plan")
    calc = [md for md in mds if md.instance_id == "demo__calc-1"]
    done = {("demo__calc-1", 0), ("demo__calc-1", 2)}
    results, _ = await _run(tmp_path, calc, n_per_instance=4, done=done)
    assert sorted(r.group_index for r in results) == [1, 3]
    assert {r.seed for r in results} == {episode_seed("demo__calc-1", i) for i in (1, 3)}


def test_plan_names_a_repeated_instance_a_group_per_occurrence(tmp_path: Path) -> None:
    _, mds, _ = build_demo(tmp_path)
    a, b = mds[0], mds[1]
    plan = list(plan_groups([a, b, a], 2, done={(f"{a.instance_id}~1", 0)}))
    assert [(m.group_id, m.group_index) for m in plan] == [
        (a.instance_id, 0),
        (a.instance_id, 1),
        (b.instance_id, 0),
        (b.instance_id, 1),
        (f"{a.instance_id}~1", 1),
    ]
    assert all(isinstance(m, GroupMember) for m in plan)
    with pytest.raises(Exception, match="n_per_instance"):
        list(plan_groups([a], 0))


def _result(group: str, index: int, reward: float, status: str = "completed") -> EpisodeResult:
    return EpisodeResult(
        instance_id=group.split("~")[0],
        episode_id=f"{group}/{index}/{status}",
        protocol="scaleswe",
        status=status,  # type: ignore[arg-type]
        reward=reward,
        group_id=group,
        group_index=index,
    )


def test_group_advantages_from_a_file_leave_aborted_episodes_out(tmp_path: Path) -> None:
    path = tmp_path / "r.msgpack"
    with ResultsWriter(path) as writer:
        for r in [
            _result("x", 0, 1.0),
            _result("x", 1, 0.0),
            _result("x", 2, 0.0, "aborted"),  # infrastructure: not in the statistics
            _result("x", 3, 1.0),
            _result("x", 4, 0.0),
            _result("y", 0, 1.0, "truncated"),
            _result("y", 1, 1.0),
        ]:
            writer.write(r)
    results, _ = read_results(path)
    adv = group_advantages(results, eps=0.0)
    # x: rewards 1, 0, 1, 0: mean 0.5, population std 0.5.
    assert adv == {
        "x/0/completed": 1.0,
        "x/1/completed": -1.0,
        "x/3/completed": 1.0,
        "x/4/completed": -1.0,
        "y/0/truncated": 0.0,
        "y/1/completed": 0.0,
    }
    # A result written before groups existed falls back to its instance id as its group.
    old = EpisodeResult(instance_id="z", episode_id="old", protocol="p", status="completed")
    assert old.group == "z"
    assert group_advantages([old]) == {"old": 0.0}


def test_a_seeded_gateway_session_gives_each_request_its_own_seed() -> None:
    def model_for(tools: Any) -> ChatModel:
        return ChatModel(qwen3_tokenizer(), tools=tools)

    s = Session("ep", model_for=model_for, sampling_params={"seed": 100})
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Go."}]}).encode()
    # Placed together (concurrent requests), built after: each keeps its own offset.
    placed = [s.place(parse_request(body)) for _ in range(3)]
    seeds = [s.build(p).sampling_params["seed"] for p in reversed(placed)]
    assert seeds == [102, 101, 100]
    unseeded = Session("ep2", model_for=model_for)
    assert "seed" not in unseeded.build(unseeded.place(parse_request(body))).sampling_params
