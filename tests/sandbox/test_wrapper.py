"""BackendWrapper: the one base of the backends that wrap another (the episode's boot retries,
Ray's leases and ownership) forwards the Backend protocol and the image hooks."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from trio_swe import SweConfig
from trio_swe._boot import BootingBackend
from trio_swe.grading import InstanceMetadata, resolve_image
from trio_swe.sandbox import BackendWrapper, check_image, image_for, open_sandbox
from trio_swe.sandbox.local import LocalBackend


def _md(instance_id: str, image: str) -> InstanceMetadata:
    return InstanceMetadata(protocol="scaleswe", instance_id=instance_id, image=image)


def test_a_wrapped_backend_boots_what_the_wrapped_one_would(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    inner = LocalBackend(state_dir=tmp_path / "state", images={"x-1": str(repo)})
    md = _md("x-1", "docker.io/some/image:latest")
    booting = BootingBackend(inner, trio.CapacityLimiter(1), SweConfig())
    # Before the base, a wrapper had no image hook: rows on a wrapped backend (a Ray worker's)
    # booted their own image, not the mapped one.
    assert image_for(booting, md) == image_for(inner, md) == str(repo)
    assert resolve_image(booting, md).image == str(repo)
    missing = str(tmp_path / "nowhere")
    assert check_image(booting, missing, commit=None) == check_image(inner, missing, commit=None)
    assert check_image(booting, missing, commit=None) is not None


async def test_the_wrapper_forwards_boots_and_statistics_and_owns_what_it_is_told(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "f.txt").write_text("hi")
    inner = LocalBackend(state_dir=tmp_path / "state")
    closed: list[str] = []

    class Counting(BackendWrapper):
        async def aclose(self) -> None:
            closed.append("wrapper")
            await super().aclose()

    for owns in (False, True):
        wrapper = Counting(inner, owns=owns)
        assert wrapper.name == inner.name
        assert wrapper.wrapped is inner
        async with open_sandbox(wrapper, str(repo), workdir="/testbed") as sb:
            assert (await sb.exec("cat f.txt")).output == "hi"
        assert wrapper.statistics() == inner.statistics()
        await wrapper.aclose()
    assert inner.statistics().created == 2
    assert inner.statistics().live == 0
    assert closed == ["wrapper", "wrapper"]


def test_ray_wrappers_share_the_base() -> None:
    pytest.importorskip("ray")
    from trio_swe.ray._limiter import LeasedBackend
    from trio_swe.ray._owned import OwnedBackend

    assert issubclass(LeasedBackend, BackendWrapper)
    assert issubclass(OwnedBackend, BackendWrapper)
