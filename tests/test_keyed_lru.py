"""The per-key lock and the bounded cache that long-lived backends and protocols keep: nothing
stays behind a key nobody uses, and no cache outgrows its bound over a long run."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_swe._lru import Lru
from trio_swe.sandbox._keyed import KeyedLock


async def test_one_key_serializes_other_keys_do_not_wait() -> None:
    locks = KeyedLock()
    order: list[str] = []
    release = trio.Event()

    async def holder() -> None:
        async with locks.hold("img"):
            order.append("a in")
            await release.wait()
            order.append("a out")

    async def same_key() -> None:
        async with locks.hold("img"):
            order.append("b in")

    async def other_key() -> None:
        async with locks.hold("other"):
            order.append("c in")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(same_key)
        nursery.start_soon(other_key)
        await trio.testing.wait_all_tasks_blocked()
        assert order == ["a in", "c in"]  # b waits for a; c does not
        assert len(locks) == 1  # "other" is gone already, "img" is held and awaited
        release.set()
    assert order == ["a in", "c in", "a out", "b in"]
    assert len(locks) == 0


async def test_a_cancelled_waiter_and_a_failing_holder_leave_nothing() -> None:
    locks = KeyedLock()
    release = trio.Event()

    async def holder() -> None:
        with pytest.raises(ValueError, match="the pull failed"):
            async with locks.hold("img"):
                await release.wait()
                raise ValueError("the pull failed")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder)
        await trio.testing.wait_all_tasks_blocked()
        with trio.CancelScope() as waiter:
            nursery.start_soon(_cancel_soon, waiter)
            async with locks.hold("img"):
                pytest.fail("the lock was held")
        assert waiter.cancelled_caught
        assert len(locks) == 1  # the holder still has it
        release.set()
    assert len(locks) == 0
    async with locks.hold("img"):  # and it can be taken again
        assert len(locks) == 1


async def _cancel_soon(scope: trio.CancelScope) -> None:
    await trio.testing.wait_all_tasks_blocked()
    scope.cancel()


async def test_many_keys_one_after_another_keep_nothing() -> None:
    locks = KeyedLock()
    for i in range(2000):
        async with locks.hold(f"image-{i}"):
            assert len(locks) == 1
    assert len(locks) == 0


def test_lru_keeps_the_most_recently_used() -> None:
    cache: Lru[str, int] = Lru(3)
    for i, key in enumerate("abc"):
        cache.put(key, i)
    assert cache.get("a") == 0  # a is now the most recent
    cache.put("d", 3)  # evicts b, the least recent
    assert "b" not in cache
    assert [cache.get(k) for k in "acd"] == [0, 2, 3]
    cache.put("c", 20)  # an update refreshes, evicts nothing
    assert len(cache) == 3
    assert cache.get("c") == 20
    cache.pop("c")
    cache.pop("missing")
    assert len(cache) == 2
    for i in range(1000):
        cache.put(f"k{i}", i)
    assert len(cache) == 3
    with pytest.raises(ValueError, match="maxsize"):
        Lru(0)


def test_lru_bounded_by_bytes_evicts_the_oldest_until_the_bytes_fit() -> None:
    cache: Lru[str, int] = Lru(100, max_bytes=10)
    cache.put("a", 1, nbytes=4)
    cache.put("b", 2, nbytes=4)
    assert cache.nbytes == 8
    cache.get("a")  # a is now the most recent
    cache.put("c", 3, nbytes=5)  # 13 > 10: b goes (the least recent), then it fits
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)
    assert cache.nbytes == 9
    cache.put("a", 10, nbytes=1)  # an update re-weighs its entry
    assert cache.nbytes == 6
    cache.put("huge", 4, nbytes=11)  # over the bound alone: not kept, nothing evicted
    assert "huge" not in cache
    assert cache.nbytes == 6
    cache.pop("c")
    assert (len(cache), cache.nbytes) == (1, 1)
