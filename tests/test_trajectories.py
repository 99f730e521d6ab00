"""Per-episode trajectories: turns read back from samples, and the files of ``run --trajectories``."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import trio

from trio_swe import EpisodeResult, SampleBuilder, TurnRecord
from trio_swe.demo import build_demo_set, open_scripted_policy_server
from trio_swe.results import read_results
from trio_swe.trajectories import (
    TRAJECTORY_FORMAT,
    TrajectoryWriter,
    episode_messages,
    episode_trajectory,
    load_turn_text,
    trajectory_file_name,
)

from .qwen3 import qwen3_dir
from .report.runs import TRIO_SWE, env


def _result(samples: list[object], **kw: object) -> EpisodeResult:
    fields: dict[str, object] = {
        "instance_id": "repo__x-1",
        "episode_id": "repo/x-1#abc",
        "protocol": "scaleswe",
        "status": "completed",
        "samples": samples,
        **kw,
    }
    return EpisodeResult(**fields)  # type: ignore[arg-type]


def _text(s: str) -> list[int]:
    return list(s.encode())


def test_turns_come_back_in_order_with_masks_log_probs_and_tool_calls() -> None:
    # Three turns of the bash agent's text dialect; the second is ill-formed (no block) and
    # masked: its tokens stay in place with mask 0 and their log-probs, and read as a turn.
    prompt = _text("<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n")
    outs = [
        "Look.\n```bash\nls\n```<|im_end|>",
        "I am not sure.<|im_end|>",
        "Done.\n```bash\nsubmit\n```<|im_end|>",
    ]
    observations = [
        "\n<|im_start|>user\na.py\n<|im_end|>\n<|im_start|>assistant\n",
        "\n<|im_start|>user\nreply with one block\n<|im_end|>\n<|im_start|>assistant\n",
    ]
    builder = SampleBuilder()
    history = list(prompt)
    for i, out in enumerate(outs):
        ids = _text(out)
        builder.add(
            TurnRecord.from_lists(
                prompt_ids=history,
                output_ids=ids,
                output_log_probs=[-0.5 - i] * len(ids),
                ill_formed=i == 1,
            )
        )
        history += ids + (_text(observations[i]) if i < len(observations) else [])
    (sample,) = builder.finish(reward=1.0)
    result = _result([sample], n_turns=3)

    messages = episode_messages(result, load_turn_text("bytes"))
    assert [m.role for m in messages] == [
        "prompt",
        "assistant",
        "observation",
        "assistant",
        "observation",
        "assistant",
    ]
    assert [m.turn for m in messages if m.role == "assistant"] == [0, 1, 2]
    assert [m.kind for m in messages if m.role == "assistant"] == ["start", "clean", "clean"]
    assert [m.text for m in messages if m.role == "assistant"] == outs
    assert [m.text for m in messages if m.role == "observation"] == observations
    first, ill, last = (m for m in messages if m.role == "assistant")
    assert first.tool_calls == [{"name": "bash", "arguments": {"command": "ls"}}]
    assert ill.tool_calls == []
    assert last.tool_calls == [{"name": "bash", "arguments": {"command": "submit"}}]
    assert first.loss_mask == [1] * len(outs[0])
    assert ill.loss_mask == [0] * len(outs[1])  # masked, still its own turn
    assert ill.log_probs == [-1.5] * len(outs[1])
    # Every token, once, in order.
    assert [t for m in messages for t in m.token_ids] == sample.tokens_list()

    # Without a tokenizer: ids only.
    bare = episode_messages(result)
    assert [m.token_ids for m in bare] == [m.token_ids for m in messages]
    assert all(m.text is None and m.tool_calls is None for m in bare)


def test_a_forked_chain_gives_one_prompt_per_sample_and_counts_turns_across() -> None:
    builder = SampleBuilder(fork_threshold_tokens=1)
    builder.add(TurnRecord.from_lists(prompt_ids=[1, 2], output_ids=[3], output_log_probs=[-1]))
    # A rewritten history: a new sample.
    builder.add(
        TurnRecord.from_lists(prompt_ids=[9, 9], output_ids=[4, 5], output_log_probs=[-1, -2])
    )
    samples = builder.finish(reward=0.0)
    assert len(samples) == 2
    messages = episode_messages(_result(samples))
    assert [(m.role, m.sample, m.turn, m.kind) for m in messages] == [
        ("prompt", 0, None, None),
        ("assistant", 0, 0, "start"),
        ("prompt", 1, None, None),
        ("assistant", 1, 1, "fork"),
    ]


def test_the_checkpoint_tokenizer_reads_its_own_tool_calls() -> None:
    text = load_turn_text(str(qwen3_dir()))
    call = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
    assert text.tool_calls(call + "<|im_end|>") == [
        {"name": "bash", "arguments": {"command": "ls -la"}}
    ]
    assert text.decode([151644]) == "<|im_start|>"


def test_an_aborted_episode_is_a_trajectory_without_messages() -> None:
    result = _result(
        [],
        status="aborted",
        abort_reason="policy_error",
        error="PolicyError: unreachable",
        started_at=1.5,
    )
    doc = episode_trajectory(result)
    assert doc["trajectory_format"] == TRAJECTORY_FORMAT
    assert doc["messages"] == []
    assert doc["info"]["status"] == "aborted"
    assert doc["info"]["error"] == "PolicyError: unreachable"
    assert doc["info"]["started_at"] == 1.5
    assert trajectory_file_name(result) == "repo_x-1_abc.traj.json"


def test_writer_writes_one_whole_file_per_episode(tmp_path: Path) -> None:
    writer = TrajectoryWriter(tmp_path / "traj")
    path = writer.write(_result([], patch=b"diff --git a/x b/x\n"))
    assert Path(path).name == "repo_x-1_abc.traj.json"
    assert json.loads(Path(path).read_text())["info"]["submission"] == "diff --git a/x b/x\n"
    assert sorted(p.name for p in (tmp_path / "traj").iterdir()) == ["repo_x-1_abc.traj.json"]


@pytest.mark.slow
async def test_run_writes_a_trajectory_per_episode(tmp_path: Path) -> None:
    demo = build_demo_set(tmp_path / "repos")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(row) + "\n" for row in demo.rows[:3]))
    out, traj = tmp_path / "results.msgpack", tmp_path / "traj"
    async with open_scripted_policy_server(demo.scripts) as server:
        cmd = [
            TRIO_SWE, "run", str(rows), "--out", str(out), "--no-progress", "--no-network",
            "--policy-url", server.url, "--concurrency", "2", "--agent-budget", "8",
            "--eval-timeout", "60", "--trajectories", str(traj),
        ]  # fmt: skip
        done = await trio.run_process(
            cmd,
            env=env(tmp_path),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    results, _ = read_results(out)
    assert len(results) == 3
    files = sorted(traj.iterdir())
    assert [p.name for p in files] == sorted(trajectory_file_name(r) for r in results)
    for r in results:
        doc = json.loads((traj / trajectory_file_name(r)).read_text())
        assert doc["instance_id"] == r.instance_id
        assert doc["info"]["reward"] == r.reward == demo.expected_rewards[r.instance_id]
        assert doc["info"]["submission"] == r.patch_text
        assert doc["info"]["timings"]["total"] == pytest.approx(r.timings.total)
        assert doc["info"]["started_at"] == r.started_at is not None
        turns = [m for m in doc["messages"] if m["role"] == "assistant"]
        assert len(turns) == r.n_turns
        # The byte tokenizer of a run without SWE_TOKENIZER decodes them: the script's text.
        assert turns[-1]["tool_calls"] == [{"name": "bash", "arguments": {"command": "submit"}}]
        assert "```bash" in turns[0]["text"]
        tokens = [t for m in doc["messages"] for t in m["token_ids"]]
        assert tokens == r.samples[0].tokens_list()
    assert msgspec.json.decode((traj / files[0].name).read_bytes())  # valid JSON
