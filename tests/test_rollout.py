"""run_rollouts: streaming, early exit, cancellation at a random moment."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trio_swe import ConfigError, EpisodeResult, PermanentBootError, run_episode, run_rollouts
from trio_swe.agents import AgentOutcome, AgentTask, BaseAgent, BashAgent
from trio_swe.demo import open_scripted_policy_server
from trio_swe.policy import ByteTokenizer, PolicyOutput, SGLangPolicy
from trio_swe.sandbox import Backend, BackendWrapper, Sandbox, SandboxSpec

from .test_episode_support import assert_nothing_left, build_demo, demo_config


@pytest.mark.parametrize(("seed", "low", "high"), [(7, 0.05, 0.6), (11, 1.0, 5.0)])
async def test_cancelling_twenty_episodes_at_a_random_moment_leaves_nothing(
    tmp_path: Path, seed: int, low: float, high: float
) -> None:
    demo, mds, backend = build_demo(tmp_path)
    instances = (mds * 3)[:20]
    moment = random.Random(seed).uniform(low, high)
    finished: list[EpisodeResult] = []
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        with trio.move_on_after(moment) as scope:
            async with run_rollouts(
                instances, agent, backend=backend, config=demo_config(), concurrency=8
            ) as stream:
                async for result in stream:
                    finished.append(result)
        assert scope.cancelled_caught, f"all 20 finished before {moment:.2f}s"
        await trio.testing.wait_all_tasks_blocked()
        assert server.statistics().active == 0
    assert len(finished) < 20
    assert all(r.status != "aborted" for r in finished)
    assert_nothing_left(tmp_path, backend)


async def test_leaving_early_cancels_the_rest(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        async with run_rollouts(
            mds, agent, backend=backend, config=demo_config(), concurrency=3, network=False
        ) as stream:
            first = await stream.receive()
    assert first.status in ("completed", "truncated")
    assert_nothing_left(tmp_path, backend)


class _GatedAgent(BaseAgent):
    """Runs until ``gate`` is set; counts the agents running at once."""

    def __init__(self, gate: trio.Event) -> None:
        self.gate = gate
        self.running = self.peak = 0
        self.two_running = trio.Event()

    async def run(self, sandbox: Sandbox, task: AgentTask) -> AgentOutcome:
        self.running += 1
        self.peak = max(self.peak, self.running)
        if self.running == 2:
            self.two_running.set()
        try:
            await self.gate.wait()
        finally:
            self.running -= 1
        return AgentOutcome(exit_code=0, finish="submitted")


class _CountingBackend(BackendWrapper):
    """Sets ``booted`` once ``n`` sandboxes were created."""

    def __init__(self, backend: Backend, n: int) -> None:
        super().__init__(backend, owns=False)
        self.created, self.n, self.booted = 0, n, trio.Event()

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        sandbox = await super().create_sandbox(spec, nursery)
        self.created += 1
        if self.created == self.n:
            self.booted.set()
        return sandbox


async def test_episodes_boot_ahead_while_the_agents_run(tmp_path: Path) -> None:
    # Two agent slots, two episodes ahead: while both agents run (held at the gate), the next
    # two episodes boot and prepare their sandboxes, then wait for a slot.
    _, mds, local = build_demo(tmp_path)
    gate = trio.Event()
    agent = _GatedAgent(gate)
    backend = _CountingBackend(local, n=4)
    results: list[EpisodeResult] = []
    config = demo_config(agent_time_budget_sec=600.0)  # held at the gate, never out of time
    async with run_rollouts(
        mds[:4], agent, backend=backend, config=config, concurrency=2, network=False
    ) as stream:
        with trio.fail_after(120):  # a hang guard: without boot-ahead only two ever boot
            await backend.booted.wait()
            await agent.two_running.wait()
        gate.set()
        async for result in stream:
            results.append(result)
    assert agent.peak == 2
    assert sorted(r.status for r in results) == ["completed"] * 4, [r.error for r in results]
    assert_nothing_left(tmp_path, local)


async def test_boot_ahead_zero_holds_the_slot_from_boot_to_grade(tmp_path: Path) -> None:
    _, mds, local = build_demo(tmp_path)
    gate = trio.Event()
    agent = _GatedAgent(gate)
    backend = _CountingBackend(local, n=3)
    async with run_rollouts(
        mds[:3], agent, backend=backend, config=demo_config(), concurrency=2, boot_ahead=0,
        network=False,
    ) as stream:  # fmt: skip
        with trio.fail_after(120):  # a hang guard only
            await agent.two_running.wait()
            # The third episode has not even booted: its slot is held by a running agent.
            assert backend.created == 2
            gate.set()
            results = [r async for r in stream]
    assert len(results) == 3
    assert agent.peak == 2


@pytest.mark.parametrize("boot_ahead", [-1, 3])
async def test_boot_ahead_outside_zero_to_concurrency_is_refused(
    tmp_path: Path, boot_ahead: int
) -> None:
    _, mds, local = build_demo(tmp_path)
    with pytest.raises(ConfigError, match="boot_ahead must be between 0 and concurrency"):
        async with run_rollouts(
            mds, _GatedAgent(trio.Event()), backend=local, concurrency=2, boot_ahead=boot_ahead
        ):
            pass


class _GatedBoot(BackendWrapper):
    """Boots only once ``open`` is set; raises a permanent boot error then if ``fail``."""

    def __init__(self, backend: Backend, *, fail: bool = False) -> None:
        super().__init__(backend, owns=False)
        self.open, self.fail, self.created = trio.Event(), fail, 0

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        await self.open.wait()
        if self.fail:
            raise PermanentBootError("this test's boot fails")
        self.created += 1
        return await super().create_sandbox(spec, nursery)


class _WatchedPolicy:
    """Passes calls on (or holds them until cancelled); notes each call's session and ids."""

    def __init__(self, inner: SGLangPolicy | None) -> None:
        self.inner = inner
        self.calls: list[tuple[str | None, list[int]]] = []
        self.called, self.cancelled = trio.Event(), 0

    async def generate(
        self, input_ids: Any, sampling_params: Any, *, session_id: str | None = None
    ) -> PolicyOutput:
        self.calls.append((session_id, list(input_ids)))
        self.called.set()
        try:
            if self.inner is None:
                await trio.sleep_forever()
            assert self.inner is not None
            return await self.inner.generate(input_ids, sampling_params, session_id=session_id)
        except trio.Cancelled:
            self.cancelled += 1
            raise


