"""Images and commits checked before anything boots: the backends' image-mapping hook.

Real rows (their SWE-bench Docker image names), a real repository (the calc repo, filed under
SWE-bench's ``owner__name`` spelling), real local sandboxes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from trio_swe.grading import (
    evaluability_check,
    get_metadata,
    local_backend_shims,
    local_checkouts,
    resolve_image,
    run_evaluation,
)
from trio_swe.grading._patch import GIT_SAFE_ENV
from trio_swe.sandbox import image_for, open_sandbox
from trio_swe.sandbox.e2b import E2BBackend
from trio_swe.sandbox.local import LocalBackend

from ._calc import SRC, CalcRepo, build_calc_repo, git

ROWS = Path(__file__).parent / "rows"
_FAST_PYTEST = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _row(prefix: str) -> dict[str, Any]:
    (path,) = ROWS.glob(f"{prefix}*.json")
    row: dict[str, Any] = json.loads(path.read_text())
    return row


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> CalcRepo:
    return build_calc_repo(tmp_path_factory.mktemp("calc"))


@pytest.fixture(scope="module")
def checkouts(calc: CalcRepo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of local clones named as SWE-bench names repos (the calc row is pytest's)."""
    root = tmp_path_factory.mktemp("src")
    git(root, "clone", "-q", str(calc.path), str(root / "pytest-dev__pytest"))
    return root


def _backend(**kw: Any) -> LocalBackend:
    shims = local_backend_shims()
    return LocalBackend(
        ro_binds=shims["ro_binds"],
        extra_path=shims["extra_path"],
        env={**shims["env"], **_FAST_PYTEST},
        **kw,
    )


@pytest.mark.swebench
def test_a_docker_image_name_is_an_oci_reference_for_the_local_backend() -> None:
    # The local backend boots OCI images (pulled from the row's registry, issue 16), so a
    # SWE-bench Docker image name passes its pre-boot check; a name that is neither a
    # directory, ``path@commit`` nor an image reference is refused before anything boots.
    md = get_metadata(_row("swebench_v5__markedjs"), "swebench")
    assert md.image.startswith("swebench/sweb.eval.x86_64.")
    assert evaluability_check(md) is None  # the row itself is fine
    assert evaluability_check(md, LocalBackend()) is None
    bad = msgspec.structs.replace(md, image="Not An Image!")
    reason = evaluability_check(bad, LocalBackend()) or ""
    assert reason.startswith("image_not_local:"), reason
    assert "Not An Image!" in reason


@pytest.mark.swebench
async def test_local_checkouts_map_rows_to_clones_at_base_commit(
    calc: CalcRepo, checkouts: Path
) -> None:
    backend = _backend(images=local_checkouts(checkouts))
    row = calc.swebench_v5_row()
    del row["image"]  # as in the dataset: the SWE-bench Docker image name
    md = get_metadata(row, "swebench")
    assert image_for(backend, md) == f"{checkouts}/pytest-dev__pytest@{calc.base}"
    assert resolve_image(backend, md).image == image_for(backend, md)
    assert evaluability_check(md, backend) is None
    result = await run_evaluation(backend, md, calc.gold, timeout_sec=60)
    assert (result.reward, result.reason) == (1.0, "resolved"), result.detail
    # A real row whose commit the clone lacks is caught before anything boots.
    real = get_metadata(_row("swebench_v5__markedjs"), "swebench")
    (checkouts / "markedjs__marked").mkdir(exist_ok=True)
    git(checkouts / "markedjs__marked", "init", "-q")
    reason = evaluability_check(real, backend) or ""
    assert reason.startswith("image_commit_missing:"), reason


@pytest.mark.swebench
async def test_an_image_at_another_commit_is_caught(calc: CalcRepo, tmp_path: Path) -> None:
    first = git(calc.path, "rev-list", "--max-parents=0", "HEAD").strip()
    assert first != calc.base
    backend = _backend()
    # path@commit at the wrong commit: before anything boots.
    md = get_metadata(calc.swebench_v5_row(image=f"{calc.path}@{first}"), "swebench")
    reason = evaluability_check(md, backend) or ""
    assert reason.startswith("base_commit_mismatch:"), reason
    assert first in reason
    assert calc.base in reason
    # A plain directory checked out elsewhere, graded without the check: refused in the eval
    # sandbox before the patch (was: gold patch_apply_failed, empty patch F2P passing).
    wrong = tmp_path / "wrong"
    shutil.copytree(calc.path, wrong)
    git(wrong, "checkout", "-q", first)
    md = get_metadata(calc.swebench_v5_row(image=str(wrong)), "swebench")
    assert (evaluability_check(md, backend) or "").startswith("base_commit_mismatch:")
    for patch in (calc.gold, ""):
        result = await run_evaluation(backend, md, patch, timeout_sec=60)
        assert (result.reason, result.infra_failure) == ("unevaluable", True), result.detail
        assert result.detail.startswith("base_commit_mismatch:")
        assert "tests" not in result.durations  # nothing ran


