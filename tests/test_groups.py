"""Errors out of trio_swe's private nurseries, as trio advises (issue 11 item 3).

The body's own error escapes as itself; cleanup failures are attached as notes and logged,
never in its place; several failures no one error stands for are an InternalError raised from
their group; cancellations and interrupts are never swallowed. Each case against the real
local backend, with a fault injected in ``kill()`` (the sandbox is really killed first).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from trio_swe import (
    InvalidArgumentError,
    SandboxUnreachableError,
    open_sandbox,
    run_episode,
)
from trio_swe._errors import InternalError
from trio_swe._groups import collapse, open_private_nursery
from trio_swe.agents import BashAgent
from trio_swe.demo import open_scripted_policy_server
from trio_swe.policy import ByteTokenizer, SGLangPolicy
from trio_swe.sandbox import BackendStatistics, Sandbox, SandboxSpec
from trio_swe.sandbox.local import LocalBackend

from .test_episode_support import assert_nothing_left, build_demo, demo_config


class _KillFailsSandbox:
    """A real sandbox whose ``kill()`` kills it, then reports a failure (as E2B's can)."""

    def __init__(self, inner: Sandbox) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def kill(self) -> None:
        await self._inner.kill()
        raise SandboxUnreachableError(f"injected kill failure of {self._inner.id}")


class KillFailsBackend:
    """The real local backend; every sandbox's kill raises after killing it."""

    name = "local"

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner

    def statistics(self) -> BackendStatistics:
        return self.inner.statistics()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def create_sandbox(self, spec: SandboxSpec, nursery: trio.Nursery) -> Sandbox:
        return _KillFailsSandbox(await self.inner.create_sandbox(spec, nursery))  # type: ignore[return-value]


def _image(tmp_path: Path) -> str:
    image = tmp_path / "image"
    image.mkdir()
    (image / "f.txt").write_text("x\n")
    return str(image)


async def test_the_callers_error_escapes_with_the_kill_failure_as_a_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = LocalBackend(state_dir=tmp_path / "state")
    before = ValueError("the caller's own context")
    with pytest.raises(ValueError, match="the caller's bug") as info:
        async with open_sandbox(KillFailsBackend(backend), _image(tmp_path)) as sb:
            assert (await sb.exec("true")).ok
            try:
                raise before
            except ValueError:
                raise ValueError("the caller's bug")
    error = info.value
    assert not isinstance(error, BaseExceptionGroup)
    # Its own context is kept (not replaced by a group, not suppressed).
    assert error.__context__ is before
    assert not error.__suppress_context__
    notes = getattr(error, "__notes__", [])
    assert any("injected kill failure" in n and "SandboxUnreachableError" in n for n in notes)
    logged = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert any(isinstance(e, SandboxUnreachableError) for e in logged), caplog.records
    assert backend.statistics().live == 0


async def test_a_kill_failure_after_a_clean_body_is_the_error(tmp_path: Path) -> None:
    backend = LocalBackend(state_dir=tmp_path / "state")
    with pytest.raises(SandboxUnreachableError, match="injected kill failure"):
        async with open_sandbox(KillFailsBackend(backend), _image(tmp_path)) as sb:
            assert (await sb.exec("true")).ok
    assert backend.statistics().live == 0


async def test_a_boot_failure_escapes_as_itself(tmp_path: Path) -> None:
    backend = LocalBackend(state_dir=tmp_path / "state")
    with pytest.raises(InvalidArgumentError) as info:
        async with open_sandbox(backend, str(tmp_path / "image"), workdir="relative"):
            pytest.fail("booted")
    assert not isinstance(info.value, BaseExceptionGroup)


async def test_policy_failure_plus_kill_failure_is_a_policy_error(tmp_path: Path) -> None:
    _, mds, backend = build_demo(tmp_path)
    async with open_scripted_policy_server({}) as server:
        url = server.url
    # The server is gone (connections refused) and every kill reports a failure.
    async with SGLangPolicy(url) as policy:
        agent = BashAgent(policy, ByteTokenizer())
        result = await run_episode(
            mds[0], agent, backend=KillFailsBackend(backend), config=demo_config()
        )
    assert result.status == "aborted"
    assert result.abort_reason == "policy_error", result.error
    assert "PolicyError" in (result.error or "")
    assert_nothing_left(tmp_path, backend)


async def test_the_callers_error_escapes_run_rollouts_as_itself(tmp_path: Path) -> None:
    from trio_swe import run_rollouts

    demo, mds, backend = build_demo(tmp_path)
    async with (
        open_scripted_policy_server(demo.scripts) as server,
        SGLangPolicy(server.url) as policy,
    ):
        agent = BashAgent(policy, ByteTokenizer())
        with pytest.raises(KeyError, match="consumer"):
            async with run_rollouts(
                mds, agent, backend=backend, config=demo_config(), concurrency=2, network=False
            ) as stream:
                async for _ in stream:
                    raise KeyError("consumer")
    assert_nothing_left(tmp_path, backend)


# --- collapse itself: each rule -------------------------------------------------------------


def _raised(fn: Any) -> BaseException:
    try:
        fn()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


def test_a_group_of_one_is_its_member_with_its_context_kept() -> None:
    cause = OSError("underneath")
    try:
        raise cause
    except OSError:
        try:
            raise ValueError("leaf")
        except ValueError as exc:
            leaf = exc
    group = ExceptionGroup("g", [leaf])

    def go() -> None:
        try:
            raise group
        except BaseExceptionGroup as g:
            collapse(g)

    out = _raised(go)
    assert out is leaf
    assert out.__context__ is cause


def test_several_failures_without_a_primary_are_an_internal_error_from_the_group() -> None:
    group = ExceptionGroup("g", [ValueError("a"), KeyError("b")])

    def go() -> None:
        try:
            raise group
        except BaseExceptionGroup as g:
            collapse(g)

    out = _raised(go)
    assert isinstance(out, InternalError)
    assert out.abort_reason == "internal_error"
    assert out.__cause__ is group
    assert "ValueError: a" in str(out)
    assert "KeyError" in str(out)


def test_the_primary_wins_and_the_others_become_notes(caplog: pytest.LogCaptureFixture) -> None:
    primary = ValueError("body")
    other = OSError("cleanup")
    group = ExceptionGroup("g", [other, primary])

    def go() -> None:
        try:
            raise group
        except BaseExceptionGroup as g:
            collapse(g, primary=primary, what="closing the thing")

    with caplog.at_level(logging.WARNING, logger="trio_swe"):
        out = _raised(go)
    assert out is primary
    assert primary.__notes__ == ["closing the thing also failed: OSError: cleanup"]
    assert [r.exc_info[1] for r in caplog.records if r.exc_info] == [other]


def test_an_interrupt_is_never_dropped_for_the_primary() -> None:
    primary = ValueError("body")
    group = BaseExceptionGroup("g", [primary, KeyboardInterrupt()])

    def go() -> None:
        try:
            raise group
        except BaseExceptionGroup as g:
            collapse(g, primary=primary)

    assert _raised(go) is group


async def test_a_real_failure_next_to_a_cancellation_reaches_the_cancel_scope() -> None:
    async def fails() -> None:
        raise ValueError("child")

    with pytest.raises(ExceptionGroup) as info, trio.CancelScope() as outer:
        async with open_private_nursery() as nursery:
            nursery.start_soon(fails)
            outer.cancel()
            await trio.sleep_forever()
    # trio's scope stripped the Cancelled; the child's error was not swallowed for it.
    assert info.group_contains(ValueError, match="child")
    assert not info.group_contains(trio.Cancelled)
