"""A test environment given as a virtualenv reaches the local sandbox whole, wherever it lives.

Real venvs are made here (``python -m venv``) under ``/tmp`` and under ``/root``, the two host
directories a local sandbox has private copies of. Each holds a module of its own in its
``lib/.../site-packages`` and a ``.pth`` reaching the test environment's packages (pytest), so
``python`` inside the sandbox must find the venv's ``pyvenv.cfg`` and ``lib/`` to import either:
run as the bare base interpreter, it has neither.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trio_swe import open_sandbox
from trio_swe.grading import evaluability_check, get_metadata, local_backend_shims, run_evaluation
from trio_swe.sandbox.local import LocalBackend

from ._calc import CalcRepo, build_calc_repo
from ._venvs import make_venv

_FAST_PYTEST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> CalcRepo:
    return build_calc_repo(tmp_path_factory.mktemp("calc"))


@pytest.fixture(params=["tmp", "root"])
def venv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    if request.param == "tmp":
        root = tmp_path / "venv"
        assert str(root).startswith("/tmp/")
    else:
        # The probe prefix keeps other tests' view of the host's /root stable.
        root = Path("/root") / f".trio_swe_probe-venv-{uuid.uuid4().hex[:8]}"
    try:
        yield make_venv(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_extra_path_venv_arrives_whole(venv: tuple[Path, str], tmp_path: Path) -> None:
    bin_dir, module = venv
    image = tmp_path / "image"
    image.mkdir()
    backend = LocalBackend(state_dir=tmp_path / "state", extra_path=[str(bin_dir)])
    async with open_sandbox(backend, str(image)) as sb:
        r = await sb.exec(
            f"python -c 'import sys, {module}, pytest; print(sys.prefix); print({module}.WHERE)'"
        )
        assert r.ok, r.output
        prefix, where = r.output.split()
        assert prefix == str(bin_dir.parent)
        assert where.startswith(str(bin_dir.parent / "lib"))
        # The venv's console scripts work too (their shebang names the venv's python).
        r = await sb.exec("pytest --version")
        assert r.ok, r.output
        assert "pytest" in r.output


async def test_shims_bind_the_venv_root_at_the_testbed_env(
    venv: tuple[Path, str], tmp_path: Path
) -> None:
    bin_dir, module = venv
    image = tmp_path / "image"
    image.mkdir()
    backend = LocalBackend(state_dir=tmp_path / "state", **local_backend_shims(bin_dir))
    async with open_sandbox(backend, str(image)) as sb:
        r = await sb.exec(
            ". /opt/miniconda3/bin/activate && conda activate testbed && "
            "/opt/miniconda3/envs/testbed/bin/python -c "
            f"'import sys, {module}, pytest; print(sys.prefix)' && "
            "ls /opt/miniconda3/envs/testbed"
        )
        assert r.ok, r.output
        lines = r.output.split()
        assert lines[0] == "/opt/miniconda3/envs/testbed"
        assert {"bin", "lib", "pyvenv.cfg"} <= set(lines[1:])


@pytest.mark.swebench
async def test_gold_patch_resolves_through_a_venv(
    calc: CalcRepo, venv: tuple[Path, str], tmp_path: Path
) -> None:
    """The issue's case: a venv as the test environment, a gold patch, reward 1."""
    bin_dir, module = venv
    kw = local_backend_shims(bin_dir)
    backend = LocalBackend(
        state_dir=tmp_path / "state",
        ro_binds=kw["ro_binds"],
        extra_path=kw["extra_path"],
        env={**kw["env"], **_FAST_PYTEST},
    )
    # The tests need the venv's own module, as a repository's tests need its dependencies.
    needs = f"python -c 'import {module}'"
    script = calc.eval_script().replace("pytest -rA", f"{needs} && pytest -rA")
    rows = (
        (calc.swebench_v5_row(eval_script=script), "swebench"),
        (calc.scaleswe_f2p_row(pre_commands=[needs]), "scaleswe"),
    )
    for row, protocol in rows:
        md = get_metadata(row, protocol)
        assert evaluability_check(md) is None
        result = await run_evaluation(backend, md, calc.gold, timeout_sec=60)
        assert (result.reward, result.reason) == (1.0, "resolved"), (
            protocol,
            result.detail,
            result.log_tail[-1500:],
        )