def test_e2b_maps_rows_to_templates_and_refuses_docker_names() -> None:
    md = get_metadata(_row("swebench_classic__pallets"), "swebench")
    plain = E2BBackend(debug=True)
    reason = plain.check_image(image_for(plain, md)) or ""
    assert reason.startswith("image_not_a_template:"), reason
    assert plain.check_image("swebench-flask-4992") is None
    mapped = E2BBackend(debug=True, images={md.instance_id: "swebench-flask-4992"})
    assert image_for(mapped, md) == "swebench-flask-4992"
    by_function = E2BBackend(debug=True, images=lambda m: f"sweb-{m.instance_id.lower()}")
    assert image_for(by_function, md) == "sweb-pallets__flask-4992"
    assert mapped.check_image(image_for(mapped, md)) is None


async def test_a_checkout_image_s_index_is_trusted_in_every_sandbox(
    calc: CalcRepo, tmp_path: Path
) -> None:
    # A path@commit image is checked out once. git trusts an index entry's stat data only when
    # the file is older (in whole seconds) than the index file; a fresh checkout writes both in
    # the same second, so every `git status` (the eval scripts run one) re-hashes those files,
    # in every sandbox, since each starts from the cached index. The cache settles the index
    # when it builds the image: no entry racy, none smudged (size 0 for a non-empty file).
    backend = LocalBackend(state_dir=tmp_path / "state")
    script = "stat -c %Y .git/index; git ls-files --debug; git ls-files -z | xargs -0 stat -c %s"
    async with open_sandbox(backend, calc.image, workdir="/testbed") as sb:
        r = await sb.exec(script, user="root", env=dict(GIT_SAFE_ENV))
    assert r.ok, r.output
    index_sec, *rest = r.output.splitlines()
    debug = [ln.strip() for ln in rest if ln.startswith("  ")]
    mtimes = [int(ln.split()[1].split(":")[0]) for ln in debug if ln.startswith("mtime:")]
    sizes = [int(ln.split()[1]) for ln in debug if ln.startswith("size:")]
    on_disk = [int(ln) for ln in rest if ln.isdigit()]
    assert mtimes
    assert len(sizes) == len(mtimes) == len(on_disk)
    assert max(mtimes) < int(index_sec), "entries as new as the index are re-hashed each time"
    assert sizes == on_disk, "smudged entries are re-hashed each time"


async def test_a_built_checkout_is_checked_and_booted_without_git(tmp_path: Path) -> None:
    # Once `path@<full commit id>` is in the image cache, it is exactly that commit: the check
    # before boot and the boot itself use the cached checkout (no git call per grading), and
    # still refuse a row whose base_commit is another commit.
    calc = build_calc_repo(tmp_path / "src")
    backend = LocalBackend(state_dir=tmp_path / "state")
    assert backend.check_image(calc.image, commit=calc.base) is None
    async with open_sandbox(backend, calc.image, workdir="/testbed") as sb:
        assert (await sb.exec("cat calc/__init__.py")).output == SRC
    calc.path.rename(tmp_path / "moved")  # the source repository is gone: git would fail
    assert backend.check_image(calc.image, commit=calc.base) is None
    assert backend.check_image(calc.image, commit=calc.base[:7].upper()) is None
    other = "1" * 40
    assert backend.check_image(calc.image, commit=other) == (
        f"base_commit_mismatch:image {calc.image!r} checks out {calc.base}, the row's "
        f"base_commit is {other}"
    )
    async with open_sandbox(backend, calc.image, workdir="/testbed") as sb:
        assert (await sb.exec("git rev-parse HEAD", env=dict(GIT_SAFE_ENV))).output.strip() == (
            calc.base
        )
    # A fresh backend has no cache: the same image is refused, since git cannot find it.
    fresh = LocalBackend(state_dir=tmp_path / "state2")
    assert (fresh.check_image(calc.image, commit=calc.base) or "").startswith("image_not_local:")
