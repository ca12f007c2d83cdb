"""The time a request's own code runs on the event loop: the sum of the steps of its coroutine,
without the time it waits (a long-polling Fetch, an acks=all Produce waiting for replicas). The
asyncio counterpart of the time a request spends on one of Kafka's I/O threads, which is what
request_percentage limits."""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from time import perf_counter
from typing import Any


class StepTimer:
    __slots__ = ("coro", "seconds")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.seconds = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        send, throw = self.coro.send, self.coro.throw
        value: Any = None
        exc: BaseException | None = None
        while True:
            t0 = perf_counter()
            try:
                step = send(value) if exc is None else throw(exc)
            except StopIteration as done:
                self.seconds += perf_counter() - t0
                return done.value
            self.seconds += perf_counter() - t0
            value, exc = None, None
            try:
                value = yield step
            except BaseException as e:  # cancellation and the like go into the coroutine
                exc = e
