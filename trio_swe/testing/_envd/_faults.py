"""Fault injection plan: which request gets which fault (sans-IO, seeded).

A :class:`FaultPlan` is an ordered list of :class:`Fault` rules and a seeded random generator.
Each request is decided exactly once, where it is first seen: by the HTTP/2 fault proxy for
HTTP/2 requests (it can emit frames), by the ASGI app otherwise. The first rule whose ``route``
matches, whose budget (``times``) is not spent and whose coin (``probability``) comes up wins.
"""

from __future__ import annotations

import fnmatch
import random
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Final, Literal

import msgspec

from ..._errors import InvalidArgumentError

FaultKind = Literal["status", "latency", "no_end", "rst", "goaway", "tcp_close", "hang"]

#: Faults that need the HTTP/2 frame layer (the fault proxy) to be exact. Over HTTP/1.1 the app
#: approximates ``rst``/``goaway``/``tcp_close`` by aborting the connection mid-response.
FRAME_KINDS: Final = frozenset({"rst", "goaway", "tcp_close", "hang"})
APP_KINDS: Final = frozenset({"status", "latency", "no_end"})

# HTTP/2 error codes (RFC 9113 section 7) used as defaults.
NO_ERROR: Final = 0x0
INTERNAL_ERROR: Final = 0x2
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8


class Fault(msgspec.Struct, frozen=True, kw_only=True):
    """One fault rule.

    Attributes:
        kind: what happens:

            * ``"status"``: answer ``status`` (502/503/429...) with the edge's JSON body and, when
              ``retry_after`` is set, a ``Retry-After`` header; the request never reaches envd.
            * ``"latency"``: wait ``delay_sec`` before handling the request normally.
            * ``"no_end"``: a server stream ends cleanly after ``after_sec`` without Connect's
              end event or end-of-stream message (the process keeps running).
            * ``"rst"``: HTTP/2 ``RST_STREAM(code)`` after ``after_sec`` of the response (a *cut*);
              with ``before_request`` the request is refused and never forwarded (use
              ``code=REFUSED_STREAM``).
            * ``"goaway"``: ``GOAWAY(last_stream_id, code)`` then the connection closes. Without
              ``before_request`` it comes ``after_sec`` into the response and ``last_stream_id``
              is the highest stream forwarded; with it, the matching request is not forwarded and
              ``last_stream_id`` is below it.
            * ``"tcp_close"``: the TCP connection is closed ``after_sec`` into the response (or
              before forwarding with ``before_request``).
            * ``"hang"``: the response stream goes silent after ``after_sec``: no more bytes, the
              connection stays open, the process keeps running.
        route: a glob over the request path (``"/process.Process/Start"``, ``"/files"``,
            ``"/v2/sandboxes"``, ``"*"``).
        method: an HTTP method to match, or ``None`` for any.
        probability: chance that a matching request gets the fault.
        times: injections left for this rule (``None``: unlimited).
        skip: let this many matching requests through first.
        after_sec: seconds into the response before a stream fault fires, counted from the
            response's headers (over HTTP/2; a loaded server may take longer than that to
            answer at all); ``0``: at once, before any of the response.
        status: HTTP status of a ``"status"`` fault.
        retry_after: ``Retry-After`` seconds of a ``"status"`` fault.
        delay_sec: added latency of a ``"latency"`` fault.
        code: HTTP/2 error code of ``"rst"``/``"goaway"``.
        before_request: ``rst``/``goaway``/``tcp_close`` fire before the request is forwarded,
            so it provably never reached the server.
        message: body message of a ``"status"`` fault.
    """

    kind: FaultKind
    route: str = "*"
    method: str | None = None
    probability: float = 1.0
    times: int | None = None
    skip: int = 0
    after_sec: float = 0.0
    status: int = 503
    retry_after: float | None = None
    delay_sec: float = 0.0
    code: int = INTERNAL_ERROR
    before_request: bool = False
    message: str = "injected fault"

    def __post_init__(self) -> None:
        if self.kind not in APP_KINDS | FRAME_KINDS:
            raise InvalidArgumentError(f"unknown fault kind {self.kind!r}")
        if not 0.0 <= self.probability <= 1.0:
            raise InvalidArgumentError(
                f"fault probability must be in [0, 1], got {self.probability}"
            )
        if self.after_sec < 0 or self.delay_sec < 0:
            raise InvalidArgumentError("fault after_sec and delay_sec must be >= 0")
        if self.times is not None and self.times < 0:
            raise InvalidArgumentError("fault times must be >= 0")
        if not 0 <= self.code < 2**32:
            raise InvalidArgumentError(f"HTTP/2 error code out of range: {self.code}")

    def matches(self, method: str, path: str) -> bool:
        """Whether a request ``method path`` falls under this rule (budget and coin aside)."""
        if self.method is not None and self.method.upper() != method.upper():
            return False
        return fnmatch.fnmatchcase(path, self.route)


class _Rule:
    __slots__ = ("fault", "left", "seen", "to_skip")

    def __init__(self, fault: Fault) -> None:
        self.fault = fault
        self.left = fault.times
        self.to_skip = fault.skip
        self.seen = 0


class FaultPlan:
    """An ordered, seeded list of fault rules; decides which request gets which fault.

    Example::

        plan = FaultPlan([
            Fault(kind="status", route="/process.Process/Start", status=503, retry_after=0.2,
                  probability=0.1),
            Fault(kind="rst", route="/process.Process/Start", after_sec=1.0, probability=0.05),
        ], seed=7)
        async with open_envd_server(faults=plan) as server:
            ...

    Args:
        faults: rules, tried in order for each request; the first that fires wins.
        seed: seed of the random generator deciding ``probability`` coins.
    """

    def __init__(self, faults: Iterable[Fault] = (), *, seed: int = 0) -> None:
        self._rules = [_Rule(f) for f in faults]
        self._rng = random.Random(seed)
        self._injected: Counter[str] = Counter()
        self.enabled = True

    def add(self, fault: Fault) -> None:
        """Append a rule."""
        self._rules.append(_Rule(fault))

    def clear(self) -> None:
        """Drop every rule (already injected faults keep running their course)."""
        self._rules.clear()

    @property
    def faults(self) -> list[Fault]:
        """The rules, in order."""
        return [r.fault for r in self._rules]

    def decide(
        self, method: str, path: str, *, kinds: frozenset[str] | None = None
    ) -> Fault | None:
        """Pick the fault for one request, or ``None``; consumes budgets and random draws.

        Args:
            method: the HTTP method.
            path: the request path without the query.
            kinds: the fault kinds the caller can inject; other rules are passed over.
        """
        if not self.enabled:
            return None
        for rule in self._rules:
            fault = rule.fault
            if kinds is not None and fault.kind not in kinds:
                continue
            if not fault.matches(method, path) or rule.left == 0:
                continue
            if rule.to_skip > 0:
                rule.to_skip -= 1
                continue
            if fault.probability < 1.0 and self._rng.random() >= fault.probability:
                continue
            if rule.left is not None:
                rule.left -= 1
            return fault
        return None

    def record(self, fault: Fault) -> None:
        """Count an injection that actually happened."""
        self._injected[fault.kind] += 1

    def injected(self) -> Mapping[str, int]:
        """Faults injected so far, by kind."""
        return dict(self._injected)
