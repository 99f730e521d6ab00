"""statistics() returns frozen structs, as trio's do (issue 11 item 6): the SGLang client, the
scripted server, the asyncio bridge, the sample builder, every backend and its sandboxes (on the
``backend`` fixture), and the envd test server."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import trio

from trio_swe import aio
from trio_swe.demo import ScriptedServerStatistics, open_scripted_policy_server
from trio_swe.policy import PolicyStatistics, SGLangPolicy
from trio_swe.sandbox import Backend, BackendStatistics, SandboxStatistics, open_sandbox
from trio_swe.testing import EnvdServerStatistics, FaultProxyStatistics, open_envd_server
from trio_swe.trajectory import BuilderStatistics, SampleBuilder


def _assert_frozen_struct(value: object, kind: type) -> None:
    assert type(value) is kind
    assert isinstance(value, msgspec.Struct)
    field = next(iter(kind.__struct_fields__))  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        setattr(value, field, 1)


async def test_policy_and_scripted_server_statistics_are_frozen_structs() -> None:
    async with (
        open_scripted_policy_server({"i": ["x"]}) as server,
        SGLangPolicy(server.url) as policy,
    ):
        before = policy.statistics()
        await policy.generate([1, 2], {"max_new_tokens": 4})
        after = policy.statistics()
        served = server.statistics()
    _assert_frozen_struct(after, PolicyStatistics)
    _assert_frozen_struct(served, ScriptedServerStatistics)
    # A snapshot: later calls do not change an earlier one.
    assert (before.requests, after.requests) == (0, 1)
    assert after.output_tokens > 0
    assert served.generations == 1
    assert served.active == 0


def test_aio_and_builder_statistics_are_frozen_structs() -> None:
    _assert_frozen_struct(aio.statistics(), aio.GuestStatistics)
    assert aio.statistics() == aio.GuestStatistics(running=0, active=0, calls=0)
    _assert_frozen_struct(SampleBuilder().statistics(), BuilderStatistics)


async def test_trio_run_has_no_guest() -> None:
    await trio.lowlevel.checkpoint()
    assert aio.statistics().running == 0  # no asyncio loop here: all zero


async def test_sandbox_and_backend_statistics_are_frozen_structs(
    backend: Backend, tmp_path: Path
) -> None:
    image = tmp_path / "image"
    image.mkdir(exist_ok=True)
    (image / "f").write_text("x")
    before = backend.statistics()
    async with open_sandbox(backend, str(image)) as sb:
        first = sb.statistics()
        await sb.exec("true")
        second = sb.statistics()
        during = backend.statistics()
    after = backend.statistics()
    for stats, base in ((first, SandboxStatistics), (before, BackendStatistics)):
        # Each backend reports its own subclass of the shared base.
        assert isinstance(stats, base)
        assert type(stats) is not base, type(stats)
        _assert_frozen_struct(stats, type(stats))
    assert second.execs == first.execs + 1  # a snapshot, not a live view
    assert during.live == before.live + 1
    assert (after.live, after.created, after.killed) == (
        before.live,
        before.created + 1,
        before.killed + 1,
    )
    assert msgspec.json.decode(msgspec.json.encode(after))["live"] == after.live


@pytest.mark.parametrize("fault_proxy", [False, True])
async def test_envd_server_statistics_are_a_frozen_struct(fault_proxy: bool) -> None:
    async with open_envd_server(fault_proxy=fault_proxy) as server:
        stats = server.statistics()
    _assert_frozen_struct(stats, EnvdServerStatistics)
    assert stats.live_sandboxes == 0
    assert stats.faults_injected == {}
    if fault_proxy:
        assert stats.proxy is not None
        _assert_frozen_struct(stats.proxy, FaultProxyStatistics)
    else:
        assert stats.proxy is None
