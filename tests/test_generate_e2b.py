"""generate() with SWE_BACKEND=e2b, against trio_swe.testing's envd-compatible server over TLS.

The envd server and the scripted policy server run in a thread of their own (their own
``trio.run``), so the asyncio side's trio guest run really starts and ends between calls, as in
slime between rollout batches.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import msgspec
import pytest
import trio

from trio_swe import ConfigError, aio, generate
from trio_swe.demo import DemoSet, build_demo_set
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing import (
    EnvdServer,
    ScriptedCompletion,
    ScriptedPolicyServer,
    open_envd_server,
    open_scripted_policy_server,
)

from .test_episode_support import processes_mentioning
from .test_rollout_generate import SlimeLikeSample
from .trio_thread import TrioThread

T = TypeVar("T")

#: A copy of demo__calc-1 whose policy never answers: the episode hangs in its first turn.
HANG = "demo__hang-1"


@dataclass
class Servers:
    envd: EnvdServer
    policy: ScriptedPolicyServer
    token: trio.lowlevel.TrioToken

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the servers' trio run (from any thread but theirs)."""
        return trio.from_thread.run_sync(fn, trio_token=self.token)

    def live_sandboxes(self) -> list[str]:
        return self.call(self.envd.live_sandbox_ids)


@contextmanager
def servers_in_thread(
    templates: Mapping[str, str],
    scripts: Mapping[str, Sequence[str | ScriptedCompletion]],
    state_dir: Path,
) -> Iterator[Servers]:
    """The envd server (TLS) and the scripted policy server, in a thread and trio run of their own."""

    @asynccontextmanager
    async def open_both() -> AsyncIterator[tuple[EnvdServer, ScriptedPolicyServer]]:
        async with (
            open_envd_server(
                backend=LocalBackend(state_dir=state_dir), templates=templates, tls=True
            ) as envd,
            open_scripted_policy_server(scripts) as policy,
        ):
            yield envd, policy

    runner = TrioThread(open_both, "generate-e2b-servers")
    envd, policy = runner.started()
    try:
        yield Servers(envd, policy, runner.token)
    finally:
        runner.stop()
        runner.join()


@pytest.fixture
def demo(tmp_path: Path) -> DemoSet:
    return build_demo_set(tmp_path / "repos")


def _env(monkeypatch: pytest.MonkeyPatch, servers: Servers) -> None:
    monkeypatch.setenv("SWE_BACKEND", "e2b")
    monkeypatch.setenv("SWE_AGENT_TIME_BUDGET_SEC", "60")
    monkeypatch.setenv("SWE_EVAL_TIMEOUT_SEC", "60")
    monkeypatch.setenv("SWE_MAX_TURNS", "10")
    for name, value in servers.envd.sdk_env().items():  # E2B_* and SSL_CERT_FILE (the CA)
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("E2B_DEBUG", raising=False)


def _sample(demo: DemoSet, iid: str, as_id: str | None = None) -> SlimeLikeSample:
    row = copy.deepcopy(next(r for r in demo.rows if r["label"] == iid))
    if as_id is not None:
        row["metadata"]["instance_id"] = row["label"] = as_id
    return SlimeLikeSample(prompt=row["prompt"], label=row["label"], metadata=row["metadata"])


def _templates(demo: DemoSet) -> dict[str, str]:
    images = [r["metadata"]["image"] for r in demo.rows]
    return {image: image for image in images}


