"""The last step of a process: cancel what still runs, name it in the log, never hang."""

from __future__ import annotations

import asyncio
import os

import structlog

log = structlog.get_logger(__name__)


async def finish_tasks(timeout: float = 5.0) -> None:
    """Cancel every other task; if some ignore cancellation past `timeout`, log them and exit
    the process (its state is already closed and flushed when this runs)."""
    me = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    if not pending:
        return
    for t in pending:
        t.cancel()
    done, stuck = await asyncio.wait(pending, timeout=timeout)
    if stuck:
        log.error("tasks_ignore_shutdown", tasks=[_coro_name(t) for t in stuck])
        os._exit(0)


async def stop_task(task: asyncio.Task | None, timeout: float = 5.0) -> None:
    """Cancel a background loop and wait for it, boundedly.

    Python 3.11's wait_for can swallow a cancellation that races with its inner future
    completing, so loops also check their own stop flag; this wait never hangs regardless.
    """
    if task is None or task.done():
        return
    task.cancel()
    await asyncio.wait({task}, timeout=timeout)
    if not task.done():
        log.warning("task_did_not_stop", task=_coro_name(task))


def _coro_name(task: asyncio.Task) -> str:
    # a task's coroutine object has a __qualname__; typeshed's Coroutine and Generator do not say so
    return task.get_coro().__qualname__  # type: ignore[union-attr]
