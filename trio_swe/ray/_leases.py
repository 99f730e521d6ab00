"""The cluster limiter's bookkeeping, sans I/O: leases on sandboxes booting and alive.

Providers limit per account, not per process: E2B answers 429 past its concurrent-sandbox cap,
Modal fails at high STARTING counts. A :class:`LeaseTable` hands out one lease per sandbox: it
counts against ``max_booting`` until the sandbox has booted and against ``max_alive`` until it is
dead. Requests that do not fit wait in FIFO order. Every lease belongs to a holder (a rollout
worker); a holder's leases are reclaimed at once when it is known to be dead, or when it has not
been heard from for ``holder_ttl_sec``.

The table only counts and decides; the Ray actor around it (:mod:`._limiter`) turns "granted" into
replies. Lease ids are chosen by the caller, so a caller that gives up on a request (its episode
was cancelled) can release it by id whether the request was granted, still queued, or not yet
arrived (a tombstone makes the late request fail instead of leaking a lease).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import msgspec

from .._errors import InvalidArgumentError

__all__ = ["LeaseTable", "LimiterStatistics"]


class LimiterStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of the limiter.

    Attributes:
        booting: leases of sandboxes still booting.
        alive: leases of sandboxes booting or alive (``booting`` is part of it).
        waiting: requests queued for a lease.
        max_booting: the cap on ``booting`` (0: none).
        max_alive: the cap on ``alive`` (0: none).
        granted: leases granted since the start.
        released: leases returned by their holder (the sandbox died, or its boot failed).
        reclaimed: leases taken back from dead or silent holders.
        holders: holders with at least one lease.
        peak_booting: the highest ``booting`` seen.
        peak_alive: the highest ``alive`` seen.
    """

    booting: int
    alive: int
    waiting: int
    max_booting: int
    max_alive: int
    granted: int
    released: int
    reclaimed: int
    holders: int
    peak_booting: int
    peak_alive: int


class _Lease(msgspec.Struct):
    holder: str
    booting: bool = True


