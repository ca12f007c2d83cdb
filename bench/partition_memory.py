"""What one partition costs in Python heap on a broker: N logs (one record each, closed cleanly)
are opened again in process with a Partition each, under tracemalloc; prints the bytes a
partition and where they were allocated (file:line, per partition).

    .venv/bin/python bench/partition_memory.py --partitions 2000

The broker's RSS a partition (bench/partitions.py) is this plus the metadata image's entry, the
allocator's overhead and the process's share of log lines.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import tracemalloc
import uuid
from pathlib import Path

import structlog

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from broker.replication.partition import Partition  # noqa: E402
from broker.storage.config import LogConfig  # noqa: E402
from broker.storage.log_dir import LogDir  # noqa: E402
from protocol.records import Record, encode_batch  # noqa: E402

NOW = 1_700_000_000_000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=2000)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    n = args.partitions
    base = Path(tempfile.mkdtemp(prefix="partition-memory-"))
    try:
        tid, cfg = uuid.uuid4(), LogConfig()
        structlog.configure(logger_factory=structlog.ReturnLoggerFactory())  # one log line a log: dropped
        d = LogDir(base)
        d.format_or_check(1, "bench")
        for i in range(n):
            lg = d.open_log("t", i, 0, cfg, topic_id=tid)
            lg.append_as_leader(encode_batch([Record(value=b"x", timestamp=NOW)]), 1, NOW)
            lg.update_high_watermark(1)
            lg.close(sync=False)
        d.mark_clean_shutdown()
        d = LogDir(base)
        d.format_or_check(1, "bench")
        gc.collect()
        tracemalloc.start(1)
        before = tracemalloc.take_snapshot()
        kept = [Partition("t", i, tid, d.open_log("t", i, 0, cfg, topic_id=tid), 1) for i in range(n)]
        gc.collect()
        after = tracemalloc.take_snapshot()
        diff = after.compare_to(before, "lineno")
        total = sum(s.size_diff for s in diff)
        print(f"{n} partitions (log, one segment, its indexes, producer state, leader epochs, Partition): "
              f"{total / n:.0f} bytes of Python heap each")
        for s in diff[: args.top]:
            frame = s.traceback[0]
            file = Path(frame.filename)
            where = f"{file.relative_to(REPO) if file.is_relative_to(REPO) else file.name}:{frame.lineno}"
            print(f"{s.size_diff / n:8.0f} B {s.count_diff / n:5.1f} objects  {where}")
        del kept
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
