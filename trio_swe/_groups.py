"""Errors out of a library's private nursery, handled as trio advises.

trio's guidance ("Designing for multiple errors") is not to unwrap exception groups blindly: a
group of one that is replaced by its member, ``from None``, loses whatever else happened. Where
trio_swe opens a nursery of its own (a sandbox's background tasks, an episode holding its
sandbox, a rollout's episodes), the caller should still get *their* error as itself, so
``except PolicyError`` works as written. :func:`collapse` is the one place that decides:

* the body's own error (``primary``, an :class:`Exception`) escapes as itself; every other failure in the group (a
  kill that failed during its cleanup, a background task) is attached to it as a note and
  logged with its traceback, never replacing it;
* a group of one escapes as its member, with its own context kept (not ``from None``);
* several failures that no single one stands for become :class:`~trio_swe.InternalError`
  raised ``from`` the group, or the group itself when it holds cancellations or interrupts
  (those belong to trio and the caller, not to us).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import NoReturn

import trio

from ._errors import InternalError

__all__ = ["collapse", "leaves", "note_cleanup_failure", "open_private_nursery", "reraise"]

logger = logging.getLogger("trio_swe")


def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc`` (``[exc]`` when it is not a group)."""
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for sub in exc.exceptions:
            out.extend(leaves(sub))
        return out
    return [exc]


def reraise(exc: BaseException) -> NoReturn:
    """Raise ``exc`` as itself, keeping its own ``__context__`` (not the group it came in)."""
    __tracebackhide__ = True
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context


def note_cleanup_failure(primary: BaseException, failure: BaseException, what: str) -> None:
    """Record that ``what`` failed with ``failure`` while ``primary`` was on its way out."""
    if failure is primary:
        return
    logger.warning(
        "%s failed while %s was propagating",
        what,
        type(primary).__name__,
        exc_info=(type(failure), failure, failure.__traceback__),
    )
    primary.add_note(f"{what} also failed: {type(failure).__name__}: {failure}")


def _is_flow(exc: BaseException) -> bool:
    """Cancellations and interrupts: control flow that must reach trio or the caller intact."""
    return not isinstance(exc, Exception)


def collapse(
    group: BaseExceptionGroup[BaseException],
    *,
    primary: BaseException | None = None,
    what: str = "cleanup",
) -> NoReturn:
    """Raise what the group of a private nursery stands for (see the module docstring).

    Call it from ``except BaseExceptionGroup as group:``. ``primary`` is the body's own error,
    when the body raised one; ``what`` names the other parts in notes and logs.
    """
    __tracebackhide__ = True
    members = leaves(group)
    # A cancellation is not the body's "own" error: the group goes to trio, whose cancel scope
    # strips the Cancelled and lets any real failure next to it through.
    if isinstance(primary, Exception) and any(m is primary for m in members):
        others = [m for m in members if m is not primary]
        # An interrupt (KeyboardInterrupt, SystemExit) is never dropped for the body's error;
        # a Cancelled next to it is (trio raises it again at the next checkpoint if it holds).
        if not any(_is_flow(m) and not isinstance(m, trio.Cancelled) for m in others):
            for m in others:
                if isinstance(m, Exception):
                    note_cleanup_failure(primary, m, what)
            reraise(primary)
    if len(members) == 1:
        reraise(members[0])
    if any(_is_flow(m) for m in members):
        raise group
    summary = "; ".join(f"{type(m).__name__}: {m}" for m in members)
    raise InternalError(f"{len(members)} failures at once: {summary}") from group


@asynccontextmanager
async def open_private_nursery(what: str = "a background task") -> AsyncIterator[trio.Nursery]:
    """A nursery whose failures come out through :func:`collapse`, the block's error first."""
    primary: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            try:
                yield nursery
            except BaseException as exc:
                primary = exc
                raise
    except BaseExceptionGroup as group:
        collapse(group, primary=primary, what=what)
