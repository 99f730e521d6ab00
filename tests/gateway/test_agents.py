"""All five real CLI agents (``nox -s agents``; ``TRIO_SWE_AGENTS_FULL=1``): each reads a file
with its own tools, edits it and finishes, in a local sandbox that reaches only the gateway
(every ``connect()`` it makes is traced), token-exact; then a demo episode each; then Claude
Code against a failing policy and an overflowing context."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import SampleBuilder, run_episode
from trio_swe.agents import AgentTask
from trio_swe.agents._cli import FORWARD_PORT, CliAgent
from trio_swe.agents._install import ensure_installed
from trio_swe.demo import DEMO_INSTANCES
from trio_swe.demo._cli_scripts import cli_script, tool_call_text
from trio_swe.policy import PolicyError, PolicyOutput
from trio_swe.sandbox import open_sandbox
from trio_swe.sandbox.local import LocalBackend

from ..test_episode_support import build_demo, demo_config
from ._support import assert_token_exact, qwen3_tokenizer, scripted_policy

pytestmark = pytest.mark.skipif(
    os.environ.get("TRIO_SWE_AGENTS_FULL") != "1",
    reason="the five real CLIs run in `nox -s agents` (TRIO_SWE_AGENTS_FULL=1)",
)

FILE = "/testbed/greeting.txt"
#: Each agent's own read and edit tools ("primer" turns are the client's scripted history).
SCRIPTS: dict[str, list[str]] = {
    "claude-code": [
        tool_call_text("Read", {"file_path": FILE}, "Read it first."),
        tool_call_text("Edit", {"file_path": FILE, "old_string": "world", "new_string": "trio"}),
        "Done: it greets trio now.",
    ],
    "codex": [
        tool_call_text("exec_command", {"cmd": "cat greeting.txt"}, "Read it first."),
        tool_call_text("exec_command", {"cmd": "sed -i s/world/trio/ greeting.txt"}),
        "Done: it greets trio now.",
    ],
    "qwen-code": [
        "(primer)",
        tool_call_text("read_file", {"file_path": FILE}, "Read it first."),
        tool_call_text("edit", {"file_path": FILE, "old_string": "world", "new_string": "trio"}),
        "Done: it greets trio now.",
    ],
    "opencode": [
        tool_call_text("read", {"filePath": FILE}, "Read it first."),
        tool_call_text("edit", {"filePath": FILE, "oldString": "world", "newString": "trio"}),
        "Done: it greets trio now.",
    ],
    "mini-swe-agent": [
        tool_call_text("bash", {"command": "cat greeting.txt"}, "Read it first."),
        tool_call_text("bash", {"command": "sed -i s/world/trio/ greeting.txt"}),
        tool_call_text("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}),
    ],
}
AGENTS = sorted(SCRIPTS)
_CONNECT = re.compile(r"connect\(\d+, \{sa_family=(AF_\w+), (.*?)\}")


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "greeting.txt").write_text("hello world\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True, env=env)
    return repo


def _task(budget: float = 180.0, **kw: Any) -> AgentTask:
    return AgentTask(
        instance_id="greet-cli",
        session_id="ep-cli",
        problem_statement="Say hello to trio.",
        workdir="/testbed",
        problem_statement_path="/testbed/PROBLEM_STATEMENT.md",
        time_budget_sec=budget,
        sampling_params={"max_new_tokens": 1024, "temperature": 1.0},
        **kw,
    )


def _script(agent: str) -> dict[str, list[str]]:
    return {"greet-cli": SCRIPTS[agent]}


@pytest.mark.parametrize("agent", AGENTS)
async def test_cli_reads_edits_finishes_token_exact_reaching_only_the_gateway(
    agent: str, tmp_path: Path
) -> None:
    await ensure_installed(agent)
    trace = "/tmp/connects.trace"
    async with scripted_policy(_script(agent)) as (server, policy):
        cli = CliAgent(
            agent,
            policy=policy,
            tokenizer=qwen3_tokenizer(),
            wrapper=["strace", "-f", "-qq", "-e", "trace=connect", "-o", trace],
        )
        async with open_sandbox(
            LocalBackend(state_dir=tmp_path / "state"), str(_repo(tmp_path)), network=False
        ) as sb:
            await sb.exec("chown -R agent: /testbed", user="root")
            outcome = await cli.run(sb, _task())
            content = (await sb.exec(f"cat {FILE}")).output
            connects = (await sb.exec(f"grep connect {trace} || true")).output
            # The sandbox itself reaches nothing else: the policy server's port on the host
            # is not there (its own network namespace).
            probe = await sb.exec(
                f'python3 -c \'import socket; socket.create_connection(("127.0.0.1", '
                f"{server.port}), 2)'",
                user="agent",
            )
    assert outcome.exit_code == 0, outcome.output[-3000:]
    assert content == "hello trio\n"
    assert probe.exit_code != 0
    # Every connection the CLI (and its children) opened went to the forwarder or to a local
    # unix socket (name service, its own IPC): no DNS, no outside host, by configuration.
    targets = _CONNECT.findall(connects)
    inet = [t for t in targets if t[0] in ("AF_INET", "AF_INET6")]
    assert inet, connects
    for family, where in inet:
        assert family == "AF_INET", where
        assert f"htons({FORWARD_PORT})" in where, where
        assert 'inet_addr("127.0.0.1")' in where, where
    # Nothing asked the gateway for anything but the API (opencode's npm look-ups, which
    # its registry setting would send there, are off by configuration: none arrive).
    assert cli.last_gateway.statistics().by_status.get(404, 0) == 0
    session = cli.last_session
    stats = session.statistics()
    outputs = [t for t in SCRIPTS[agent] if t != "(primer)"]
    assert stats.turns == len(outputs), stats
    assert stats.forks == 0
    turns = session.turns()
    builder = SampleBuilder()
    for t in turns:
        builder.add(t)
    (sample,) = builder.finish(reward=1.0)
    assert_token_exact(sample, turns, outputs, session.conversations()[0], session.tools()[0])


@pytest.mark.parametrize("instance", ["demo__calc-1", "demo__greet-1"])
@pytest.mark.parametrize("agent", AGENTS)
async def test_cli_demo_episode(agent: str, instance: str, tmp_path: Path) -> None:
    """A demo episode; ``greet`` is scripted to overrun the budget (a 600 s command, repeated
    while the CLI's shell tool hands control back early): reward 0, whatever the CLI."""
    await ensure_installed(agent)
    _, mds, backend = build_demo(tmp_path)
    inst = next(i for i in DEMO_INSTANCES if i.instance_id == instance)
    md = next(m for m in mds if m.instance_id == inst.instance_id)
    budget = 90.0 if inst.times_out else 180.0  # opencode alone starts in ~10-40 s, loaded
    async with scripted_policy({inst.instance_id: cli_script(agent, inst)}) as (_, policy):
        cli = CliAgent(agent, policy=policy, tokenizer=qwen3_tokenizer())
        result = await run_episode(
            md,
            cli,
            backend=backend,
            config=demo_config(agent_time_budget_sec=budget, max_context_tokens=65536),
            sampling_params={"max_new_tokens": 1024},
        )
    expected = "truncated" if inst.times_out else "completed"
    assert result.status == expected, (result.abort_reason, result.error, result.agent_output)
    assert result.reward == inst.expected_reward
    assert (result.agent_finish == "time_budget") == inst.times_out, result.agent_finish
    assert len(result.samples) == 1
    assert result.samples[0].metadata["trajectory"]["turn_kinds"][0] == "start"


class _Fails:
    """The policy answering HTTP 500 to its first ``n`` calls (then the real one)."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.n, self.calls = inner, n, 0

    async def generate(
        self, ids: Any, params: Any, *, session_id: str | None = None
    ) -> PolicyOutput:
        self.calls += 1
        if self.calls <= self.n:
            raise PolicyError("policy /generate answered HTTP 500: injected")
        out: PolicyOutput = await self.inner.generate(ids, params, session_id=session_id)
        return out


async def test_claude_code_retries_a_policy_500_and_one_turn_is_recorded(tmp_path: Path) -> None:
    async with scripted_policy(_script("claude-code")) as (_, policy):
        flaky = _Fails(policy, 1)
        cli = CliAgent("claude-code", policy=flaky, tokenizer=qwen3_tokenizer())
        async with open_sandbox(
            LocalBackend(state_dir=tmp_path / "state"), str(_repo(tmp_path)), network=False
        ) as sb:
            await sb.exec("chown -R agent: /testbed", user="root")
            outcome = await cli.run(sb, _task())
    assert outcome.exit_code == 0, outcome.output[-2000:]
    assert '"error_status":500' in outcome.output  # Claude Code saw the 500 and retried
    stats = cli.last_session.statistics()
    assert (stats.failed, stats.turns, stats.chains) == (1, 3, 1)


async def test_claude_code_stops_on_context_overflow_and_the_sample_is_truncated(
    tmp_path: Path,
) -> None:
    async with scripted_policy(_script("claude-code")) as (_, policy):
        cli = CliAgent("claude-code", policy=policy, tokenizer=qwen3_tokenizer())
        async with open_sandbox(
            LocalBackend(state_dir=tmp_path / "state"), str(_repo(tmp_path)), network=False
        ) as sb:
            await sb.exec("chown -R agent: /testbed", user="root")
            # Room for the first prompt (~3.1k tokens with Claude Code's four tools) and its
            # reply, not for the file's contents on top.
            await sb.exec(f"seq 1 3000 >> {FILE}", user="agent")
            task = _task(max_context_tokens=3600)
            outcome = await cli.run(sb, task)
    assert outcome.exit_code != 0  # the CLI stops as against the real service
    assert "prompt_too_long" in outcome.output  # its result says why
    stats = cli.last_session.statistics()
    assert stats.overflows >= 1
    builder = SampleBuilder(max_sample_tokens=3600)
    for t in cli.last_session.turns():
        builder.add(t)
    samples = builder.finish(reward=0.0)
    assert samples
    assert samples[-1].status == "truncated"


def test_generate_with_claude_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slime's generate() with SWE_AGENT=claude-code, from asyncio, as slime calls it."""
    import asyncio
    import copy
    from types import SimpleNamespace

    import trio

    from trio_swe import aio, generate
    from trio_swe.demo import build_demo_set, open_scripted_policy_server
    from trio_swe.demo._cli_scripts import cli_scripts
    from trio_swe.policy import RawTextTokenizer

    from ..models.test_generate_qwen3 import slime_assertions
    from ..qwen3 import qwen3_dir
    from ._support import KEY_PATTERN

    monkeypatch.setenv("SWE_AGENT", "claude-code")
    monkeypatch.setenv("SWE_AGENT_TIME_BUDGET_SEC", "120")
    monkeypatch.setenv("SWE_EVAL_TIMEOUT_SEC", "60")
    demo = build_demo_set(tmp_path / "repos")
    rows = {row["label"]: row for row in demo.rows}
    names = ["demo__calc-1", "demo__stack-1"]

    async def serve(ready: asyncio.Future[Any]) -> None:
        async with open_scripted_policy_server(
            cli_scripts("claude-code"),
            tokenizer=RawTextTokenizer(qwen3_tokenizer()),
            key_pattern=KEY_PATTERN,
        ) as server:
            ready.set_result(server)
            await trio.sleep_forever()

    async def main() -> list[Any]:
        from ..test_rollout_generate import SlimeLikeSample

        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        serving = asyncio.ensure_future(aio.run(serve, ready))
        server = await ready
        args = SimpleNamespace(
            sglang_router_ip="127.0.0.1",
            sglang_router_port=server.port,
            hf_checkpoint=str(qwen3_dir()),
            rollout_max_context_len=65536,
        )
        params = {"temperature": 0.7, "max_new_tokens": 1024}
        out = await asyncio.gather(
            *(
                generate(
                    args,
                    SlimeLikeSample(
                        prompt=rows[n]["prompt"],
                        label=n,
                        metadata=copy.deepcopy(rows[n]["metadata"]),
                    ),
                    params,
                )
                for n in names
            )
        )
        serving.cancel()
        try:
            await serving
        except asyncio.CancelledError:
            pass
        return list(out)

    results = asyncio.run(main())
    for name, samples in zip(names, results, strict=True):
        (s,) = samples
        assert s.reward == demo.expected_rewards[name], (name, s.metadata)
        slime_assertions(s)
        assert s.metadata["trajectory"]["turn_kinds"][1:] == ["clean"] * (
            len(s.metadata["trajectory"]["turn_kinds"]) - 1
        )
        assert "<tool_call>" in s.response


async def _provide_libraries(sb: Any, exe: Path) -> None:
    """The test image carries only the libraries of a few tools; give it those the agent's
    executable loads that it lacks (Claude Code's Bun needs librt; SWE-bench images have it)."""
    # The executable, and for a Python agent its compiled extensions (pydantic-core's needs
    # libgcc_s, which the image's few tools do not).
    objects = [str(exe), *[str(p) async for p in _shared_objects(exe)]]
    libs: set[str] = set()
    for obj in objects:
        out = await trio.run_process(["ldd", obj], capture_stdout=True, check=False)
        libs.update(re.findall(r"=> (/\S+)", out.stdout.decode()))
    for lib in sorted(libs):
        if not (await sb.exec(f"test -e {lib}", user="root")).ok:
            data = await trio.Path(lib).read_bytes()
            await sb.write_file(lib, data, user="root")


async def _shared_objects(exe: Path) -> Any:
    venv = trio.Path(exe).parent.parent
    if await (venv / "pyvenv.cfg").exists():
        for path in await venv.rglob("*.so"):
            yield path


@pytest.mark.parametrize("agent", AGENTS)
async def test_cli_on_the_docker_backend(agent: str, tmp_path: Path, docker_env: Any) -> None:
    """The same read/edit/finish in a container without a network: the agents' cache and the
    gateway's socket directory bind-mounted read-only, the forwarder inside. The image has no
    Node.js: Codex runs its native executable; Qwen Code (Node.js only) is refused, clearly."""
    from trio_swe import AgentInstallError
    from trio_swe.agents._cli import cli_agent_host_paths
    from trio_swe.sandbox.docker import DockerBackend

    await ensure_installed(agent)
    async with (
        scripted_policy(_script(agent)) as (_, policy),
        DockerBackend(
            host=docker_env.docker_host,
            base_image=docker_env.base_image,
            host_paths=cli_agent_host_paths(),
            state_dir=tmp_path / "state",
        ) as backend,
        open_sandbox(backend, str(_repo(tmp_path)), network=False) as sb,
    ):
        cli = CliAgent(agent, policy=policy, tokenizer=qwen3_tokenizer())
        await sb.exec("chown -R agent: /testbed", user="root")
        await _provide_libraries(sb, await ensure_installed(agent))
        if agent == "qwen-code":
            with pytest.raises(AgentInstallError, match=r"Node\.js"):
                await cli.run(sb, _task())
            return
        outcome = await cli.run(sb, _task())
        content = (await sb.exec(f"cat {FILE}")).output
    assert outcome.exit_code == 0, outcome.output[-3000:]
    assert content == "hello trio\n"
    assert cli.last_gateway.statistics().by_status.get(404, 0) == 0
    session = cli.last_session
    outputs = [t for t in SCRIPTS[agent] if t != "(primer)"]
    assert session.statistics().turns == len(outputs)
    turns = session.turns()
    builder = SampleBuilder()
    for t in turns:
        builder.add(t)
    (sample,) = builder.finish(reward=1.0)
    assert_token_exact(sample, turns, outputs, session.conversations()[0], session.tools()[0])


async def test_cli_on_the_e2b_backend_against_the_envd_test_server(tmp_path: Path) -> None:
    """Claude Code on E2BBackend (envd's API) against trio_swe.testing's envd server, whose
    sandboxes are local processes: they see the agents' cache and the gateway's socket
    directory, so the harness runs as on the local backend (the forwarder relays to the
    socket). A real E2B sandbox sees neither: see docs/gateway.md."""
    from ..e2b.helpers import e2b_backend_for, open_server_in_thread

    agent = "claude-code"
    await ensure_installed(agent)
    image = str(_repo(tmp_path))
    async with (
        scripted_policy(_script(agent)) as (_, policy),
        open_server_in_thread(templates={image: image}) as threaded,
        e2b_backend_for(threaded.server) as backend,
        open_sandbox(backend, image, network=False) as sb,
    ):
        cli = CliAgent(agent, policy=policy, tokenizer=qwen3_tokenizer())
        await sb.exec("chown -R agent: /testbed", user="root")
        outcome = await cli.run(sb, _task())
        content = (await sb.exec(f"cat {FILE}")).output
    assert outcome.exit_code == 0, outcome.output[-3000:]
    assert content == "hello trio\n"
    session = cli.last_session
    outputs = SCRIPTS[agent]
    assert session.statistics().turns == len(outputs)
    turns = session.turns()
    builder = SampleBuilder()
    for t in turns:
        builder.add(t)
    (sample,) = builder.finish(reward=1.0)
    assert_token_exact(sample, turns, outputs, session.conversations()[0], session.tools()[0])
