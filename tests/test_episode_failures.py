"""How run_episode maps failures: infrastructure -> aborted with a typed reason; retries."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import trio

from trio_swe import SandboxBootError, run_episode
from trio_swe.agents import BashAgent
from trio_swe.demo import open_scripted_policy_server
from trio_swe.grading import get_metadata
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.sandbox import BackendStatistics, Sandbox, SandboxSpec
from trio_swe.sandbox.local import LocalBackend

from .test_episode_support import assert_nothing_left, build_demo, demo_config


class FlakyBackend:
    """The real local backend, except that the first ``failures`` boots fail (fault injection)."""

    name = "local"

    def __init__(self, inner: LocalBackend, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0

    def statistics(self) -> BackendStatistics:
        return self.inner.statistics()

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        self.calls += 1
        if self.calls <= self.failures:
            raise SandboxBootError(f"injected boot failure {self.calls}")
        return await self.inner.create_sandbox(spec, nursery)


def _row_with(demo_row: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    row = msgspec.json.decode(msgspec.json.encode(demo_row))
    row["metadata"].update(metadata)
    return row


async def test_unevaluable_row_is_aborted_before_booting(tmp_path: Path) -> None:
    demo, _, backend = build_demo(tmp_path)
    row = _row_with(demo.rows[0])
    del row["metadata"]["eval_cmd"]  # a scaleswe row with no grader at all
    md = get_metadata(row, "scaleswe")
    agent = BashAgent(SGLangPolicy("http://127.0.0.1:9"), ByteTokenizer())
    result = await run_episode(md, agent, backend=backend, config=demo_config())
    assert result.status == "aborted"
    assert result.dropped
    assert result.abort_reason == "unevaluable"
    assert result.boot_attempts == 0
    assert backend.statistics().created == 0


async def test_boot_is_retried_then_succeeds(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    flaky = FlakyBackend(backend, failures=2)
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        result = await run_episode(
            mds[0], agent, backend=flaky, config=demo_config(boot_retries=2), network=False
        )
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    # Two injected failures, then the agent sandbox, then the eval sandbox.
    assert result.boot_attempts == 4
    assert result.boot_retries == 2
    assert_nothing_left(tmp_path, backend)


async def test_boot_failing_every_attempt_is_aborted(tmp_path: Path) -> None:
    _, mds, backend = build_demo(tmp_path)
    flaky = FlakyBackend(backend, failures=100)
    agent = BashAgent(SGLangPolicy("http://127.0.0.1:9"), ByteTokenizer())
    result = await run_episode(mds[0], agent, backend=flaky, config=demo_config(boot_retries=1))
    assert result.status == "aborted"
    assert result.abort_reason == "boot_failed"
    assert "injected boot failure 2" in (result.error or "")
    assert result.boot_attempts == 2
    assert result.reward == 0.0
    assert result.samples == []


async def test_unreachable_policy_is_aborted_and_the_sandbox_killed(tmp_path: Path) -> None:
    _, mds, backend = build_demo(tmp_path)
    async with open_scripted_policy_server({}) as server:
        url = server.url
    # The server is gone: connections are refused.
    async with SGLangPolicy(url) as policy:
        agent = BashAgent(policy, ByteTokenizer())
        result = await run_episode(mds[0], agent, backend=backend, config=demo_config())
    assert result.status == "aborted"
    assert result.abort_reason == "policy_error"
    assert_nothing_left(tmp_path, backend)


async def test_failing_pre_commands_abort_with_setup_failed(tmp_path: Path) -> None:
    demo, _, backend = build_demo(tmp_path)
    md = get_metadata(_row_with(demo.rows[0], pre_commands="echo preparing\\nexit 3"), "scaleswe")
    agent = BashAgent(SGLangPolicy("http://127.0.0.1:9"), ByteTokenizer())
    result = await run_episode(md, agent, backend=backend, config=demo_config())
    assert result.status == "aborted"
    assert result.abort_reason == "setup_failed"
    assert "exit 3" in (result.error or "")
    assert_nothing_left(tmp_path, backend)


async def test_pre_commands_run_before_the_base_commit_is_recorded(tmp_path: Path) -> None:
    demo, _, backend = build_demo(tmp_path)
    # A pre-command that changes the tree and commits: the patch must not contain its change.
    pre = (
        "echo '# prepared' >> README.md && git -c user.name=t -c user.email=t@t "
        "commit -qam prepared"
    )
    md = get_metadata(_row_with(demo.rows[0], pre_commands=[pre]), "scaleswe")
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        result = await run_episode(md, agent, backend=backend, config=demo_config(), network=False)
    assert result.status == "completed", result.error
    assert result.reward == 1.0
    assert "README.md" not in result.patch_text
    assert "calc.py" in result.patch_text
    assert_nothing_left(tmp_path, backend)


async def test_the_outer_guard_bounds_the_episode(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    slow = next(md for md in mds if md.instance_id in demo.timeouts)
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        config = demo_config(agent_time_budget_sec=60.0, rollout_guard_sec=2.0)
        with trio.fail_after(30):
            result = await run_episode(slow, agent, backend=backend, config=config)
    assert result.status == "aborted"
    assert result.abort_reason == "guard_timeout"
    assert result.timings.total < 10
    assert_nothing_left(tmp_path, backend)
