"""Awaiting trio_swe from asyncio: trio runs as a guest of the running asyncio loop.

Most trainers (slime, verl, SkyRL) are asyncio programs. This module starts one trio run per
asyncio event loop in guest mode (:func:`trio.lowlevel.start_guest_run`): trio's scheduler runs
inside asyncio's loop on the same thread, so no threads hop between the two and every episode of
the loop shares one trio run (and so one boot limiter). The guest run starts on first use and
ends by itself when nothing is running.

Cancellation crosses the bridge both ways:

* cancelling the asyncio task that awaits :func:`run` (``task.cancel()``, ``asyncio.timeout``,
  ``TaskGroup`` teardown) cancels the trio task, waits for its cleanup (sandboxes killed), then
  raises :class:`asyncio.CancelledError` in the awaiter;
* a cancellation on the trio side (for instance :func:`shutdown`) ends the awaiter with
  :class:`asyncio.CancelledError`.

The other direction: trio code started by :func:`run` calls back into asyncio with
:func:`await_asyncio` (a trainer's own generation handle is an asyncio coroutine; the episode's
policy awaits it from trio). The coroutine runs as an asyncio task on the host loop, in the
context variables of the asyncio task that called :func:`run` (tracing and sniffio see asyncio);
cancelling the trio side cancels that task and waits for it to end.

Example::

    import asyncio
    from trio_swe import aio

    async def main():
        results = await asyncio.gather(
            *(aio.run_episode(md, agent, backend=backend, config=config) for md in instances)
        )
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import msgspec
import trio

from .episode import run_episode as _run_episode
from .rollout import run_rollouts as _run_rollouts

if TYPE_CHECKING:
    import outcome

__all__ = [
    "GuestStatistics",
    "await_asyncio",
    "open_stream",
    "run",
    "run_episode",
    "run_rollouts",
    "shutdown",
    "statistics",
]

T = TypeVar("T")
P = ParamSpec("P")


class _Call:
    """One trio task run on behalf of an asyncio awaiter."""

    def __init__(self, done: asyncio.Future[Any]) -> None:
        self.done = done
        self.scope: trio.CancelScope | None = None
        self.cancel_requested = False

    def cancel(self) -> None:
        # Runs in trio context (through the token).
        self.cancel_requested = True
        if self.scope is not None:
            self.scope.cancel()


class _Guest:
    """The trio guest run of one asyncio loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.ready: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self.accepting = True
        self.active = 0
        self.started_calls = 0
        self.token: trio.lowlevel.TrioToken | None = None
        self.nursery: trio.Nursery | None = None
        self._idle: trio.Event | None = None

    def start(self) -> None:
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=self.loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=self.loop.call_soon,
            done_callback=self._on_done,
            host_uses_signal_set_wakeup_fd=True,
        )

    async def _main(self) -> None:
        self.token = trio.lowlevel.current_trio_token()
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            self._idle = trio.Event()
            if not self.ready.done():
                self.ready.set_result(None)
            await self._idle.wait()
            nursery.cancel_scope.cancel()

    def _on_done(self, result: outcome.Outcome[None]) -> None:
        error = getattr(result, "error", None)
        self.accepting = False
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("the trio guest run ended before it started"))
        if isinstance(error, BaseException):
            if not self.finished.done():
                self.finished.set_exception(error)
        elif not self.finished.done():
            self.finished.set_result(None)
        _GUESTS.pop(self.loop, None)

    def call_finished(self) -> None:
        # Trio context. The last call out closes the run; a later call starts a new one.
        self.active -= 1
        if self.active == 0 and self._idle is not None:
            self.accepting = False
            self._idle.set()

    def stop(self) -> None:
        """Trio context: cancel everything and end the run."""
        self.accepting = False
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()


_GUESTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Guest] = weakref.WeakKeyDictionary()

#: In the trio tasks of a :func:`run` call (and their children): the host loop and the context
#: of the asyncio task that awaited :func:`run`, for :func:`await_asyncio`.
_HOST: contextvars.ContextVar[tuple[asyncio.AbstractEventLoop, contextvars.Context]] = (
    contextvars.ContextVar("trio_swe_aio_host")
)


