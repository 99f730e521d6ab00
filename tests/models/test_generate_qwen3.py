"""slime's generate() on a real checkpoint: Qwen3's tokenizer from ``args.hf_checkpoint``, the
scripted policy playing the demo scripts as Qwen3 tool calls, called from asyncio as slime
calls it. Rewards as scripted, samples valid under slime's own assertions, permanent failures
``FAILED`` and transient ones ``ABORTED``."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from trio_swe import Sample, aio, generate
from trio_swe.agents import BashAgent, parse_command
from trio_swe.demo import build_demo_set, open_scripted_policy_server
from trio_swe.demo._policy_server import model_format
from trio_swe.models import ChatModel
from trio_swe.testing import ScriptedCompletion, scripted_logprob

from ..qwen3 import qwen3_dir
from ..test_episode_support import script_text, trained_runs
from ..test_rollout_generate import SlimeLikeSample


def slime_assertions(s: SlimeLikeSample) -> None:
    """What slime's _convert_samples_to_train_data and Sample.append_response_tokens check."""
    assert s.loss_mask is not None
    assert s.rollout_log_probs is not None
    assert len(s.loss_mask) == s.response_length
    assert len(s.rollout_log_probs) == s.response_length
    assert 0 < s.response_length <= len(s.tokens)
    assert set(s.loss_mask) <= {0, 1}


