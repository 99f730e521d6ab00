"""A SWE-bench row graded in a SWE-bench-shaped Docker image, with no shims.

The image (tests/dockerenv.py) carries its own ``/opt/miniconda3/bin/activate`` and ``testbed``
env, and the calc repository at ``/testbed`` in an instance layer over base and env layers, as
``swebench/sweb.eval.x86_64.*`` images do. swebench's own eval script runs in it unchanged.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from trio_swe.grading import EvalResult, InstanceMetadata, get_metadata, run_evaluation
from trio_swe.sandbox.docker import DockerBackend

from ..dockerenv import DockerEnv
from ._calc import build_calc_repo

pytestmark = pytest.mark.swebench


async def _graded(
    docker_env: DockerEnv, md: InstanceMetadata, patch: str, reward: float, reason: str
) -> EvalResult:
    """``md`` graded on a fresh DockerBackend: the reward and reason expected, nothing left."""
    async with DockerBackend(host=docker_env.docker_host) as backend:
        result = await run_evaluation(backend, md, patch, timeout_sec=120)
        assert backend.statistics().live == 0
    explain = f"{result.reason}: {result.detail}\n{result.log_tail[-1500:]}"
    assert (result.reward, result.reason) == (reward, reason), explain
    return result


@pytest.mark.parametrize(
    ("outcome", "reward", "reason"),
    [("gold", 1.0, "resolved"), ("empty", 0.0, "tests_failed"), ("break_p2p", 0.0, "tests_failed")],
)
async def test_swebench_row_in_docker_image(
    docker_env: DockerEnv, tmp_path: Path, outcome: str, reward: float, reason: str
) -> None:
    # The image's calc repo has the same files (so the same patches) but its own commit ids.
    calc = dataclasses.replace(build_calc_repo(tmp_path), base=docker_env.calc_base)
    md = get_metadata(calc.swebench_v5_row(image=docker_env.swe_image), "swebench")
    patch = "" if outcome == "empty" else getattr(calc, outcome)
    result = await _graded(docker_env, md, patch, reward, reason)
    assert "conda: no env" not in result.log_tail
    if outcome == "gold":
        assert result.f2p_passed == result.f2p_total == 2
        assert result.p2p_passed == result.p2p_total == 2
    assert docker_env.own_containers() == []


@pytest.mark.parametrize(
    ("outcome", "reward", "reason"),
    [("gold", 1.0, "resolved"), ("empty", 0.0, "tests_failed"), ("bad_setup", 0.0, "setup_failed")],
)
async def test_scaleswe_row_with_its_setup_in_docker_image(
    docker_env: DockerEnv, tmp_path: Path, outcome: str, reward: float, reason: str
) -> None:
    """The setup stage of the staged command (pre_commands before the ladder) on docker: the
    setup puts the test patch in, the graded command sees it; a failing setup is infra."""
    calc = dataclasses.replace(build_calc_repo(tmp_path), base=docker_env.calc_base)
    setup = [
        f"git checkout -q {calc.base} -f && git reset -q --hard HEAD",
        f"printf '%s' {shlex.quote(calc.test_patch)} | git apply",
    ]
    if outcome == "bad_setup":
        setup.append("echo broken >&2; exit 3")
    row = {
        "instance_id": "calc_docker_setup",
        "image_url": docker_env.swe_image,
        "workdir": "/testbed",
        "pre_commands": setup,
        "eval_cmd": "/opt/miniconda3/envs/testbed/bin/python -m pytest -q -p no:cacheprovider tests",
    }
    md = get_metadata(row, "scaleswe")
    patch = "" if outcome == "empty" else calc.gold
    result = await _graded(docker_env, md, patch, reward, reason)
    assert result.infra_failure == (outcome == "bad_setup")
    if outcome == "bad_setup":
        assert result.detail == "pre_commands exited with status 3"
        assert "broken" in result.log_tail
    else:
        assert result.durations["setup"] > 0
    assert docker_env.own_containers() == []
