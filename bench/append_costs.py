"""What one Produce append costs on the event loop, step by step, beside the cost of handing the
step to a thread instead (loop.run_in_executor round trip), at several batch sizes:

    .venv/bin/python bench/append_costs.py

Decides which steps of Log.append_as_leader are worth moving off the loop (README, "Descriptor
budget and append path"): a step pays to move only where it takes clearly longer than the hop.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time

import uvloop
from crc32c import crc32c

SIZES = (16 * 1024, 256 * 1024, 1024 * 1024, 8 * 1024 * 1024)


def per_call_us(fn, repeat: int) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        samples.append((time.perf_counter() - t0) / repeat * 1e6)
    return statistics.median(samples)


async def hop_us(repeat: int = 2000) -> float:
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, int)  # start the pool's thread
    t0 = time.perf_counter()
    for _ in range(repeat):
        await loop.run_in_executor(None, int)
    return (time.perf_counter() - t0) / repeat * 1e6


def main() -> None:
    hop = uvloop.run(hop_us())
    fd, path = tempfile.mkstemp(prefix="append-costs-")
    try:
        print(f"thread hop (run_in_executor of a no-op, uvloop): {hop:.0f} us\n")
        print(f"{'batch':>8} {'crc32c us':>10} {'copy us':>8} {'pwrite us':>10} {'fsync us':>9}")
        for size in SIZES:
            data = os.urandom(size)
            repeat = max(5, 64 * 1024 * 1024 // size // 8)
            crc = per_call_us(lambda d=data: crc32c(d), repeat)
            copy = per_call_us(lambda d=data: bytearray(d), repeat)
            write = per_call_us(lambda d=data: os.pwrite(fd, d, 0), repeat)
            sync = per_call_us(lambda d=data: (os.pwrite(fd, d[:4096], 0), os.fsync(fd)), 20)
            print(f"{size // 1024:>6}Ki {crc:>10.0f} {copy:>8.0f} {write:>10.0f} {sync:>9.0f}")
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    main()
