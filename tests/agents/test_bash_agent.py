"""The bash agent loop: append-only token history, ill-formed turns, turn and context limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe import open_sandbox
from trio_swe.agents import AgentTask, BashAgent, parse_command
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing import open_scripted_policy_server, scripted_logprob

TOK = ByteTokenizer()


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ("look\n```bash\nls -la\n```", "ls -la"),
        ("```sh\nsubmit\n```", "submit"),
        ("```\necho hi\n```", "echo hi"),
        ("no block at all", None),
        ("```bash\n\n```", None),
        ("```bash\nls\n```\nand\n```bash\npwd\n```", None),  # one command per turn
    ],
)
def test_parse_command(text: str, command: str | None) -> None:
    assert parse_command(text) == command


def _task(iid: str, *, budget: float = 30.0, cap: int = 0) -> AgentTask:
    return AgentTask(
        instance_id=iid,
        session_id=f"{iid}#1",
        problem_statement="Make it work.",
        workdir="/testbed",
        problem_statement_path="/testbed/PROBLEM_STATEMENT.md",
        time_budget_sec=budget,
        max_context_tokens=cap,
    )


async def test_turns_are_append_only_and_limits_end_the_run(
    make_git_repo: object, tmp_path: Path
) -> None:
    repo, commit = make_git_repo({"a.txt": "alpha\n"})  # type: ignore[operator]
    scripts = {
        "loop": ["```bash\necho one >> a.txt\n```", "thinking only", "```bash\ncat a.txt\n```"] * 3,
        "long": ["```bash\nseq 1 5000\n```"] * 10,
    }
    async with (
        open_scripted_policy_server(scripts) as server,
        SGLangPolicy(server.url) as policy,
        open_sandbox(LocalBackend(state_dir=tmp_path / "state"), f"{repo}@{commit}") as sb,
    ):
        await sb.exec("chown -R agent: /testbed", user="root")
        agent = BashAgent(policy, TOK, max_turns=3, observation_max_chars=200)
        out = await agent.run(sb, _task("loop"))
        assert out.finish == "turn_limit"
        assert out.exit_code == 1
        assert [t.ill_formed for t in out.turns] == [False, True, False]
        assert out.n_commands == 2
        # Each prompt is the previous prompt + the exact sampled ids + the observation.
        for before, after in zip(out.turns, out.turns[1:], strict=False):
            prefix = before.prompt_ids_list() + before.output_ids_list()
            assert after.prompt_ids_list()[: len(prefix)] == prefix
        for turn in out.turns:
            ids = turn.output_ids_list()
            lps = turn.output_log_probs_list()
            assert lps is not None
            assert all(
                abs(lp - scripted_logprob(t, i)) < 1e-6
                for i, (t, lp) in enumerate(zip(ids, lps, strict=True))
            )
        # The observation of `cat a.txt` shows the command's effect.
        last_prompt = TOK.decode(out.turns[-1].prompt_ids_list())
        assert "Format error" in last_prompt
        assert (await sb.read_file("/testbed/a.txt")) == b"alpha\none\n"

        # A context cap ends the run before the prompt outgrows it; output is cut to fit.
        long_agent = BashAgent(policy, TOK, max_turns=10, observation_max_chars=100000)
        out = await long_agent.run(sb, _task("long", cap=6000))
        assert out.finish == "context_limit"
        assert out.exit_code == 1
        assert all(len(t.prompt_ids) + len(t.output_ids) <= 6000 for t in out.turns)
        # The observation was kept in full up to observation_max_chars, so one turn filled it.
        assert len(out.turns) == 1