async def _guest() -> _Guest:
    loop = asyncio.get_running_loop()
    while True:
        guest = _GUESTS.get(loop)
        if guest is None:
            guest = _Guest(loop)
            _GUESTS[loop] = guest
            guest.start()
        if guest.accepting:
            await asyncio.shield(guest.ready)
            if guest.accepting:
                return guest
        # A run that is closing: wait until it is gone, then start a fresh one.
        await asyncio.wait([guest.finished])
        if _GUESTS.get(loop) is guest:
            _GUESTS.pop(loop, None)


async def run(async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run ``async_fn(*args)`` in trio (guest of the running asyncio loop) and return its result.

    Exceptions propagate to the awaiter. Cancelling the awaiter cancels the trio task and waits
    for its cleanup before :class:`asyncio.CancelledError` is raised; a trio-side cancellation
    raises :class:`asyncio.CancelledError` in the awaiter.
    """
    guest = await _guest()
    loop = guest.loop
    host_context = contextvars.copy_context()
    done: asyncio.Future[T] = loop.create_future()
    call = _Call(done)
    guest.active += 1
    guest.started_calls += 1

    def settle(value: Any = None, error: BaseException | None = None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    async def runner() -> None:
        _HOST.set((loop, host_context))
        try:
            with trio.CancelScope() as scope:
                call.scope = scope
                if call.cancel_requested:
                    scope.cancel()
                value = await async_fn(*args)
                settle(value)
            if scope.cancelled_caught:
                settle(error=asyncio.CancelledError())
        except trio.Cancelled:
            # Cancelled from the trio side (shutdown): the awaiter sees CancelledError.
            settle(error=asyncio.CancelledError())
            raise
        except BaseException as exc:  # handed to the awaiter, not to the guest run
            settle(error=exc)
        finally:
            guest.call_finished()

    def start() -> None:
        assert guest.nursery is not None
        guest.nursery.start_soon(runner)

    assert guest.token is not None
    guest.token.run_sync_soon(start)
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        if done.done():
            raise  # trio's own cancellation, or we lost a race with completion: final
        guest.token.run_sync_soon(call.cancel)
        # Wait until the trio side has cleaned up (sandboxes killed), even if cancelled again.
        await _wait_uncancellably(done)
        if not done.cancelled():
            done.exception()  # retrieved: it is a CancelledError or a late result
        raise
    finally:
        # The last call out lets the guest run finish before returning, so a program that ends
        # right after (asyncio.run returning) never abandons a half-finished trio run.
        if not guest.accepting and await _wait_uncancellably(guest.finished):
            raise asyncio.CancelledError


async def await_asyncio(async_fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    """From trio code started by :func:`run`: await ``async_fn(*args)`` on the host asyncio loop.

    The call runs as an asyncio task on the loop this trio run is a guest of, in a copy of the
    context of the asyncio task that awaited :func:`run`, and its result or exception comes back
    here. Cancelling the trio caller cancels the asyncio task and waits (shielded) until it has
    ended, so nothing it holds outlives the caller.

    Raises:
        RuntimeError: called from trio code that :func:`run` did not start (no host loop).
    """
    try:
        loop, context = _HOST.get()
    except LookupError:
        raise RuntimeError(
            "trio_swe.aio.await_asyncio: not in trio code started by trio_swe.aio.run"
        ) from None
    finished = trio.Event()

    async def call() -> T:
        return await async_fn(*args)

    # Trio in guest mode runs inside the host loop's callbacks, on its thread: create_task is
    # safe here, and the done callback runs on the same thread.
    task = loop.create_task(call(), context=context.copy())
    task.add_done_callback(lambda _: finished.set())
    try:
        await finished.wait()
    except trio.Cancelled:
        task.cancel()
        with trio.CancelScope(shield=True):
            await finished.wait()
        if not task.cancelled():
            task.exception()  # retrieved: a late result or error goes with the cancelled caller
        raise
    return task.result()


async def _wait_uncancellably(fut: asyncio.Future[Any]) -> bool:
    """Wait for ``fut`` even through cancellations; return whether one was swallowed."""
    swallowed = False
    while not fut.done():
        try:
            await asyncio.wait([fut])
        except asyncio.CancelledError:
            swallowed = True
    return swallowed


def _awaited_from_asyncio(fn: Callable[P, Awaitable[T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """``fn``'s signature, awaited from asyncio: the call runs in this loop's trio guest run."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        return await run(functools.partial(fn, *args, **kwargs))

    wrapper.__doc__ = f":func:`trio_swe.{fn.__name__}`, awaited from asyncio (same arguments)."
    return wrapper


def _streamed_to_asyncio(
    fn: Callable[P, AbstractAsyncContextManager[AsyncIterable[T]]],
) -> Callable[P, AsyncGenerator[T, None]]:
    """``fn`` (an async context manager yielding a stream) as an asyncio async generator."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> AsyncGenerator[T, None]:
        return _pumped(functools.partial(fn, *args, **kwargs))

    wrapper.__doc__ = (
        f":func:`trio_swe.{fn.__name__}` as an asyncio async generator of results (same "
        "arguments).\n\nClosing the generator early (``break`` out of ``async for``, or "
        "cancelling the consumer) cancels the episodes still running."
    )
    return wrapper


@asynccontextmanager
async def open_stream(
    open_trio: Callable[[], AbstractAsyncContextManager[AsyncIterable[T]]],
) -> AsyncIterator[AsyncIterator[T]]:
    """A trio stream from asyncio: ``open_trio()`` (an async context manager whose value is an
    async iterable, e.g. ``functools.partial(pool.rollouts, mds)``) runs in this loop's trio
    guest; the value here iterates its items, and leaving the block cancels what still runs."""
    stream = _pumped(open_trio)
    try:
        yield stream
    finally:
        await stream.aclose()


async def _pumped(
    open_trio: Callable[[], AbstractAsyncContextManager[AsyncIterable[T]]],
) -> AsyncGenerator[T, None]:
    """The items of a trio stream, pumped into this asyncio loop as they come."""
    queue: asyncio.Queue[tuple[bool, T | None]] = asyncio.Queue()

    async def pump() -> None:
        async with open_trio() as results:
            async for result in results:
                queue.put_nowait((True, result))
        queue.put_nowait((False, None))

    task = asyncio.ensure_future(run(pump))
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait([getter, task], return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                task.result()  # the pump failed: raise its error
                return
            more, result = getter.result()
            if not more:
                return
            yield result  # type: ignore[misc]  # `more` says it is a T
    finally:
        if not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass


#: :func:`trio_swe.run_episode`, awaited from asyncio (same arguments, same types).
run_episode = _awaited_from_asyncio(_run_episode)
#: :func:`trio_swe.run_rollouts` as an asyncio async generator of results (same arguments).
run_rollouts = _streamed_to_asyncio(_run_rollouts)


async def shutdown() -> None:
    """Cancel every trio task of this loop's guest run and wait for the run to end.

    Their awaiters get :class:`asyncio.CancelledError`. A later call starts a fresh run.
    """
    loop = asyncio.get_running_loop()
    guest = _GUESTS.get(loop)
    if guest is None or guest.token is None:
        return
    guest.token.run_sync_soon(guest.stop)
    await asyncio.wait([guest.finished])


class GuestStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """About the running asyncio loop's trio guest run (:func:`statistics`).

    Attributes:
        running: 1 while the guest run exists, else 0.
        active: calls running in it now.
        calls: calls started in it since it began.
    """

    running: int = 0
    active: int = 0
    calls: int = 0


def statistics() -> GuestStatistics:
    """About this loop's guest run (all zero outside a loop or without one)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return GuestStatistics()
    guest = _GUESTS.get(loop)
    if guest is None:
        return GuestStatistics()
    return GuestStatistics(running=1, active=guest.active, calls=guest.started_calls)
