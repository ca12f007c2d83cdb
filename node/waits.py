"""Waiting for a future, with a deadline, in one event-loop step.

`asyncio.wait_for` (Python 3.11) wakes its caller two loop steps after the future completes (a
done callback, then the task's wakeup). Under CPU contention each step can queue behind a whole
batch of other connections' I/O, and an acks=all produce crosses several such waits (the
follower's long poll on the leader, its response on the follower, the high watermark), so every
step saved there is latency saved under load.
"""

from __future__ import annotations

import asyncio
from typing import Any


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


def _expire(fut: asyncio.Future, expired: Any) -> None:
    if fut.done():
        return
    if isinstance(expired, BaseException):
        fut.set_exception(expired)
    else:
        fut.set_result(expired)
