"""The same episodes on the e2b backend, against trio_swe.testing's envd-compatible server.

Each instance image is served as an E2B template of the same name (a real local sandbox behind
envd's process and file APIs over HTTP/2), so the episode runs through the E2B client unchanged.
"""

from __future__ import annotations

from pathlib import Path

from trio_swe import run_episode
from trio_swe.agents import BashAgent
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.sandbox.local import LocalBackend
from trio_swe.testing import open_envd_server, open_scripted_policy_server

from .e2b.helpers import e2b_backend_for
from .test_episode_support import (
    assert_sample_matches_script,
    build_demo,
    demo_config,
    script_text,
)


async def test_demo_episodes_on_the_e2b_backend(tmp_path: Path) -> None:
    demo, mds, _ = build_demo(tmp_path)
    local = LocalBackend(state_dir=tmp_path / "state")
    picked = [md for md in mds if md.instance_id in ("demo__calc-1", "demo__fizz-1")]
    async with (
        open_envd_server(backend=local, templates={md.image: md.image for md in picked}) as server,
        e2b_backend_for(server) as backend,
        open_scripted_policy_server(demo.scripts) as policy_server,
        SGLangPolicy(policy_server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        for md in picked:
            result = await run_episode(md, agent, backend=backend, config=demo_config())
            assert result.status == "completed", (md.instance_id, result.error)
            assert result.reward == demo.expected_rewards[md.instance_id]
            assert result.boot_attempts == 2
            script = [script_text(c) for c in demo.scripts[md.instance_id]]
            assert_sample_matches_script(result.samples[0], script)
    assert local.statistics().live == 0
