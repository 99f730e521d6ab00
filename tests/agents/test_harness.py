"""The npm harness: install a CLI from a local npm tarball in a local sandbox without network."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from trio_swe import ConfigError, SweConfig, open_sandbox
from trio_swe.agents import (
    AgentInstallError,
    AgentTask,
    NpmCliAgent,
    available_agents,
    create_agent,
    install_npm_cli,
    register_agent,
)
from trio_swe.sandbox.local import LocalBackend

PREFIX = "/tmp/npm-prefix"

# Fails the first time it runs in a sandbox, then passes: a forced first failure.
FLAKY_CHECK = (
    "if [ ! -e /tmp/attempted ]; then touch /tmp/attempted; echo 'forced failure'; exit 1; fi; "
    f"{PREFIX}/bin/hello-cli --version"
)


@pytest.fixture
async def tarball(tmp_path: Path) -> Path:
    """A tiny CLI packed with ``npm pack`` (no dependencies, so no registry is needed)."""
    pkg = tmp_path / "hello-cli"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "package.json").write_text(
        json.dumps({"name": "hello-cli", "version": "1.2.3", "bin": {"hello-cli": "bin/hello.js"}})
    )
    (pkg / "bin" / "hello.js").write_text(
        "#!/usr/bin/env node\n"
        "if (process.argv[2] === '--version') { console.log('1.2.3'); process.exit(0); }\n"
        "require('fs').writeFileSync('edited.txt', process.argv.slice(2).join(' '));\n"
        "console.log('hello from cli: ' + process.argv.slice(2).join(' '));\n"
    )
    env = {**os.environ, "npm_config_cache": str(tmp_path / "npm-cache")}
    done = await trio.run_process(
        ["npm", "pack", "--silent", "--pack-destination", str(tmp_path)],
        cwd=pkg,
        env=env,
        capture_stdout=True,
        capture_stderr=True,
    )
    name = done.stdout.decode().strip().splitlines()[-1]
    return tmp_path / name


async def test_install_retries_after_a_forced_first_failure(
    tarball: Path, make_git_repo: object, tmp_path: Path
) -> None:
    repo, commit = make_git_repo({"README.md": "hi\n"})  # type: ignore[operator]
    backend = LocalBackend(state_dir=tmp_path / "state")
    async with open_sandbox(backend, f"{repo}@{commit}", network=False) as sb:
        attempts = await install_npm_cli(
            sb, tarball, check_cmd=FLAKY_CHECK, prefix=PREFIX, retries=3, backoff_sec=0.01
        )
        assert attempts == 2
        version = await sb.exec(f"{PREFIX}/bin/hello-cli --version", user="agent")
        assert version.output.strip() == "1.2.3"
    assert backend.statistics().live == 0


async def test_every_attempt_failing_raises_with_the_log_tail(
    tarball: Path, make_git_repo: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPM_INSTALL_RETRIES", "2")
    monkeypatch.setenv("NPM_INSTALL_BACKOFF_SEC", "0.01")
    repo, commit = make_git_repo({"README.md": "hi\n"})  # type: ignore[operator]
    backend = LocalBackend(state_dir=tmp_path / "state")
    async with open_sandbox(backend, f"{repo}@{commit}", network=False) as sb:
        with pytest.raises(AgentInstallError, match="after 2 attempts") as info:
            await install_npm_cli(
                sb, tarball, check_cmd="echo 'check says no'; exit 4", prefix=PREFIX
            )
        assert "check says no" in str(info.value)
        assert "exit=4" in str(info.value)


async def test_npm_cli_agent_runs_as_the_agent_user_and_keeps_its_output(
    tarball: Path, make_git_repo: object, tmp_path: Path
) -> None:
    repo, commit = make_git_repo({"README.md": "hi\n"})  # type: ignore[operator]
    backend = LocalBackend(state_dir=tmp_path / "state")
    agent = NpmCliAgent(
        "hello",
        package=tarball,
        check_cmd="hello-cli --version",
        start_cmd="whoami && hello-cli {prompt}",
        prefix=PREFIX,
        install_backoff_sec=0.01,
    )
    async with open_sandbox(backend, f"{repo}@{commit}", network=False) as sb:
        await sb.exec("chown -R agent: /testbed", user="root")
        task = AgentTask(
            instance_id="x",
            session_id="x#1",
            problem_statement="fix it",
            workdir="/testbed",
            problem_statement_path="/testbed/PROBLEM_STATEMENT.md",
            time_budget_sec=60,
            prompt="fix it; now",
        )
        outcome = await agent.run(sb, task)
        assert outcome.exit_code == 0
        assert outcome.finish == "exited"
        assert outcome.output.splitlines()[0] == "agent"
        assert "hello from cli: fix it; now" in outcome.output
        assert outcome.turns == []
        edited = await sb.read_file("/testbed/edited.txt")
        assert edited == b"fix it; now"


def test_registry_selects_by_name_and_is_extendable() -> None:
    assert {"bash", "npm-cli"} <= set(available_agents())
    config = SweConfig(agent="bash")
    assert create_agent(config).name == "bash"
    with pytest.raises(ConfigError, match="SWE_AGENT='nope'"):
        create_agent(SweConfig(agent="nope"))
    made = []

    def factory(cfg: SweConfig) -> NpmCliAgent:
        made.append(cfg)
        return NpmCliAgent("mine", package="/nonexistent.tgz", check_cmd="true", start_cmd="true")

    register_agent("test-mine", factory, replace=True)
    assert create_agent(SweConfig(agent="test-mine")).name == "mine"
    assert made == [SweConfig(agent="test-mine")]
