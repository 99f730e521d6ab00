"""Outputs and patches have documented caps, so their cost is bounded (issue 27, item 4).

``exec_and_wait`` with 100 MB of output grew the client by 182 MB; ``run_evaluation`` of a
50 MB patch by 232 MB. Now a long output comes back as its tail (cut in the sandbox, with
``output_truncated``) and a patch over ``MAX_PATCH_BYTES`` is refused before anything boots.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_swe import InvalidArgumentError, PatchFailedError, exec_and_wait, open_sandbox
from trio_swe.grading._patch import MAX_PATCH_BYTES, patch_bytes
from trio_swe.sandbox import Backend
from trio_swe.sandbox._detached import DEFAULT_MAX_OUTPUT_BYTES


@pytest.fixture
def image(tmp_path: Path) -> Path:
    img = tmp_path / "image"
    img.mkdir(exist_ok=True)
    return img


async def test_a_long_output_comes_back_as_its_tail(backend: Backend, image: Path) -> None:
    assert DEFAULT_MAX_OUTPUT_BYTES == 16 * 1024 * 1024
    # 300 000 bytes: lines "000000\n" .. numbered, so the tail can be checked exactly.
    cmd = "seq -f %06g 0 7 299999"
    want = "".join(f"{i:06d}\n" for i in range(0, 300000, 7))
    async with open_sandbox(backend, str(image)) as sb:
        full = await exec_and_wait(sb, cmd, time_budget_sec=120, want_output=True)
        assert (full.output, full.output_truncated) == (want, False)
        cut = await exec_and_wait(
            sb, cmd, time_budget_sec=120, want_output=True, max_output_bytes=70_000
        )
        assert cut.ok
        assert cut.output_truncated
        assert cut.output == want[-70_000:]
        # A cap below the inline size cuts the inline reply too.
        small = await exec_and_wait(
            sb, "printf 0123456789", time_budget_sec=60, want_output=True, max_output_bytes=4
        )
        assert (small.output, small.output_truncated) == ("6789", True)
        with pytest.raises(InvalidArgumentError, match="max_output_bytes"):
            await exec_and_wait(sb, "true", time_budget_sec=60, max_output_bytes=-1)


def test_a_patch_over_the_cap_is_refused_before_anything_runs() -> None:
    assert MAX_PATCH_BYTES == 16 * 1024 * 1024
    assert len(patch_bytes(b"x" * MAX_PATCH_BYTES)) == MAX_PATCH_BYTES
    with pytest.raises(PatchFailedError, match="MAX_PATCH_BYTES"):
        patch_bytes(b"x" * (MAX_PATCH_BYTES + 1))
    with pytest.raises(PatchFailedError, match="MAX_PATCH_BYTES"):
        patch_bytes("é" * (MAX_PATCH_BYTES // 2 + 1))  # 2 bytes each in UTF-8
