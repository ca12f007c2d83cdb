"""The process's own resources on every node's /metrics, under the names Prometheus client
libraries use (process_*), and the event loop's task count: what a soak watches for leaks."""

from __future__ import annotations

import asyncio
import os
import resource
import time

from node.metrics import Family

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICKS = os.sysconf("SC_CLK_TCK")


def _start_time() -> float:
    """Seconds since the epoch at which this process started (/proc/self/stat field 22)."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + started_ticks / _TICKS
    except (OSError, ValueError, IndexError):
        return 0.0


_STARTED = _start_time()


def collect() -> list[Family]:
    out = []
    t = os.times()
    out.append(Family("process_cpu_seconds_total", "counter", "User and system CPU time of this process.")
               .add(t.user + t.system))
    try:
        with open("/proc/self/statm") as f:
            rss_pages = int(f.read().split()[1])
        out.append(Family("process_resident_memory_bytes", "gauge", "Resident memory of this process.")
                   .add(rss_pages * _PAGE))
    except (OSError, ValueError, IndexError):
        pass
    try:
        out.append(Family("process_open_fds", "gauge", "Open file descriptors of this process.")
                   .add(len(os.listdir("/proc/self/fd"))))
    except OSError:
        pass
    out.append(Family("process_max_fds", "gauge", "The soft limit on open file descriptors.")
               .add(resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
    out.append(Family("process_start_time_seconds", "gauge", "When this process started (Unix time).")
               .add(_STARTED))
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (a test calling collect() directly)
        tasks = 0
    out.append(Family("strata_event_loop_tasks", "gauge", "Tasks alive on the node's event loop.").add(tasks))
    return out
