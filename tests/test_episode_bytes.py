"""A patch is bytes end to end: text that is not UTF-8 is graded as written (issue 9, item 7)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from trio_swe import run_episode
from trio_swe.agents import BashAgent
from trio_swe.demo import open_scripted_policy_server
from trio_swe.grading import get_metadata, run_evaluation
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.results import encode_result, read_results

from .test_episode_support import assert_nothing_left, build_demo, demo_config

# Solved only when menu.txt holds the Latin-1 bytes (a U+FFFD in their place fails).
EVAL_CMD = "python3 -c \"import sys; sys.exit(open('menu.txt','rb').read() != b'caf\\xe9\\n')\""
SCRIPT = [
    "Write the menu in Latin-1.\n```bash\nprintf 'caf\\351\\n' > menu.txt\n```",
    "Done.\n```bash\nsubmit\n```",
]


async def test_latin1_change_scores_like_the_same_change_graded_directly(tmp_path: Path) -> None:
    demo, _, backend = build_demo(tmp_path)
    row = msgspec.json.decode(msgspec.json.encode(demo.rows[0]))
    row["metadata"]["eval_cmd"] = EVAL_CMD
    md = get_metadata(row, "scaleswe")
    async with (
        open_scripted_policy_server({md.instance_id: SCRIPT}) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        result = await run_episode(md, agent, backend=backend, config=demo_config(), network=False)
    assert result.status == "completed", result.error
    assert b"+caf\xe9\n" in result.patch
    assert "+caf\ufffd" in result.patch_text  # the text view is for reading only
    assert result.reward == 1.0, result.eval_result
    direct = await run_evaluation(backend, md, result.patch, timeout_sec=60)
    assert direct.reward == 1.0
    # Stored and read back, the bytes are unchanged.
    (tmp_path / "results.bin").write_bytes(encode_result(result))
    [stored], _ = read_results(tmp_path / "results.bin")
    assert stored.patch == result.patch
    assert_nothing_left(tmp_path, backend)
