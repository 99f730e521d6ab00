"""The bash agent's tools dialect on Qwen3's real tokenizer and template, end to end on the
local backend: the demo CLI, and the edit tool with several calls in one turn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import trio

from trio_swe import EpisodeResult, run_episode
from trio_swe.agents import BashAgent
from trio_swe.demo import open_scripted_policy_server
from trio_swe.models import ChatModel
from trio_swe.policy import SGLangPolicy

from ..qwen3 import qwen3_dir
from ..test_cli import TRIO_SWE, _assert_no_sandboxes, _env
from ..test_episode_support import assert_nothing_left, build_demo, demo_config


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("TRIO_SWE_MODELS_FULL") != "1",
    reason="the 8 demo episodes again, through the CLI (generate() plays them on Qwen3 in the "
    "default run); nox -s models or TRIO_SWE_MODELS_FULL=1",
)
async def test_demo_cli_on_the_qwen3_tokenizer(tmp_path: Path) -> None:
    result = await trio.run_process(
        [TRIO_SWE, "demo", "--no-progress", "--tokenizer", str(qwen3_dir())],
        env=_env(tmp_path),
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    assert "hermes tool calls" in out.replace("\n", "")
    assert "8/8 episodes earned the reward their script plays for" in out
    _assert_no_sandboxes(tmp_path)


def _call(name: str, **arguments: str) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


async def _play_calc(tmp_path: Path, script: list[str]) -> tuple[EpisodeResult, ChatModel, str]:
    """``demo__calc-1`` played by ``script`` on Qwen3's template: the episode's result, the
    model, and the text of its one sample's response region. Nothing is left behind."""
    demo, mds, backend = build_demo(tmp_path)
    calc = next(md for md in mds if md.instance_id == "demo__calc-1")
    model = ChatModel.from_checkpoint(qwen3_dir(), tools=BashAgent.TOOLS)
    async with (
        open_scripted_policy_server({"demo__calc-1": script}, tokenizer=model) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, model, max_turns=10)
        result = await run_episode(
            calc, agent, backend=backend, config=demo_config(), network=False
        )
    assert result.status == "completed", result.error
    assert (result.reward, result.agent_finish, result.n_turns) == (1.0, "submitted", 3)
    assert result.patch_text == demo.gold_patches["demo__calc-1"]
    (sample,) = result.samples
    assert sample.metadata["trajectory"]["ill_formed_turns"] == 0
    assert_nothing_left(tmp_path, backend)
    return result, model, model.decode(sample.tokens_list()[sample.prompt_length :])


async def test_edit_tool_and_several_calls_in_one_turn(tmp_path: Path) -> None:
    result, _, region = await _play_calc(
        tmp_path,
        [
            "<think>\n`add` subtracts.\n</think>\n\n"
            + _call("edit_file", path="calc.py", old_text="return a - b", new_text="return a + b"),
            "<think>\nTest it, and try an edit that cannot apply.\n</think>\n\n"
            + _call("bash", command="python3 test_calc.py")
            + "\n"
            + _call("edit_file", path="calc.py", old_text="no such text", new_text="x"),
            "<think>\nDone.\n</think>\n\n" + _call("bash", command="submit"),
        ],
    )
    assert "edited calc.py" in region
    assert "all tests passed" in region
    assert "old_text occurs 0 times in calc.py" in region
    # Two calls, two tool results in one user turn, as the template renders them.
    assert region.count("<tool_response>") == 3
    (sample,) = result.samples
    assert sample.metadata["trajectory"]["turn_kinds"] == ["start", "clean", "clean"]


async def test_a_command_no_sandbox_can_run_is_an_observation(tmp_path: Path) -> None:
    # A tool call's "\\u0000" decodes to a NUL: exec refuses it (InvalidArgumentError), which
    # ended the episode; the model now reads why, and the episode goes on.
    _, _, region = await _play_calc(
        tmp_path,
        [
            _call("bash", command="echo a\x00b"),
            _call("edit_file", path="calc.py", old_text="return a - b", new_text="return a + b"),
            _call("bash", command="submit"),
        ],
    )
    assert "Error: cmd must not contain NUL characters" in region
