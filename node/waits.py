"""Waiting for a future, with a deadline, in one event-loop step.

`asyncio.wait_for` (Python 3.11) wakes its caller two loop steps after the future completes (a
done callback, then the task's wakeup). Under CPU contention each step can queue behind a whole
batch of other connections' I/O, and an acks=all produce crosses several such waits (the
follower's long poll on the leader, its response on the follower, the high watermark), so every
step saved there is latency saved under load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any

import structlog

log = structlog.get_logger(__name__)


async def wait_within(fut: asyncio.Future, timeout: float, expired: Any) -> Any:
    """`await fut` for at most `timeout` seconds. Past it, `fut` (a future only this caller
    awaits) is settled with `expired`: returned, or raised if it is an exception."""
    if not fut.done():
        handle = asyncio.get_running_loop().call_later(max(timeout, 0.0), _expire, fut, expired)
        try:
            return await fut
        finally:
            handle.cancel()
    return fut.result()


# Bytes of one incomplete frame a connection reads per event-loop step. libuv reads a readable
# socket up to 32 times per wakeup: a 1 MB frame would be read, joined and handled within one
# step, and every other connection's turn waits for it. Pausing at this much and reading on in
# the next step spreads a large frame over steps of bounded work (as asyncio's StreamReader
# did with its buffer limit).
READ_SLICE = 256 * 1024


def read_next_step(transport: asyncio.Transport, still_wanted: Callable[[], bool]) -> None:
    """Pause reading `transport` until the next loop step (then resume if `still_wanted()`)."""
    transport.pause_reading()
    asyncio.get_running_loop().call_soon(_resume, transport, still_wanted)


def _resume(transport: asyncio.Transport, still_wanted: Callable[[], bool]) -> None:
    if still_wanted() and not transport.is_closing():
        transport.resume_reading()


class Suspended(RuntimeError):
    """run_now's coroutine would have waited."""


def run_now(coro: Coroutine[Any, Any, Any]) -> Any:
    """The result of `coro`, run in this call: for a coroutine that finishes without waiting
    (e.g. a Fetch's reads of local replicas), so that a synchronous call (a data waiter) can run
    it. Raises Suspended, and closes `coro`, if it would have waited."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise Suspended("the coroutine waited")


def _expire(fut: asyncio.Future, expired: Any) -> None:
    if fut.done():
        return
    if isinstance(expired, BaseException):
        fut.set_exception(expired)
    else:
        fut.set_result(expired)


class Eventual:
    """A result that runs its listeners the moment it is set, in the setter's call.

    An asyncio future schedules its callbacks for the next loop step, and an awaiting task wakes
    a step after that; under load each step queues behind a whole batch of other connections'
    work. An acks=all Produce answered (through an Eventual) from the follower's Fetch that moves
    the high watermark goes out in that same step. A listener gets the Eventual (`result()`
    returns the value or raises the failure); one that raises is logged and the others still
    run. Awaitable, for callers that do not need the shortcut."""

    __slots__ = ("_done", "_value", "_error", "_listeners")

    def __init__(self) -> None:
        self._done = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._listeners: list[Callable[[Eventual], None]] = []

    def done(self) -> bool:
        return self._done

    def result(self) -> Any:
        if not self._done:
            raise asyncio.InvalidStateError("Eventual is not set yet")
        if self._error is not None:
            raise self._error
        return self._value

    def set_result(self, value: Any) -> None:
        if not self._done:
            self._value = value
            self._settle()

    def set_exception(self, error: BaseException) -> None:
        if not self._done:
            self._error = error
            self._settle()

    def _settle(self) -> None:
        self._done = True
        listeners, self._listeners = self._listeners, []
        for fn in listeners:
            try:
                fn(self)
            except Exception:
                log.exception("eventual_listener_failed")

    def on_done(self, fn: Callable[[Eventual], None]) -> None:
        """Call `fn(self)` once set: now if it is set already."""
        if self._done:
            fn(self)
        else:
            self._listeners.append(fn)

    def map(self, fn: Callable[[Any], Any]) -> Eventual:
        """An Eventual of `fn(result)` (failed if this one fails or `fn` raises)."""
        out = Eventual()

        def apply(ev: Eventual) -> None:
            try:
                value = fn(ev.result())
            except Exception as e:
                out.set_exception(e)
            else:
                out.set_result(value)

        self.on_done(apply)
        return out

    def __await__(self) -> Generator[Any, Any, Any]:
        if not self._done:
            fut = asyncio.get_running_loop().create_future()

            def wake(_: Eventual) -> None:
                if not fut.done():
                    fut.set_result(None)

            self.on_done(wake)
            yield from fut.__await__()
        return self.result()
