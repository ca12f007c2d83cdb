"""Diskless coordinator snapshots and pruning (KIP-1164): a diskless coordinator's leader snapshots its SQLite
state every `diskless.coordinator.snapshot.interval.records` records into object storage and cuts
its `__diskless_metadata` log at the previous snapshot, so after many commits the log is bounded
(two intervals of records, plus a segment); a replica added afterwards starts from the snapshot (its log starts at
a cut: it never saw the first records) and its SQLite dump equals the leader's; so does a replica
that was down while the log was cut past its state.

The test commits 2,000 tiny files (one batch each) through DisklessCommitFile with an interval of
200 records; bench/diskless_snapshots.py does 100,000 with the default interval."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from node.client import NodeClient
from protocol.generated.alter_partition_reassignments import AlterPartitionReassignmentsRequest as APR
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C
from protocol.generated.list_offsets import ListOffsetsRequest as LO
from protocol.generated.metadata import MetadataRequest
from tests.conftest import ROOT
from tools.cluster import Cluster

HOST = "127.0.0.1"
META = "__diskless_metadata"
TOPIC = "dl"
PARTITIONS = 4


def overrides(interval: int, segment_bytes: int) -> dict[str, str]:
    return {"diskless.metadata.topic.num.partitions": "1", "diskless.metadata.topic.replication.factor": "3",
            "diskless.coordinator.snapshot.interval.records": str(interval),
            "diskless.metadata.topic.segment.bytes": str(segment_bytes)}


async def _retry(fn: Any, timeout: float = 60.0, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await fn()
        if result is not None:
            return result
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(interval)


async def setup(c: Cluster) -> tuple[uuid.UUID, int, list[int]]:
    """A diskless topic; (its id, the coordinator's leader, the coordinator partition's replicas)."""
    async with NodeClient(HOST, c.broker_port(1)) as nc:
        R = CreateTopicsRequest
        resp = await nc.request(R(topics=[R.CreatableTopic(
            name=TOPIC, num_partitions=PARTITIONS, replication_factor=1,
            configs=[R.CreatableTopicConfig(name="diskless.enable", value="true")])], timeout_ms=30000))
        assert resp.topics[0].error_code == 0, resp.topics[0].error_message

        async def ready() -> Any:
            md = await nc.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=TOPIC),
                                                          MetadataRequest.MetadataRequestTopic(name=META)]), 12)
            t, m = md.topics
            if t.error_code or m.error_code or not m.partitions or m.partitions[0].leader_id < 0:
                return None
            return t.topic_id, m.partitions[0].leader_id, list(m.partitions[0].replica_nodes)

        return await _retry(ready)


def _commit(tid: uuid.UUID, tag: str, i: int) -> C:
    return C(object_key=f"wal/{tag}-{i:08d}", object_format=1, file_size=100, owner_ids=[0], batches=[
        C.DisklessCommitBatch(magic=2, request_id=0, topic_id=tid, partition_index=i % PARTITIONS, byte_offset=0,
                              size=100, base_offset=0, last_offset=0, batch_max_timestamp=1_700_000_000_000,
                              timestamp_type=0, producer_id=-1, producer_epoch=-1, base_sequence=-1,
                              last_sequence=-1)])


async def commit_many(c: Cluster, leader: int, tid: uuid.UUID, n: int, tag: str, in_flight: int = 64) -> float:
    """n commits of one tiny batch each to the coordinator's leader, `in_flight` at a time
    (pipelined on one connection, as a broker's WAL writer does); commits/s."""
    async with NodeClient(HOST, c.broker_port(leader), client_id=f"diskless-{leader}") as nc:
        # the coordinator loads and creates the topic's partitions in its own time
        async def first() -> Any:
            r = await nc.request(_commit(tid, tag, 0))
            return True if r.batches[0].error_code == 0 else None

        await _retry(first)
        started = time.monotonic()
        next_i = 1
        failed: list[Any] = []

        async def worker() -> None:
            nonlocal next_i
            while next_i < n:
                i, next_i = next_i, next_i + 1
                r = await nc.request(_commit(tid, tag, i))
                if r.batches[0].error_code:
                    failed.append((i, r.batches[0].error_code, r.batches[0].error_message))

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        assert not failed, failed[:3]
        return (n - 1) / (time.monotonic() - started)


async def log_range(c: Cluster, broker: int) -> tuple[int, int]:
    """(log start, log end) of the coordinator's partition, as its leader answers ListOffsets."""
    async with NodeClient(HOST, c.broker_port(broker)) as nc:
        out = []
        for ts in (-2, -1):
            r = await nc.request(LO(replica_id=-1, isolation_level=0, topics=[LO.ListOffsetsTopic(
                name=META, partitions=[LO.ListOffsetsPartition(partition_index=0, timestamp=ts)])]), 7)
            p = r.topics[0].partitions[0]
            assert p.error_code == 0
            out.append(p.offset)
        return out[0], out[1]


def segment_bytes(c: Cluster, broker: int) -> int:
    """Bytes of the live segments of the coordinator partition's replica on `broker`."""
    dirs = [d for d in (c.node_dir(broker) / "logs-0").glob(f"{META}-0*") if d.is_dir()]
    return sum(f.stat().st_size for d in dirs for f in d.glob("*.log"))


def state_file(c: Cluster, broker: int) -> Path:
    return c.node_dir(broker) / "logs-0" / "diskless-coordinator" / "0.sqlite"


def dump(path: Path) -> list[str] | None:
    """The database as SQL text (sqlite3's iterdump), read-only; None while it is being replaced."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return list(db.iterdump())
        finally:
            db.close()
    except sqlite3.Error:
        return None


def events(c: Cluster, broker: int, event: str) -> list[dict[str, str]]:
    out = []
    for line in c.log_path(broker).read_text(errors="replace").splitlines():
        if re.search(rf"event='?{event}'?( |$)", line):
            out.append(dict(re.findall(r"(\w+)='?([^' ]*)'?", line)))
    return out


async def add_replica(c: Cluster, replicas: list[int], new: int) -> None:
    async with NodeClient(HOST, c.broker_port(1)) as nc:
        resp = await nc.request(APR(topics=[APR.ReassignableTopic(META, [APR.ReassignablePartition(0, [*replicas, new])])]))
        assert resp.error_code == 0, resp.error_message
        assert all(p.error_code == 0 for t in resp.responses for p in t.partitions), resp


async def same_dump(c: Cluster, a: int, b: int, timeout: float = 60.0) -> list[str]:
    async def equal() -> Any:
        da, db = dump(state_file(c, a)), dump(state_file(c, b))
        return da if da is not None and da == db else None

    return await _retry(equal, timeout, 0.5)


def test_snapshot_prunes_log_and_seeds_new_replica(tmp_path: Path) -> None:
    interval, n = 200, 2_000
    c = Cluster(tmp_path / "cluster", brokers=4, broker_overrides=overrides(interval, 64 * 1024),
                controller_overrides={"diskless.metadata.topic.num.partitions": "1"})
    c.start()
    try:
        async def run() -> None:
            tid, leader, replicas = await setup(c)
            await commit_many(c, leader, tid, n, "a")
            # two intervals, and what commits while a snapshot is due (checked every 200 ms)
            async def cut() -> Any:
                start, end = await log_range(c, leader)
                return (start, end) if end - start <= 3 * interval else None

            start, end = await _retry(cut, 60)  # 30 s ran out once under a full parallel run
            assert end >= n and start > 0
            taken = events(c, leader, "diskless_snapshot_taken")
            assert len(taken) >= n // interval // 2, len(taken)
            # the log is bounded: so many records (under 200 bytes each) and a 64 KiB segment beyond them
            assert segment_bytes(c, leader) < 3 * interval * 200 + 64 * 1024
            # the operator view names the newest snapshot
            shown = subprocess.run([sys.executable, "-m", "tools.kafka_diskless", "--describe", "--coordinators",
                                    "--json", "--bootstrap-server", c.bootstrap], capture_output=True, text=True,
                                   timeout=60, cwd=ROOT)
            assert shown.returncode == 0, shown.stderr
            [row] = json.loads(shown.stdout)["coordinators"]
            assert row["last_snapshot"] >= int(taken[-1]["offset"]) and row["last_snapshot_time"] != "-", row
            new = next(b for b in c.broker_ids if b not in replicas)
            await add_replica(c, replicas, new)
            # the new replica's log starts at a cut, so its state can only come from a snapshot
            installed = await _retry(lambda: _async(events(c, new, "diskless_snapshot_installed") or None), 60)
            assert int(installed[0]["offset"]) >= start
            await commit_many(c, leader, tid, 200, "b")  # and it follows the log from there
            rows = await same_dump(c, leader, new)
            assert sum(1 for line in rows if line.startswith('INSERT INTO "batches"')) == n + 200
            assert segment_bytes(c, new) < 3 * interval * 200 + 64 * 1024
            # a replica that was down while the log was cut past its state starts from a snapshot too
            c.terminate(new)
            _, stopped_at = await log_range(c, leader)
            extra = 0
            while (await log_range(c, leader))[0] <= stopped_at:  # until the log is cut past its state
                assert extra < 10 * interval
                await commit_many(c, leader, tid, interval, f"c{extra}")
                extra += interval
                await asyncio.sleep(0.5)  # a snapshot is due within a check interval
            c.start_node(new)

            async def reinstalled() -> Any:
                got = events(c, new, "diskless_snapshot_installed")
                return got[-1] if len(got) > len(installed) else None

            again = await _retry(reinstalled, 60)
            assert int(again["previous_applied_offset"]) > 0
            rows = await same_dump(c, leader, new)
            assert sum(1 for line in rows if line.startswith('INSERT INTO "batches"')) == n + 200 + extra

        asyncio.run(run())
    finally:
        c.stop()


async def _async(value: Any) -> Any:
    return value


def test_a_snapshot_is_installed_from_ranged_reads_never_whole(tmp_path: Path) -> None:
    """download() streams the object to disk in chunks: no read larger than a chunk, the file
    byte for byte the stored one, fsynced; a missing snapshot is a SnapshotError."""
    from broker.diskless.coordinator.snapshots import SnapshotError, SnapshotStore
    from broker.diskless.object_store import LocalObjectStore, StoreLocation

    class Recording(LocalObjectStore):  # the real local store, counting what each read asked for
        reads: list[int] = []

        async def get_range(self, key: str, start: int, end: int) -> bytes:
            self.reads.append(end - start)
            return await super().get_range(key, start, end)

        async def get(self, key: str) -> bytes:
            raise AssertionError("a snapshot is never read whole")

    store = Recording(tmp_path / "objects")
    snapshots = SnapshotStore(StoreLocation(store, "wal"))
    data = bytes(range(256)) * 1000 + b"tail"  # 256,004 bytes

    async def go() -> tuple[int, int]:
        await snapshots.put("tid", 0, 42, data)
        size = await snapshots.download("tid", 0, 42, tmp_path / "in.sqlite", chunk_bytes=64 << 10)
        try:
            await snapshots.download("tid", 0, 43, tmp_path / "none.sqlite")
        except SnapshotError as e:
            assert "43" in str(e)
        else:
            raise AssertionError("a missing snapshot downloaded")
        return size, len(store.reads)

    size, reads = asyncio.run(go())
    assert size == len(data) and (tmp_path / "in.sqlite").read_bytes() == data
    assert reads == 4 and max(store.reads) <= 64 << 10


def test_a_quiet_log_is_trimmed_to_the_newest_snapshot_when_snapshots_lay_far_apart() -> None:
    """Snapshots taken while commits pour in can lie far apart (the state copy takes a while): a
    snapshot cuts the log at the previous one, and once the log goes quiet no next snapshot comes.
    The taker then cuts the log at the newest snapshot, keeping the last interval."""
    from types import SimpleNamespace

    from broker.diskless.coordinator.partition import DisklessCoordinatorPartition
    from broker.diskless.coordinator.snapshot_taker import SnapshotTaker

    class Log:  # what the taker uses of a replica's log
        log_start_offset = 100
        log_end_offset = 1_000

        def delete_records_before(self, offset: int) -> int:
            self.log_start_offset = max(self.log_start_offset, offset)
            return self.log_start_offset

    replica: Any = SimpleNamespace(log=Log(), is_leader=True, high_watermark=1_000)
    tasks: list[asyncio.Task] = []

    def spawn(coro: Any) -> asyncio.Task:
        tasks.append(asyncio.ensure_future(coro))
        return tasks[-1]

    async def go() -> tuple[int, int]:
        taker = SnapshotTaker(200, lambda i: replica, states=None, store=None,  # type: ignore[arg-type]
                              owns=lambda ps: True, spawn=spawn)
        ps = DisklessCoordinatorPartition(0, 1)
        ps.view, ps.loading = object(), False  # type: ignore[assignment]
        ps.snapshot_offset = 900  # 100 records behind the end: no new snapshot is due
        taker.check([ps])
        await asyncio.gather(*tasks)
        trimmed = replica.log.log_start_offset
        ps.snapshot_offset = 950  # a log within two intervals is left alone
        replica.log.log_start_offset = 850
        taker.check([ps])
        await asyncio.gather(*tasks)
        return trimmed, replica.log.log_start_offset

    assert asyncio.run(go()) == (800, 850)  # the newest snapshot, but never inside the last interval
