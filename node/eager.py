"""Coroutines started eagerly, as Python 3.12's eager tasks (asyncio.eager_task_factory), on 3.11.

A request's handler runs at once, in the call that starts it (the read callback, mostly), up to
its first wait. One that finishes without waiting (a Produce at RF 1, a Metadata, most requests)
then costs no task, no loop step and no done callback: a task with its done callback costs about
7 µs of CPU on uvloop, a tenth of a small Produce's whole Python path. A handler that waits is
carried on from that wait by a task in the same context.

Starts made while an eager step runs (its answer's write lets the connection's next request
start; a follower's Fetch settles a Produce on another connection) wait behind it and run when it
returns, in order: a loop, not recursion, however deep a pipeline is.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any


class Started:
    """One started coroutine, asked as a task is (done, cancelled, exception, cancel), whether it
    finished in its eager step or goes on in `task`. Hashed by identity."""

    __slots__ = ("task", "size", "_finished", "_cancelled", "_error")

    def __init__(self, size: int = 0) -> None:
        self.task: asyncio.Task | None = None
        self.size = size  # what the starter counts against it (a request's bytes)
        self._finished = False
        self._cancelled = False
        self._error: BaseException | None = None

    def done(self) -> bool:
        task = self.task
        return self._finished if task is None else task.done()

    def cancelled(self) -> bool:
        task = self.task
        return self._cancelled if task is None else task.cancelled()

    def exception(self) -> BaseException | None:
        """The exception it ended with (None if none, or not finished, or cancelled)."""
        task = self.task
        if task is None:
            return self._error
        return None if not task.done() or task.cancelled() else task.exception()

    def cancel(self) -> None:
        """A waiting task is cancelled; a start still queued behind an eager step never runs."""
        if self.task is not None:
            self.task.cancel()
        elif not self._finished:
            self._cancelled = True


# Starts queued behind the eager step running now (None: no step runs). The loop is one thread.
_backlog: collections.deque | None = None
_current: Started | None = None


def current() -> Started | None:
    """The Started whose eager step is running, if any (asyncio.current_task() is then not it)."""
    return _current


def start(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], started: Started,
          on_done: Callable[[], None]) -> None:
    """Run `coro` now up to its first wait, in a copy of the current context; if it waits, a task
    carries it on. `on_done` is called once it has finished (in the eager step's call, or as the
    task's done callback)."""
    global _backlog
    if _backlog is not None:
        _backlog.append((loop, coro, started, on_done))
        return
    backlog = _backlog = collections.deque()
    try:
        _step(loop, coro, started, on_done)
        while backlog:
            _step(*backlog.popleft())
    finally:
        _backlog = None
        while backlog:  # an exception escaped a step (KeyboardInterrupt): the rest still run, as tasks
            loop_, coro_, started_, on_done_ = backlog.popleft()
            _as_task(loop_, coro_, started_, on_done_, contextvars.copy_context())


def _step(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], started: Started,
          on_done: Callable[[], None]) -> None:
    global _current
    if started._cancelled:  # cancelled while queued: it never runs, as a task cancelled before its first step
        coro.close()
        started._finished = True
        on_done()
        return
    ctx = contextvars.copy_context()
    _current = started
    try:
        waiting_on = ctx.run(coro.send, None)
    except StopIteration:
        pass
    except asyncio.CancelledError:
        started._cancelled = True
    except (KeyboardInterrupt, SystemExit):
        started._finished = True
        raise
    except BaseException as exc:
        started._error = exc
    else:
        _as_task(loop, _carried(_Carry(coro, waiting_on)), started, on_done, ctx)
        return
    finally:
        _current = None
    started._finished = True
    on_done()


def _as_task(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], started: Started,
             on_done: Callable[[], None], ctx: contextvars.Context) -> None:
    task = started.task = loop.create_task(coro, context=ctx)
    task.add_done_callback(lambda _t: on_done())


class _Carry:
    """Awaited by the carrying task: hands it what the eager step stopped on (a future, already
    marked as awaited), then relays each resumption and each thrown exception (a cancellation)."""

    __slots__ = ("coro", "waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self.coro = coro
        self.waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, Any]:
        send, throw = self.coro.send, self.coro.throw
        step = self.waiting_on
        self.waiting_on = None
        while True:
            try:
                value = yield step
            except BaseException as exc:
                try:
                    step = throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    step = send(value)
                except StopIteration as done:
                    return done.value


async def _carried(carry: _Carry) -> Any:
    return await carry
