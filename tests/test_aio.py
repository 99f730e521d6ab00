"""trio_swe.aio from a plain asyncio program: await 10 episodes, cancel one, both directions."""

from __future__ import annotations

import asyncio
import contextvars
from pathlib import Path

import pytest
import sniffio
import trio
import trio.lowlevel

from trio_swe import EpisodeResult, aio
from trio_swe.agents import BashAgent
from trio_swe.demo import DemoSet, open_scripted_policy_server
from trio_swe.policy import ByteTokenizer, SGLangPolicy

from .test_episode_support import assert_nothing_left, build_demo, demo_config


async def _serve_policy(demo: DemoSet, url: asyncio.Future[str]) -> None:
    """Trio side: the scripted policy server, until cancelled from asyncio."""
    async with open_scripted_policy_server(demo.scripts) as server:
        url.set_result(server.url)
        await trio.sleep_forever()


@pytest.mark.slow
def test_asyncio_program_awaits_ten_episodes_and_cancels_one(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    slow_id = next(iter(demo.timeouts))
    instances = (mds * 2)[:10]
    config = demo_config(agent_time_budget_sec=60.0)  # the slow one is still running when cancelled

    async def main() -> tuple[list[EpisodeResult], bool]:
        url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        server = asyncio.ensure_future(aio.run(_serve_policy, demo, url))
        policy = SGLangPolicy(await url)
        agent = BashAgent(policy, ByteTokenizer())
        tasks = {
            i: asyncio.ensure_future(
                aio.run_episode(md, agent, backend=backend, config=config, network=False)
            )
            for i, md in enumerate(instances)
        }
        slow = next(i for i, md in enumerate(instances) if md.instance_id == slow_id)
        others = [t for i, t in tasks.items() if i != slow]
        results = list(await asyncio.gather(*others))
        assert not tasks[slow].done()  # busy in its 600 s command
        tasks[slow].cancel()
        cancelled = False
        try:
            await tasks[slow]
        except asyncio.CancelledError:
            cancelled = True
        server.cancel()
        with pytest.raises(asyncio.CancelledError):
            await server
        return results, cancelled

    results, cancelled = asyncio.run(main())
    assert cancelled
    assert len(results) == 9
    for result in results:
        assert result.status == "completed", (result.instance_id, result.error)
        assert result.reward == demo.expected_rewards[result.instance_id]
        assert len(result.samples) == 1
    # The cancelled episode's sandbox was killed before the awaiter saw CancelledError.
    assert_nothing_left(tmp_path, backend)


def test_cancellation_from_the_trio_side_reaches_the_awaiter() -> None:
    async def main() -> None:
        started = asyncio.get_running_loop().create_future()

        async def forever() -> None:
            started.set_result(None)
            await trio.sleep_forever()

        task = asyncio.ensure_future(aio.run(forever))
        await started
        assert aio.statistics().active == 1
        await aio.shutdown()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert aio.statistics().running == 0
        # A fresh guest run starts on the next call.
        assert await aio.run(trio.sleep, 0) is None

    asyncio.run(main())


def test_results_and_errors_cross_the_bridge() -> None:
    class Boom(Exception):
        pass

    async def fail() -> None:
        await trio.lowlevel.checkpoint()
        raise Boom("from trio")

    async def double(x: int) -> int:
        await trio.sleep(0.01)
        return 2 * x

    async def main() -> list[int]:
        with pytest.raises(Boom, match="from trio"):
            await aio.run(fail)
        values = await asyncio.gather(*(aio.run(double, i) for i in range(20)))
        # Each call ran as a task of one shared guest run.
        return list(values)

    assert asyncio.run(main()) == [2 * i for i in range(20)]


def test_asyncio_timeout_cancels_the_trio_task_and_waits_for_its_cleanup() -> None:
    cleaned: list[str] = []

    async def slow() -> None:
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(0.05)  # cleanup that must finish before the awaiter resumes
            cleaned.append("done")

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.1):
                await aio.run(slow)
        assert cleaned == ["done"]

    asyncio.run(main())