@pytest.mark.slow
def test_generate_on_e2b_across_guest_runs(
    tmp_path: Path, demo: DemoSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    with servers_in_thread(_templates(demo), demo.scripts, state) as servers:
        _env(monkeypatch, servers)
        args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=servers.policy.port)
        params = {"temperature": 1.0, "max_new_tokens": 2048}

        async def main() -> tuple[Any, list[Any], Any]:
            # Two calls at once share one trio run (and one E2B backend)...
            first = await asyncio.gather(
                generate(args, _sample(demo, "demo__calc-1"), params),
                generate(args, _sample(demo, "demo__leap-1"), params),
            )
            after_first = msgspec.structs.asdict(aio.statistics())
            after_first["connections"] = client_connections_to(servers.envd.api_url)
            live_between = servers.live_sandboxes()
            # ... which ended with them; the next call runs in a fresh trio run.
            second = await generate(args, _sample(demo, "demo__words-1"), params, evaluation=True)
            return first, [after_first, live_between], second

        (calc, leap), (after_first, live_between), evaluated = asyncio.run(main())
        stats = servers.call(servers.envd.statistics)
        live_after = servers.live_sandboxes()
        connections_after = client_connections_to(servers.envd.api_url)

    assert after_first["running"] == 0  # the guest run ended between the calls
    # The last call out of each trio run closed the E2B backend's connections.
    assert after_first["connections"] == connections_after == 0
    assert live_between == []
    assert live_after == []
    assert stats.sandboxes_created == 6  # agent + grading sandbox per episode
    assert stats.sandboxes_killed == 6, stats
    (c,) = calc
    assert c.status is SlimeLikeSample.Status.COMPLETED
    assert c.reward == demo.expected_rewards["demo__calc-1"] == 1.0
    assert c.metadata["grading_solved"] is True
    assert len(c.loss_mask) == len(c.rollout_log_probs) == c.response_length > 0
    (lp,) = leap
    assert lp.reward == demo.expected_rewards["demo__leap-1"] == 0.0
    assert lp.metadata["episode_status"] == "completed"
    (ev,) = evaluated
    assert ev.reward == demo.expected_rewards["demo__words-1"] == 1.0
    assert ev.remove_sample
    assert ev.status is SlimeLikeSample.Status.COMPLETED
    assert processes_mentioning(str(state)) == []


def client_connections_to(url: str) -> int:
    """Open TCP connections from this process to ``url``'s port (the client's pools)."""
    port = urllib.parse.urlsplit(url).port
    assert port is not None
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[len("socket:[") : -1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if remote_port == port and fields[9] in ours:
                    count += 1
    return count


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> Any:
    """Poll ``condition`` (in the servers' thread) until true; the test never sleeps to order."""

    async def wait() -> None:
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(condition):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)

    return wait()


@pytest.mark.slow
def test_cancelled_generate_leaves_no_sandbox_on_the_server(
    tmp_path: Path, demo: DemoSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = next(r for r in demo.rows if r["label"] == "demo__calc-1")["metadata"]["image"]
    scripts = {HANG: [ScriptedCompletion("```bash\nls\n```", delay_sec=3600.0)]}
    state = tmp_path / "state"
    with servers_in_thread({image: image}, scripts, state) as servers:
        _env(monkeypatch, servers)
        args = SimpleNamespace(sglang_router_ip="127.0.0.1", sglang_router_port=servers.policy.port)

        async def main() -> tuple[list[str], list[str]]:
            task = asyncio.ensure_future(generate(args, _sample(demo, "demo__calc-1", HANG), {}))
            # The agent's sandbox is up and its first policy call is pending (sent while the
            # sandbox booted): cancel now.
            await _wait_for(
                lambda: (
                    servers.call(lambda: servers.policy.statistics().active) > 0
                    and len(servers.live_sandboxes()) == 1
                ),
                "the first policy call and the agent's sandbox",
            )
            running = servers.live_sandboxes()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return running, servers.live_sandboxes()

        running, after = asyncio.run(main())
        connections = client_connections_to(servers.envd.api_url)
        stats = servers.call(servers.envd.statistics)
    assert len(running) == 1
    assert after == []  # killed before the cancellation completed
    assert stats.sandboxes_created == stats.sandboxes_killed == 1, stats
    assert connections == 0
    assert processes_mentioning(str(state)) == []


def test_unknown_backend_is_a_config_error_before_the_row_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SWE_BACKEND", "podman")  # docker is a backend now
    broken = SlimeLikeSample(prompt="?", label="broken", metadata={"instance_id": "b"})
    with pytest.raises(ConfigError, match=r"SWE_BACKEND='podman'.*'local', 'e2b'"):
        asyncio.run(generate(SimpleNamespace(), broken, {}))


def test_e2b_without_an_api_key_is_a_config_error(
    tmp_path: Path, demo: DemoSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWE_BACKEND", "e2b")
    for name in ("E2B_API_KEY", "E2B_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="E2B_API_KEY"):
        asyncio.run(generate(SimpleNamespace(), _sample(demo, "demo__calc-1"), {}))
