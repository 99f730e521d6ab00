"""Bad input around real checkpoints: caught at start-up, with the path or variable named;
a prompt that cannot fit never reaches the policy."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

from trio_swe import ConfigError, SweConfig, generate, run_episode
from trio_swe.agents import BashAgent, create_agent
from trio_swe.cli import main
from trio_swe.config import BashAgentOptions
from trio_swe.demo import open_scripted_policy_server
from trio_swe.models import ChatModel
from trio_swe.policy import ByteTokenizer, SGLangPolicy

from ..qwen3 import checkpoint_with_template, qwen3_dir
from ..test_episode_support import build_demo, demo_config


def test_swe_tokenizer_missing_path_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SWE_TOKENIZER") as info:
        SweConfig.from_env({"SWE_TOKENIZER": str(tmp_path / "nope")}, check_protocols=False)
    assert str(tmp_path / "nope") in str(info.value)


def test_swe_tool_parser_unknown_names_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"SWE_TOOL_PARSER.*hermes, qwen3_coder"):
        SweConfig.from_env({"SWE_TOOL_PARSER": "xml"}, check_protocols=False)


def test_registry_agent_speaks_the_configured_checkpoint(tmp_path: Path) -> None:
    config = SweConfig.from_env({"SWE_TOKENIZER": str(qwen3_dir())}, check_protocols=False)
    agent = create_agent(config)
    assert isinstance(agent, BashAgent)
    assert isinstance(agent.tokenizer, ChatModel)
    assert agent.tokenizer.parser.name == "hermes"
    # A checkpoint without a chat template fails when the agent is made, before any episode.
    bare = checkpoint_with_template(tmp_path / "bare", None)
    with pytest.raises(ConfigError, match="no chat template") as info:
        create_agent(SweConfig(bash=BashAgentOptions(tokenizer=str(bare))))
    assert str(bare) in str(info.value)


def test_demo_with_a_missing_tokenizer_exits_with_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "ckpt"
    assert main(["demo", "--no-progress", "--tokenizer", str(missing)]) == 2
    out = capsys.readouterr().out
    assert "error:" in out
    assert str(missing) in out.replace("\n", "")


def test_generate_with_a_missing_hf_checkpoint_raises(tmp_path: Path) -> None:
    args = SimpleNamespace(hf_checkpoint=str(tmp_path / "gone"))
    sample = SimpleNamespace(prompt="", metadata={}, session_id=None)
    with pytest.raises(ConfigError, match="hf_checkpoint"):
        asyncio.run(generate(args, sample, {}))


async def test_huge_problem_statement_never_reaches_the_policy(tmp_path: Path) -> None:
    # issue 9 item 12: 20 MB of problem statement, byte tokens (the text dialect).
    demo, mds, backend = build_demo(tmp_path)
    calc = next(md for md in mds if md.instance_id == "demo__calc-1")
    import msgspec

    huge = msgspec.structs.replace(calc, problem_statement="x" * (20 * 1024 * 1024))
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        result = await run_episode(
            huge, agent, backend=backend, config=demo_config(), network=False
        )
        # With a context cap, a statement under the default cap but over this one: exact count.
        capped = demo_config(max_context_tokens=600)
        small = msgspec.structs.replace(calc, problem_statement="y" * 700)
        result2 = await run_episode(small, agent, backend=backend, config=capped, network=False)
        assert server.statistics().generations == 0
    assert result.status == "aborted"
    assert result.abort_reason == "prompt_too_long"
    assert "not tokenized" in (result.error or "")
    assert result.samples == []
    assert result2.abort_reason == "prompt_too_long"
    assert "limit is 600" in (result2.error or "")


def test_agent_needs_the_bash_tool_declared() -> None:
    from trio_swe import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="bash tool"):
        BashAgent(SGLangPolicy("http://127.0.0.1:9"), ChatModel.from_checkpoint(qwen3_dir()))
