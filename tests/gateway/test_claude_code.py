"""Claude Code (the real CLI from npm, pinned) in a local sandbox without a network, through the
gateway and the scripted policy on Qwen3's tokenizer: an episode of the demo, token-exact."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe import run_episode
from trio_swe.agents._cli import CliAgent
from trio_swe.agents._install import ensure_installed
from trio_swe.demo import DEMO_INSTANCES
from trio_swe.demo._cli_scripts import cli_script

from ..test_episode_support import build_demo, demo_config
from ._support import assert_token_exact, qwen3_tokenizer, scripted_policy


@pytest.mark.slow
async def test_claude_code_demo_episode_is_token_exact(tmp_path: Path) -> None:
    await ensure_installed("claude-code")  # cached by scripts/bootstrap; installs if missing
    _, mds, backend = build_demo(tmp_path)
    inst = next(i for i in DEMO_INSTANCES if i.instance_id == "demo__calc-1")
    md = next(m for m in mds if m.instance_id == inst.instance_id)
    script = cli_script("claude-code", inst)
    async with scripted_policy({inst.instance_id: script}) as (server, policy):
        agent = CliAgent("claude-code", policy=policy, tokenizer=qwen3_tokenizer())
        result = await run_episode(
            md,
            agent,
            backend=backend,
            config=demo_config(agent_time_budget_sec=120.0, max_context_tokens=32768),
            sampling_params={"max_new_tokens": 1024, "temperature": 1.0},
        )
    assert result.status == "completed", (result.abort_reason, result.error, result.agent_output)
    assert result.agent_exit_code == 0, result.agent_output
    assert result.reward == 1.0  # the script reads, fixes and tests calc.py through Bash
    session = agent.last_session
    stats = session.statistics()
    # One chain, every later request a clean append (Claude Code's replays matched ours).
    assert (stats.chains, stats.forks, stats.turns, stats.appended) == (1, 0, 4, 3)
    # Its history resent each turn is not parsed again: a request parses its new messages
    # and the one it moved its cache_control marker off (measured: 11 parsed, 7 reused).
    assert stats.reused_messages >= stats.requests - 1
    assert result.n_turns == 4
    assert len(result.samples) == 1
    sample = result.samples[0]
    assert sample.metadata["trajectory"]["turn_kinds"] == ["start", "clean", "clean", "clean"]
    assert sample.reward == 1.0
    texts = [c if isinstance(c, str) else c.text for c in script]
    assert_token_exact(
        sample,
        session.turns(),
        texts,
        session.conversations()[0],
        session.tools()[0],
    )
    # The tools the template saw are Claude Code's four (--tools Bash,Read,Edit,Write).
    names = sorted(t["function"]["name"] for t in session.tools()[0])
    assert names == ["Bash", "Edit", "Read", "Write"]
    assert server.statistics().generations == 4
    # Its billing header line (a system block of its own) is neither rendered nor trained.
    prompt = qwen3_tokenizer().decode(session.turns()[0].prompt_ids_list())
    assert "x-anthropic-billing-header" not in prompt
    assert "Claude" in prompt
