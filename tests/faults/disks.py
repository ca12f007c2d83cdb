"""Each broker's second log dir as a disk a fault can slow down or fill: a FUSE passthrough (it
can add a delay to every write and fsync, tests/disk_faults.py) over a tmpfs of its own (a real
filesystem that really runs out of space when a filler file takes what is left). The first log
dir is a tmpfs of the same size, so that replicas are placed in both."""

from __future__ import annotations

import errno
import os
from contextlib import ExitStack

from tests.disk_faults import FusePassthrough, fuse_passthrough, fuse_unavailable, tmpfs, unavailable
from tools.cluster import Cluster

DISK_BYTES = 256 << 20  # each broker's second log dir: room for a fault run's few partitions


def disks_unavailable() -> str | None:
    """None when both mounts work here, else why not."""
    return unavailable() or fuse_unavailable()


class BrokerDisk:
    def __init__(self, fs: FusePassthrough) -> None:
        self.fs = fs
        self.filler = fs.backing / "filler"  # on the tmpfs, beside the log dir's files

    def slow_down(self, delay: float) -> None:
        self.fs.slow_down(delay)

    def speed_up(self) -> None:
        self.fs.speed_up()

    def fill(self) -> None:
        """Take every free byte of the filesystem (the broker's next write there gets ENOSPC)."""
        chunk = b"\0" * (1 << 20)
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    if len(chunk) == 1:
                        return
                    chunk = chunk[: len(chunk) // 2]  # the last free pages too
        finally:
            os.close(fd)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


def broker_disks(c: Cluster, stack: ExitStack, size: int = DISK_BYTES) -> dict[int, BrokerDisk]:
    """Before the cluster starts: mount each broker's `logs-1` (a tmpfs of `size` bytes behind a
    FUSE passthrough) and its `logs-0` (a plain tmpfs of the same size: a broker places a new
    replica in the dir with the most room, so a small dir beside the machine's big disk would get
    none); unmounted when `stack` closes (stop the cluster first)."""
    out = {}
    for b in c.broker_ids:
        stack.enter_context(tmpfs(c.node_dir(b) / "logs-0", size))
        backing = stack.enter_context(tmpfs(c.node_dir(b) / "logs-1.backing", size))
        out[b] = BrokerDisk(stack.enter_context(fuse_passthrough(backing, c.node_dir(b) / "logs-1")))
    return out