@pytest.mark.slow
def test_generate_on_qwen3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWE_AGENT_TIME_BUDGET_SEC", "8")
    monkeypatch.setenv("SWE_EVAL_TIMEOUT_SEC", "60")
    monkeypatch.setenv("SWE_MAX_TURNS", "10")
    monkeypatch.delenv("SWE_TOKENIZER", raising=False)
    demo = build_demo_set(tmp_path / "repos")
    rows = {row["label"]: row for row in demo.rows}
    scripts: dict[str, Any] = dict(demo.scripts)
    # A policy that answers with ids outside the vocabulary (151936 is Qwen3's embedding size).
    oov = copy.deepcopy(rows["demo__calc-1"])
    oov["label"] = oov["metadata"]["instance_id"] = "demo__oov-1"
    scripts["demo__oov-1"] = [ScriptedCompletion("", token_ids=(1000, 151936))]
    huge = copy.deepcopy(rows["demo__calc-1"])
    huge["metadata"]["problem_statement"] = "add() is wrong. " * (20 * 1024 * 1024 // 16)
    ungradable = copy.deepcopy(rows["demo__calc-1"])
    del ungradable["metadata"]["eval_cmd"]
    no_image = copy.deepcopy(rows["demo__calc-1"])
    no_image["metadata"]["image"] = str(tmp_path / "no-such-image")
    bad_workdir = copy.deepcopy(rows["demo__calc-1"])
    bad_workdir["metadata"]["workdir"] = "/usr"  # can never boot: PermanentBootError
    model = ChatModel.from_checkpoint(qwen3_dir(), tools=BashAgent.TOOLS)

    def sample_of(row: dict[str, Any]) -> SlimeLikeSample:
        row = copy.deepcopy(row)
        return SlimeLikeSample(prompt=row["prompt"], label=row["label"], metadata=row["metadata"])

    async def serve(port: asyncio.Future[Any]) -> None:
        async with open_scripted_policy_server(scripts, tokenizer=model) as server:
            port.set_result(server)
            await trio.sleep_forever()

    async def main() -> tuple[dict[str, Any], dict[str, Any], int, int]:
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        serving = asyncio.ensure_future(aio.run(serve, ready))
        server = await ready
        args = SimpleNamespace(
            sglang_router_ip="127.0.0.1",
            sglang_router_port=server.port,
            hf_checkpoint=str(qwen3_dir()),
            rollout_max_context_len=32768,
        )
        params = {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 1024}
        names = sorted(demo.expected_rewards)
        out = await asyncio.gather(
            *(generate(args, sample_of(rows[n]), params) for n in names),
            generate(args, sample_of(rows["demo__words-1"]), params, evaluation=True),
            generate(args, sample_of(oov), params),
        )
        before = server.statistics().generations
        bad = await asyncio.gather(
            generate(args, sample_of(huge), params),
            generate(args, sample_of(ungradable), params),
            generate(args, sample_of(no_image), params),
            generate(args, sample_of(bad_workdir), params),
        )
        after = server.statistics().generations
        seen.extend(server.sampling_params_seen)
        serving.cancel()
        try:
            await serving
        except asyncio.CancelledError:
            pass
        results = dict(zip([*names, "eval", "oov"], out, strict=True))
        return (
            results,
            dict(zip(["huge", "ungradable", "no_image", "bad_workdir"], bad, strict=True)),
            before,
            after,
        )

    seen: list[dict[str, Any]] = []
    results, bad, before, after = asyncio.run(main())
    # The trainer's sampling parameters reach every policy call, over the agent's defaults
    # (max_new_tokens only ever clipped to the room left under the context cap).
    assert seen
    assert all(p["temperature"] == 0.7 and p["top_p"] == 1.0 for p in seen)
    assert all(p["max_new_tokens"] <= 1024 for p in seen)
    S = SlimeLikeSample.Status
    for iid, expected in demo.expected_rewards.items():
        (s,) = results[iid]  # one sample per episode: the agent never forks on its own turns
        assert s.reward == expected, (iid, s.metadata)
        assert not s.remove_sample
        slime_assertions(s)
        assert s.status is S.COMPLETED  # no output was cut by max_new_tokens
        assert s.metadata["episode_status"] == (
            "truncated" if iid in demo.timeouts else "completed"
        )
        assert s.metadata["trajectory"]["turn_kinds"][1:] == ["clean"] * (
            len(s.metadata["trajectory"]["turn_kinds"]) - 1
        )
        # Trained tokens: exactly the Qwen3 text of each well-formed scripted turn, each with
        # its own log-prob; the response text is the Qwen3 decoding of the response region.
        back = Sample.from_slime_dict(vars(s))
        tokens, lps = back.tokens_list(), back.rollout_log_probs_list()
        start = back.prompt_length
        runs = [[tokens[start + i] for i in run] for run in trained_runs(back)]
        played = [script_text(c) for c in demo.scripts[iid]][: len(runs) + 1]
        expected_runs = [model.encode(model_format(model, t)) for t in played if parse_command(t)]
        assert runs == expected_runs[: len(runs)], iid
        for run in trained_runs(back):
            for j, i in enumerate(run):
                assert lps[i] == pytest.approx(scripted_logprob(tokens[start + i], j), abs=1e-6)
        assert s.response == model.decode(tokens[start:])
        assert "<tool_call>" in s.response
        assert ("<tool_response>" in s.response) == (len(runs) > 1 or iid == "demo__median-1")
        assert model.decode(tokens[:start]).count("<|im_start|>assistant\n") == 1
    # The ill-formed turn (prose, no tool call) is kept as sampled, masked, nothing shifted.
    median = Sample.from_slime_dict(vars(results["demo__median-1"][0]))
    first = model.encode(model_format(model, script_text(demo.scripts["demo__median-1"][0])))
    region = median.tokens_list()[median.prompt_length :]
    assert region[: len(first)] == first
    assert median.loss_mask_list()[: len(first)] == [0] * len(first)
    assert median.metadata["trajectory"]["ill_formed_turns"] == 1

    (evaluated,) = results["eval"]
    assert (evaluated.reward, evaluated.status, evaluated.remove_sample) == (1.0, S.COMPLETED, True)
    # A transient failure (the policy) is ABORTED: slime may retry it.
    (oov_s,) = results["oov"]
    assert oov_s.status is S.ABORTED
    assert oov_s.remove_sample
    assert oov_s.metadata["abort_reason"].startswith("policy_error:")
    assert "151936" in oov_s.metadata["abort_reason"]
    assert "outside the tokenizer's vocabulary" in oov_s.metadata["abort_reason"]
    # Permanent ones are FAILED, and the 20 MB statement never reached the policy.
    (huge_s,) = bad["huge"]
    assert huge_s.status is S.FAILED
    assert huge_s.metadata["abort_reason"].startswith("prompt_too_long:")
    assert "not tokenized" in huge_s.metadata["abort_reason"]
    assert after == before
    (ungradable_s,) = bad["ungradable"]
    assert ungradable_s.status is S.FAILED
    assert ungradable_s.metadata["abort_reason"].startswith("unevaluable")
    (no_image_s,) = bad["no_image"]
    assert no_image_s.status is S.FAILED
    assert no_image_s.metadata["abort_reason"].startswith("unevaluable:image")
    (bad_workdir_s,) = bad["bad_workdir"]
    assert bad_workdir_s.status is S.FAILED
    assert bad_workdir_s.metadata["abort_reason"].startswith("boot_failed:PermanentBootError")
