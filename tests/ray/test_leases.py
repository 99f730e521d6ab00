"""The limiter's lease table (sans I/O): caps, FIFO order, release races, reclaim, expiry."""

from __future__ import annotations

import random

import pytest

from trio_swe import InvalidArgumentError
from trio_swe.ray import LeaseTable


def test_booting_and_alive_caps_and_fifo_order() -> None:
    table = LeaseTable(max_booting=2, max_alive=3)
    assert table.request("a", "w1", 0.0) is True
    assert table.request("b", "w1", 0.0) is True
    assert table.request("c", "w2", 0.0) is None  # two booting already
    assert table.request("d", "w2", 0.0) is None
    assert table.booted("a") == ["c"]  # a slot to boot frees: the oldest request gets it
    assert table.booted("b") == []  # three alive: d waits for a death
    stats = table.statistics()
    assert (stats.booting, stats.alive, stats.waiting) == (1, 3, 1)
    assert table.release("a") == ["d"]
    assert table.statistics().peak_alive == 3
    assert table.statistics().peak_booting == 2


def test_a_released_request_never_turns_into_a_lease() -> None:
    table = LeaseTable(max_alive=1)
    assert table.request("a", "w", 0.0)
    assert table.request("queued", "w", 0.0) is None
    assert table.release("queued") == []  # dropped from the queue
    # A release that overtakes its request (a cancelled waiter): the request is refused later.
    assert table.release("early") == []
    assert table.request("early", "w", 0.0) is False
    assert table.release("a") == []
    assert table.statistics().alive == 0
    # Marking a dead lease as booted changes nothing.
    assert table.booted("a") == []


def test_reclaim_and_expiry_return_a_dead_holders_leases() -> None:
    table = LeaseTable(max_alive=2, holder_ttl_sec=10.0)
    assert table.request("a", "dead", 0.0)
    assert table.request("b", "dead", 0.0)
    assert table.request("c", "alive", 1.0) is None
    assert table.request("d", "dead", 1.0) is None
    count, granted = table.reclaim("dead")
    assert (count, granted) == (2, ["c"])  # d was the dead holder's: dropped, not granted
    assert table.statistics().waiting == 0
    # A request the dead holder sent before it died, arriving after the reclaim: refused, so
    # no lease is left that nobody will return.
    assert table.request("late", "dead", 1.5) is False
    table.heartbeat("dead", 1.5)
    assert table.per_holder() == {"alive": 1}
    assert table.request("e", "silent", 2.0)
    table.heartbeat("alive", 11.0)
    silent, granted = table.expire(13.0)
    assert silent == ["silent"]
    assert table.per_holder() == {"alive": 1}
    assert table.statistics().reclaimed == 3
    # Expiry is not death: a silent holder heard from again is served.
    assert table.request("f", "silent", 14.0) is True


def test_invariants_hold_under_random_operations() -> None:
    rng = random.Random(3)
    table = LeaseTable(max_booting=3, max_alive=5)
    live: set[str] = set()
    booted: set[str] = set()
    queued: set[str] = set()
    generation = [0, 0, 0, 0]  # a reclaimed worker is replaced by a new holder
    dead: set[str] = set()
    for n in range(3000):
        op = rng.random()
        if op < 0.4:
            lease = f"l{n}"
            i = rng.randrange(4)
            holder = f"w{i}.{generation[i]}" if rng.random() < 0.95 else rng.choice([*dead, "x"])
            granted = table.request(lease, holder, float(n))
            if granted is None:
                queued.add(lease)
            elif granted:
                live.add(lease)
            else:
                assert holder in dead, holder  # only a dead holder's request is refused
        elif op < 0.6 and live - booted:
            lease = rng.choice(sorted(live - booted))
            booted.add(lease)
            new = table.booted(lease)
            live.update(new)
            queued.difference_update(new)
        elif op < 0.9 and (live or queued):
            lease = rng.choice(sorted(live | queued))
            new = table.release(lease)
            live.discard(lease)
            booted.discard(lease)
            queued.discard(lease)
            live.update(new)
            queued.difference_update(new)
        else:
            i = rng.randrange(4)
            holder = f"w{i}.{generation[i]}"
            generation[i] += 1
            dead.add(holder)
            mine = {x for x in live | queued if table.holder_of(x) == holder}
            _, new = table.reclaim(holder)
            live -= mine
            booted -= mine
            queued -= mine
            live.update(new)
            queued.difference_update(new)
        stats = table.statistics()
        assert stats.alive == len(live) <= 5
        assert stats.booting == len(live - booted) <= 3
        assert stats.waiting == len(queued)
        # Nothing waits while a lease would fit.
        if queued:
            assert stats.alive == 5 or stats.booting == 3


def test_bad_caps_are_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="caps"):
        LeaseTable(max_alive=-1)
    with pytest.raises(InvalidArgumentError, match="holder_ttl_sec"):
        LeaseTable(holder_ttl_sec=0)