async def test_the_first_policy_call_is_sent_while_the_sandbox_boots(tmp_path: Path) -> None:
    demo, mds, local = build_demo(tmp_path)
    md = next(md for md in mds if md.instance_id == "demo__calc-1")
    config = demo_config()
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as sglang,
    ):
        # The same episode without the overlap (the policy answers the same script).
        plain = await run_episode(
            md, BashAgent(sglang, ByteTokenizer()), backend=local, config=config
        )
        policy = _WatchedPolicy(sglang)
        backend = _GatedBoot(local)
        results: list[EpisodeResult] = []

        async def episode() -> None:
            agent = BashAgent(policy, ByteTokenizer())  # type: ignore[arg-type]
            results.append(await run_episode(md, agent, backend=backend, config=config))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(episode)
            with trio.fail_after(60):  # a hang guard: before, no call came before the boot
                await policy.called.wait()
            assert backend.created == 0  # the sandbox is still booting
            backend.open.set()
    (result,) = results
    assert result.status == plain.status == "completed", result.error
    assert result.reward == plain.reward == 1.0
    # Each turn one call: the first was not sent again once the sandbox was ready.
    assert len(policy.calls) == result.n_turns == plain.n_turns
    assert [s.tokens for s in result.samples] == [s.tokens for s in plain.samples]
    assert [s.loss_mask for s in result.samples] == [s.loss_mask for s in plain.samples]
    assert_nothing_left(tmp_path, local)


async def test_a_boot_that_fails_aborts_the_first_call_in_flight(tmp_path: Path) -> None:
    _, mds, local = build_demo(tmp_path)
    policy = _WatchedPolicy(None)  # never answers
    backend = _GatedBoot(local, fail=True)
    agent = BashAgent(policy, ByteTokenizer())  # type: ignore[arg-type]
    results: list[EpisodeResult] = []

    async def episode() -> None:
        results.append(await run_episode(mds[0], agent, backend=backend, config=demo_config()))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(episode)
        with trio.fail_after(60):  # a hang guard only
            await policy.called.wait()
        backend.open.set()
    (result,) = results
    assert result.status == "aborted"
    assert result.abort_reason == "boot_failed", result.error
    assert policy.cancelled == 1  # the call in flight was cancelled: the engine aborts it
    assert agent._first_calls == {}
    assert_nothing_left(tmp_path, local)


async def test_an_episode_booting_ahead_sends_nothing_before_its_slot(tmp_path: Path) -> None:
    # One agent slot, one episode ahead: the one waiting for the slot must not start its first
    # call (its output would wait, the engine's batch would grow): calls come episode by episode.
    demo, mds, local = build_demo(tmp_path)
    instances = [md for md in mds if md.instance_id in ("demo__calc-1", "demo__words-1")]
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as sglang,
    ):
        policy = _WatchedPolicy(sglang)
        agent = BashAgent(policy, ByteTokenizer())  # type: ignore[arg-type]
        async with run_rollouts(
            instances, agent, backend=local, config=demo_config(), concurrency=1, boot_ahead=1,
            network=False,
        ) as stream:  # fmt: skip
            results = [r async for r in stream]
    assert [r.status for r in results] == ["completed"] * 2, [r.error for r in results]
    sessions = [s for s, _ in policy.calls]
    switches = sum(a != b for a, b in itertools.pairwise(sessions))
    assert switches == 1, sessions
