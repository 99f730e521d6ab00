"""AgentTask.deadline(): the one place the agent budget becomes a deadline."""

from __future__ import annotations

import trio
import trio.testing

from trio_swe.agents import AgentTask


def _task(**kw: object) -> AgentTask:
    return AgentTask(
        instance_id="i",
        session_id="s",
        problem_statement="p",
        workdir="/testbed",
        problem_statement_path="/testbed/P.md",
        time_budget_sec=30.0,
        **kw,  # type: ignore[arg-type]
    )


async def test_the_deadline_counts_from_when_the_episode_handed_the_task_over(
    mock_clock: trio.testing.MockClock,
) -> None:
    handed = trio.current_time()
    task = _task(started_at=handed)
    mock_clock.jump(12.0)  # an agent that installs first still ends with the episode's budget
    assert task.deadline() == handed + 30.0
    assert _task().deadline() == trio.current_time() + 30.0  # no episode: from now