def test_asyncio_iterates_a_rollout_and_stops_early(tmp_path: Path) -> None:
    demo, mds, backend = build_demo(tmp_path)
    fast = [md for md in mds if md.instance_id not in demo.timeouts][:4]

    async def main() -> list[EpisodeResult]:
        url: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        server = asyncio.ensure_future(aio.run(_serve_policy, demo, url))
        agent = BashAgent(SGLangPolicy(await url), ByteTokenizer())
        got = []
        stream = aio.run_rollouts(
            fast, agent, backend=backend, config=demo_config(), concurrency=2, network=False
        )
        async for result in stream:
            got.append(result)
            if len(got) == 2:
                break
        await stream.aclose()  # the two episodes still running are cancelled
        server.cancel()
        with pytest.raises(asyncio.CancelledError):
            await server
        return got

    got = asyncio.run(main())
    assert len(got) == 2
    for result in got:
        assert result.reward == demo.expected_rewards[result.instance_id]
    assert_nothing_left(tmp_path, backend)


# await_asyncio: trio code started by aio.run calling back into the host loop.

_CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="unset")


def test_await_asyncio_returns_results_errors_and_the_callers_context() -> None:
    class Boom(Exception):
        pass

    async def on_asyncio(x: int) -> tuple[int, str, str, bool]:
        await asyncio.sleep(0)
        # The asyncio caller's context, and asyncio as far as sniffio and asyncio can tell.
        return (
            2 * x,
            _CALLER.get(),
            sniffio.current_async_library(),
            asyncio.current_task() is not None,
        )

    async def fail_on_asyncio() -> None:
        await asyncio.sleep(0)
        raise Boom("from asyncio")

    async def on_trio() -> list[tuple[int, str, str, bool]]:
        assert sniffio.current_async_library() == "trio"
        with pytest.raises(Boom, match="from asyncio"):
            await aio.await_asyncio(fail_on_asyncio)
        out: list[tuple[int, str, str, bool]] = []

        async def child(i: int) -> None:
            out.append(await aio.await_asyncio(on_asyncio, i))

        async with trio.open_nursery() as nursery:  # children inherit the host
            for i in range(3):
                nursery.start_soon(child, i)
        return sorted(out)

    async def main() -> list[tuple[int, str, str, bool]]:
        _CALLER.set("the asyncio caller")
        return await aio.run(on_trio)

    assert asyncio.run(main()) == [(2 * i, "the asyncio caller", "asyncio", True) for i in range(3)]


def test_await_asyncio_cancelled_from_trio_cancels_the_task_and_waits_for_it() -> None:
    events: list[str] = []

    async def on_asyncio(started: asyncio.Event) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0.01)  # asyncio cleanup the trio caller must wait for
            events.append("asyncio cleaned up")

    async def on_trio() -> None:
        started = asyncio.Event()
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:

                async def cancel_once_started() -> None:
                    await aio.await_asyncio(started.wait)
                    scope.cancel()

                nursery.start_soon(cancel_once_started)
                await aio.await_asyncio(on_asyncio, started)
        assert scope.cancelled_caught
        events.append("trio resumed")

    async def main() -> None:
        await aio.run(on_trio)
        assert not [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    asyncio.run(main())
    assert events == ["asyncio cleaned up", "trio resumed"]


def test_cancelling_the_asyncio_awaiter_reaches_a_nested_asyncio_call() -> None:
    events: list[str] = []

    async def on_asyncio(started: asyncio.Future[None]) -> None:
        started.set_result(None)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            events.append("inner cancelled")
            raise

    async def on_trio(started: asyncio.Future[None]) -> None:
        try:
            await aio.await_asyncio(on_asyncio, started)
        finally:
            events.append("trio unwound")

    async def main() -> None:
        started = asyncio.get_running_loop().create_future()
        outer = asyncio.ensure_future(aio.run(on_trio, started))
        await started
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        # Both sides unwound before the awaiter saw its CancelledError.
        assert events == ["inner cancelled", "trio unwound"]

    asyncio.run(main())


def test_await_asyncio_outside_aio_run_says_so() -> None:
    async def main() -> None:
        with pytest.raises(RuntimeError, match=r"started by trio_swe\.aio\.run"):
            await aio.await_asyncio(asyncio.sleep, 0)

    trio.run(main)