class LeaseTable:
    """Leases on sandboxes booting (``max_booting``) and alive (``max_alive``); 0 means no cap."""

    def __init__(self, *, max_booting: int = 0, max_alive: int = 0, holder_ttl_sec: float = 60.0):
        if max_booting < 0 or max_alive < 0:
            raise InvalidArgumentError(
                f"limiter caps must be >= 0 (0 = none), not booting={max_booting} alive={max_alive}"
            )
        if holder_ttl_sec <= 0:
            raise InvalidArgumentError(f"holder_ttl_sec must be > 0, not {holder_ttl_sec}")
        self.max_booting = max_booting
        self.max_alive = max_alive
        self.holder_ttl_sec = holder_ttl_sec
        self._leases: dict[str, _Lease] = {}
        self._queue: collections.OrderedDict[str, str] = collections.OrderedDict()  # id -> holder
        self._tombstones: set[str] = set()
        self._seen: dict[str, float] = {}  # holder -> last time heard from
        # Holders reclaimed as dead. Their requests may still be in flight (a worker killed just
        # after it asked; Ray orders messages per caller, not across the worker and the driver):
        # a late request of a dead holder is refused, or it would be a lease nobody returns.
        self._dead: set[str] = set()
        self._booting = 0
        self._granted = self._released = self._reclaimed = 0
        self._peak_booting = self._peak_alive = 0

    # -- requests ---------------------------------------------------------------------------
    def request(self, lease_id: str, holder: str, now: float) -> bool | None:
        """Ask for a lease. True: granted now; None: queued; False: it was cancelled already
        (or its holder was reclaimed as dead)."""
        if holder in self._dead:
            return False
        self._seen[holder] = now
        if lease_id in self._tombstones:
            self._tombstones.discard(lease_id)
            return False
        if lease_id in self._leases or lease_id in self._queue:
            raise InvalidArgumentError(f"lease id {lease_id!r} is already in use")
        if not self._queue and self._fits():
            self._grant(lease_id, holder)
            return True
        self._queue[lease_id] = holder
        return None

    def booted(self, lease_id: str) -> list[str]:
        """The lease's sandbox has booted: it stops counting as booting. Returns newly granted ids."""
        lease = self._leases.get(lease_id)
        if lease is None or not lease.booting:
            return []  # released already (a message overtaken by another), or said twice
        lease.booting = False
        self._booting -= 1
        return self._drain()

    def release(self, lease_id: str) -> list[str]:
        """Return a lease, or drop its queued or future request. Returns newly granted ids."""
        if self._queue.pop(lease_id, None) is not None:
            return []
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            self._tombstones.add(lease_id)  # its request has not arrived yet: refuse it then
            return []
        self._released += 1
        self._forget(lease)
        return self._drain()

    def heartbeat(self, holder: str, now: float) -> None:
        """The holder is alive (a holder reclaimed as dead stays dead)."""
        if holder not in self._dead:
            self._seen[holder] = now

    def reclaim(self, holder: str) -> tuple[int, list[str]]:
        """Take back every lease of ``holder`` and drop its requests (it died); its requests
        that arrive later are refused.

        Returns the number of leases reclaimed and the newly granted ids.
        """
        self._dead.add(holder)
        return self._take_back(holder)

    def _take_back(self, holder: str) -> tuple[int, list[str]]:
        for lease_id in [i for i, h in self._queue.items() if h == holder]:
            del self._queue[lease_id]
        mine = [i for i, lease in self._leases.items() if lease.holder == holder]
        for lease_id in mine:
            self._forget(self._leases.pop(lease_id))
        self._reclaimed += len(mine)
        self._seen.pop(holder, None)
        return len(mine), self._drain()

    def expire(self, now: float) -> tuple[list[str], list[str]]:
        """Reclaim the holders not heard from for ``holder_ttl_sec``.

        Returns the holders reclaimed and the newly granted ids.
        """
        silent = [h for h, t in self._seen.items() if now - t > self.holder_ttl_sec]
        granted: list[str] = []
        for holder in silent:
            # Only silent, maybe slow rather than dead: a later request of it is served again.
            granted += self._take_back(holder)[1]
        return silent, granted

    def holder_of(self, lease_id: str) -> str | None:
        """Who holds or waits for ``lease_id``."""
        lease = self._leases.get(lease_id)
        if lease is not None:
            return lease.holder
        return self._queue.get(lease_id)

    def is_granted(self, lease_id: str) -> bool:
        return lease_id in self._leases

    def is_queued(self, lease_id: str) -> bool:
        return lease_id in self._queue

    def statistics(self) -> LimiterStatistics:
        return LimiterStatistics(
            booting=self._booting,
            alive=len(self._leases),
            waiting=len(self._queue),
            max_booting=self.max_booting,
            max_alive=self.max_alive,
            granted=self._granted,
            released=self._released,
            reclaimed=self._reclaimed,
            holders=len({lease.holder for lease in self._leases.values()}),
            peak_booting=self._peak_booting,
            peak_alive=self._peak_alive,
        )

    def per_holder(self) -> Mapping[str, int]:
        """Leases per holder."""
        return collections.Counter(lease.holder for lease in self._leases.values())

    # -- internals --------------------------------------------------------------------------
    def _fits(self) -> bool:
        if self.max_booting and self._booting >= self.max_booting:
            return False
        return not (self.max_alive and len(self._leases) >= self.max_alive)

    def _grant(self, lease_id: str, holder: str) -> None:
        self._leases[lease_id] = _Lease(holder)
        self._booting += 1
        self._granted += 1
        self._peak_booting = max(self._peak_booting, self._booting)
        self._peak_alive = max(self._peak_alive, len(self._leases))

    def _forget(self, lease: _Lease) -> None:
        if lease.booting:
            self._booting -= 1

    def _drain(self) -> list[str]:
        granted = []
        while self._queue and self._fits():
            lease_id, holder = self._queue.popitem(last=False)
            self._grant(lease_id, holder)
            granted.append(lease_id)
        return granted
