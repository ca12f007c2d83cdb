"""Snapshots and pruning of a diskless coordinator's log (KIP-1164's "Metadata log size management"),
measured in one run: 4 brokers, one coordinator (`__diskless_metadata` with 1 partition, RF 3),
`--commits` DisklessCommitFile requests of one tiny batch each straight to its leader (64 in
flight on one connection, as a broker's WAL writer pipelines them), with
`diskless.coordinator.snapshot.interval.records` = `--interval` and segments of `--segment-bytes`.
Then a fourth broker is added as a replica of the partition: it starts from the newest snapshot;
its SQLite dump (iterdump) is compared with the leader's.

The table sets the log the leader keeps against the same log without snapshots (nothing cut: every
record since offset 0, its bytes estimated from the bytes per record of the kept segments).

    .venv/bin/python bench/diskless_snapshots.py                   # 100,000 commits: a few minutes
    .venv/bin/python bench/diskless_snapshots.py --commits 5000 --interval 500   # smoke check
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_diskless_snapshots import (  # noqa: E402
    _retry,
    add_replica,
    commit_many,
    events,
    log_range,
    overrides,
    same_dump,
    segment_bytes,
    setup,
)
from tools.cluster import Cluster  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


async def run(c: Cluster, commits: int, interval: int) -> None:
    tid, leader, replicas = await setup(c)
    say(f"committing {commits} files to coordinator 0 on broker {leader}")
    rate = await commit_many(c, leader, tid, commits, "bench")

    async def settled() -> tuple[int, int] | None:
        start, end = await log_range(c, leader)
        return (start, end) if end - start <= 2 * interval + 1000 else None

    start, end = await _retry(settled, 60)
    kept = segment_bytes(c, leader)
    first_base = min(int(f.stem) for f in (c.node_dir(leader) / "logs-0").glob("__diskless_metadata-0*/*.log"))
    per_record = kept / max(end - first_base, 1)  # the live segments hold [first base, end)
    taken = events(c, leader, "diskless_snapshot_taken")
    new = next(b for b in c.broker_ids if b not in replicas)
    say(f"adding broker {new} as a replica")
    t0 = time.monotonic()
    await add_replica(c, replicas, new)
    rows = await same_dump(c, leader, new, 120)
    joined = time.monotonic() - t0
    installed = events(c, new, "diskless_snapshot_installed")
    print(f"{commits} commits at {rate:.0f}/s; {len(taken)} snapshots, the last {taken[-1]['bytes']} bytes "
          f"(ms to take and store: {[int(t['ms']) for t in taken[-3:]]} for the last three)")
    print("| log of coordinator 0 | log start | log end | records kept | segment bytes on disk |")
    print("|---|---|---|---|---|")
    print(f"| with snapshots (interval {interval}) | {start} | {end} | {end - start} | {kept} |")
    print(f"| without (nothing cut) | 0 | {end} | {end} | ~{int(per_record * end)} |")
    print(f"new replica (broker {new}): installed the snapshot at offset "
          f"{installed[0]['offset'] if installed else '-'}, its SQLite dump equals the leader's "
          f"({len(rows)} lines) {joined:.1f} s after the reassignment; its segments {segment_bytes(c, new)} bytes")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=100_000)
    ap.add_argument("--interval", type=int, default=10_000, help="diskless.coordinator.snapshot.interval.records")
    ap.add_argument("--segment-bytes", type=int, default=1024 * 1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-snapshots-") as tmp:
        c = Cluster(Path(tmp) / "cluster", brokers=4, broker_overrides=overrides(args.interval, args.segment_bytes),
                    controller_overrides={"diskless.metadata.topic.num.partitions": "1"}, verbose=False)
        c.start()
        try:
            asyncio.run(run(c, args.commits, args.interval))
        finally:
            c.stop()


if __name__ == "__main__":
    main()
