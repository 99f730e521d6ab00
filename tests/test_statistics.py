"""statistics() returns frozen structs, as trio's do (issue 11 item 6)."""

from __future__ import annotations

import msgspec
import pytest
import trio

from trio_swe import aio
from trio_swe.agents import PolicyStatistics, SGLangPolicy
from trio_swe.demo import ScriptedServerStatistics, open_scripted_policy_server
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
