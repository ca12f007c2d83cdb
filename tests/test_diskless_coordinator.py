"""The diskless coordinator (KIP-1164), in-process and on a real cluster.

In-process: the DisklessCoordinator built over fakes of its ports (the replica manager, the
metadata) with a real log and real SQLite, no process: commits get contiguous offsets, a retried
idempotent batch its original offset; FindBatches and ListOffsets see the commits; a coordinator
whose SQLite file is missing rebuilds it from the log.

On a real cluster: a diskless topic's partitions are mapped to __diskless_metadata partitions and
created there; DisklessCommitFile assigns contiguous offsets and answers a retried idempotent batch
with its original offset; ListOffsets / FindBatches see the commits (FindBatches also from a
follower's SQLite); non-brokers are refused; a coordinator's SQLite file deleted while its broker
is down is rebuilt identical to the other replicas'."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from pathlib import Path
from types import MappingProxyType
from typing import Any

from broker.diskless.batches import BatchLookup
from broker.diskless.config import DisklessConfig
from broker.diskless.coordinator.coordinator import DisklessCoordinator
from broker.replication.partition import Partition
from broker.storage.config import LogConfig
from broker.storage.log import Log
from metadata.diskless import DISKLESS_METADATA_TOPIC
from metadata.image import MetadataImage, PartitionInfo, TopicInfo
from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.diskless_commit_file import DisklessCommitFileRequest as C
from protocol.generated.diskless_create_partitions import DisklessCreatePartitionsRequest as CP
from protocol.generated.diskless_find_batches import DisklessFindBatchesRequest as FB
from protocol.generated.diskless_list_offsets import DisklessListOffsetsRequest as LO
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.metadata import MetadataRequest
from tests.fakes import FakeMetadata, FakeReplicas

HOST = "127.0.0.1"
DISKLESS_KEY = 100
OVERRIDES = {"diskless.metadata.topic.num.partitions": "2", "diskless.metadata.topic.replication.factor": "3"}


async def _retry(fn: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = await fn()
            if result is not None:
                return result
        except (AssertionError, OSError):
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.2)


async def _setup(cluster: Any) -> tuple[uuid.UUID, dict[int, int], dict[int, int]]:
    """Create a 4-partition diskless topic; (topic id, partition -> coordinator, coordinator -> leader)."""
    async with NodeClient(HOST, cluster.broker_port(1)) as c:
        R = CreateTopicsRequest
        resp = await c.request(R(topics=[R.CreatableTopic(
            name="dl", num_partitions=4, replication_factor=1,
            configs=[R.CreatableTopicConfig(name="diskless.enable", value="true")])], timeout_ms=30000))
        assert resp.topics[0].error_code == 0, resp.topics[0].error_message

        async def mapped() -> Any:
            md = await c.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name="dl")]), 12)
            t = md.topics[0]
            return t.topic_id if t.error_code == 0 else None

        tid = await _retry(mapped)

        async def leaders() -> dict[int, int] | None:
            out = {}
            for index in (0, 1):
                r = await c.request(FindCoordinatorRequest(key_type=DISKLESS_KEY, coordinator_keys=[str(index)]), 4)
                co = r.coordinators[0]
                if co.error_code:
                    return None
                out[index] = co.node_id
            return out

        coordinators = await _retry(leaders)
    # the mapping is partition metadata: read it from a broker's image via the controller's records
    return tid, coordinators


def _commit(tid: uuid.UUID, key: str, batches: list[tuple[int, int, int, int]]) -> C:
    """batches: (partition, records, producer id, base sequence)."""
    out, pos = [], 0
    for part, n, pid, seq in batches:
        out.append(C.DisklessCommitBatch(
            magic=2, request_id=0, topic_id=tid, partition_index=part, byte_offset=pos, size=100,
            base_offset=0, last_offset=n - 1, batch_max_timestamp=1_700_000_000_000, timestamp_type=0,
            producer_id=pid, producer_epoch=0 if pid >= 0 else -1, base_sequence=seq,
            last_sequence=seq + n - 1 if seq >= 0 else -1))
        pos += 100
    return C(object_key=key, object_format=1, file_size=pos, owner_ids=[0], batches=out)


def _dump(path: Path) -> dict[str, list] | None:
    """Every table of a coordinator's SQLite file, or None while it is being (re)created."""
    if not path.exists():
        return None
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: list(db.execute(f"SELECT * FROM {t} ORDER BY 1, 2")) for t in
                ("meta", "partitions", "files", "batches", "producers")}
    except sqlite3.OperationalError:
        return None
    finally:
        db.close()


def test_coordinator(cluster_factory: Any) -> None:
    cluster = cluster_factory(brokers=3, broker_overrides=OVERRIDES)

    async def run() -> None:
        tid, coordinators = await _setup(cluster)
        leader = coordinators[0]
        async with NodeClient(HOST, cluster.broker_port(leader), client_id=f"diskless-{leader}") as c:
            # which of the 4 partitions coordinator 0 owns: the ones it does not refuse
            async def commit_all() -> Any:
                r = await c.request(_commit(tid, "wal/probe", [(p, 1, -1, -1) for p in range(4)]))
                codes = [b.error_code for b in r.batches]
                if any(code in (Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.UNKNOWN_TOPIC_OR_PARTITION)
                       for code in codes):
                    return None
                return codes

            codes = await _retry(commit_all)
            mine = [p for p, code in enumerate(codes) if code == 0]
            assert mine and all(code in (0, Errors.NOT_COORDINATOR) for code in codes), codes
            p = mine[0]
            r = await c.request(_commit(tid, "wal/a", [(p, 5, -1, -1), (p, 3, 42, 0), (p, 2, 42, 3)]))
            assert [(b.error_code, b.assigned_base_offset) for b in r.batches] == [(0, 1), (0, 6), (0, 9)]
            # the producer retries its first batch in a new file: the original offset, nothing appended
            r = await c.request(_commit(tid, "wal/b", [(p, 3, 42, 0), (p, 1, 42, 9)]))
            assert [(b.error_code, b.assigned_base_offset, b.is_duplicate) for b in r.batches] == [
                (0, 6, True), (Errors.NOT_LEADER_OR_FOLLOWER, -1, False)]
            lo = await c.request(LO(topics=[LO.DisklessListOffsetsTopic(
                topic_id=tid, partitions=[LO.DisklessListOffsetsPartition(partition_index=p, timestamp=-1)])]))
            assert lo.topics[0].partitions[0].offset == 11
        # FindBatches from every replica of the coordinator's partition (followers read their SQLite)
        order = [3, 2, 1, 0]
        for b in (1, 2, 3):
            async with NodeClient(HOST, cluster.broker_port(b), client_id=f"diskless-{b}") as c:
                async def found() -> Any:
                    r = await c.request(FB(fetch_max_bytes=1 << 20, max_batches_per_partition=10, topics=[
                        FB.DisklessFindBatchesTopic(topic_id=tid, partitions=[
                            FB.DisklessFindBatchesPartition(partition_index=p, offset=5,
                                                            max_partition_fetch_bytes=1 << 20)])]))
                    part = r.topics[0].partitions[0]
                    if part.error_code or part.high_watermark < 11:
                        return None
                    return [(x.object_key, x.base_offset, x.last_offset, x.byte_offset) for x in part.batches]

                assert await _retry(found) == [("wal/a", 1, 5, 0), ("wal/a", 6, 8, 100), ("wal/a", 9, 10, 200)]
                # one request for partitions of both coordinators (a Fetch's lookups, batched): answers
                # in request order, the budget spent in that order (each partition still gets one batch)
                async def all_found() -> Any:
                    r = await c.request(FB(fetch_max_bytes=150, max_batches_per_partition=10, topics=[
                        FB.DisklessFindBatchesTopic(topic_id=tid, partitions=[
                            FB.DisklessFindBatchesPartition(partition_index=i, offset=1 if i == p else 0,
                                                            max_partition_fetch_bytes=1 << 20) for i in order])]))
                    parts = r.topics[0].partitions
                    # the other coordinator's partitions reach this replica's SQLite in their own time
                    return parts if all(x.error_code == 0 for x in parts) else None

                parts = await _retry(all_found)
                assert [x.partition_index for x in parts] == order
                assert [x.base_offset for x in parts[order.index(p)].batches] == [1]
                lo = await c.request(LO(topics=[LO.DisklessListOffsetsTopic(topic_id=tid, partitions=[
                    LO.DisklessListOffsetsPartition(partition_index=i, timestamp=-1) for i in order])]))
                answered = [(x.partition_index, x.error_code) for x in lo.topics[0].partitions]
                assert answered == [(i, 0 if coordinators[0 if i in mine else 1] == b else Errors.NOT_COORDINATOR)
                                    for i in order]
                if b == leader:
                    assert lo.topics[0].partitions[order.index(p)].offset == 11
        # pipelined commits on one connection (each frees the connection's turn once appended) are
        # checked and appended in arrival order: an idempotent producer's batches stay contiguous
        async with NodeClient(HOST, cluster.broker_port(leader), client_id=f"diskless-{leader}") as c:
            rs = await asyncio.gather(*(c.request(_commit(tid, f"wal/p{i}", [(p, 2, 43, 2 * i)])) for i in range(8)))
            assert [(r.batches[0].error_code, r.batches[0].assigned_base_offset) for r in rs] == [
                (0, 11 + 2 * i) for i in range(8)]
            # a producer's first batch here at a later sequence (one overtaking its first, through
            # another broker) waits, retriably, for the ones before it; then all go in, in order
            r = await c.request(_commit(tid, "wal/q0", [(p, 2, 44, 4)]))
            assert [b.error_code for b in r.batches] == [Errors.NOT_LEADER_OR_FOLLOWER]
            r = await c.request(_commit(tid, "wal/q1", [(p, 2, 44, 0), (p, 2, 44, 2)]))
            assert [(b.error_code, b.assigned_base_offset) for b in r.batches] == [(0, 27), (0, 29)]
            r = await c.request(_commit(tid, "wal/q2", [(p, 2, 44, 4)]))
            assert [(b.error_code, b.assigned_base_offset) for b in r.batches] == [(0, 31)]
        # not a broker: refused
        async with NodeClient(HOST, cluster.broker_port(leader), client_id="mallory") as c:
            r = await c.request(_commit(tid, "wal/x", [(p, 1, -1, -1)]))
            assert r.batches[0].error_code == Errors.CLUSTER_AUTHORIZATION_FAILED
        async with NodeClient(HOST, cluster.broker_port(leader), client_id="diskless-77") as c:
            r = await c.request(_commit(tid, "wal/x", [(p, 1, -1, -1)]))
            assert r.batches[0].error_code == Errors.CLUSTER_AUTHORIZATION_FAILED
        return leader

    leader = asyncio.run(run())
    # the SQLite file of coordinator 0 on a follower, deleted while that broker is down, is rebuilt
    follower = next(b for b in (1, 2, 3) if b != leader)
    files = {b: cluster.node_dir(b) / "logs-0" / "diskless-coordinator" / "0.sqlite" for b in (1, 2, 3)}
    cluster.terminate(follower)
    for suffix in ("", "-wal", "-shm"):
        Path(str(files[follower]) + suffix).unlink(missing_ok=True)
    cluster.start_node(follower)

    async def rebuilt() -> None:
        async def equal() -> Any:
            dumps = [_dump(files[b]) for b in (1, 2, 3)]
            return True if dumps[0] is not None and dumps[0] == dumps[1] == dumps[2] and dumps[0]["batches"] else None

        await _retry(equal)

    asyncio.run(rebuilt())


# ======================================================================= in-process, over fakes
META_ID = uuid.uuid4()
DATA_ID = uuid.uuid4()
MAX_TIMESTAMP = 1_700_000_000_000  # every batch's, as _commit writes it


def _image() -> MetadataImage:
    """`__diskless_metadata` with one partition led by broker 1 alone, and a diskless topic "dl"
    whose two partitions are mapped to coordinator 0."""
    meta = TopicInfo(META_ID, DISKLESS_METADATA_TOPIC,
                     MappingProxyType({0: PartitionInfo(META_ID, 0, (1,), (1,), 1, 0, 0)}))
    data = TopicInfo(DATA_ID, "dl", MappingProxyType({
        i: PartitionInfo(DATA_ID, i, (1,), (1,), 1, 0, 0, diskless_coordinator=0) for i in (0, 1)}))
    return MetadataImage(topics=MappingProxyType({META_ID: meta, DATA_ID: data}),
                         topic_ids=MappingProxyType({DISKLESS_METADATA_TOPIC: META_ID, "dl": DATA_ID}))


async def _no_controller(body: Any, version: int | None = None, *, read_only: bool = False) -> Any:
    raise ConnectionError("no controller in this test")


async def _loaded(coordinator: DisklessCoordinator, index: int = 0) -> None:
    for _ in range(1000):
        if coordinator.status(index)[0] == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"coordinator {index} did not load")


def test_coordinator_in_process(tmp_path: Path) -> None:
    """Commit, FindBatches and ListOffsets through the DisklessCoordinator itself: fakes for its
    ports, a real log for `__diskless_metadata` partition 0 (its only replica leads it, so an
    append is committed at once) and real SQLite files. A second coordinator over the same log,
    with no SQLite file of its own, rebuilds its state from the log and answers the same."""
    image = _image()
    config = DisklessConfig(storage_url=f"file://{tmp_path / 'objects'}")

    async def answers(coordinator: DisklessCoordinator) -> tuple[Any, ...]:
        found = await coordinator.find_batches([
            BatchLookup(DATA_ID, 0, 5, 1 << 20), BatchLookup(DATA_ID, 1, 0, 1 << 20),
            BatchLookup(DATA_ID, 0, 9, 1 << 20), BatchLookup(uuid.uuid4(), 0, 0, 1 << 20)], 10)
        return (
            [(f.error_code, f.log_start_offset, f.high_watermark) for f in found],
            [[(b.object_key, b.base_offset, b.last_offset, b.byte_offset) for b in f.batches] for f in found],
            await coordinator.list_offsets(DATA_ID, 0, -2),  # earliest
            await coordinator.list_offsets(DATA_ID, 0, -1),  # latest
            await coordinator.list_offsets(DATA_ID, 1, -3),  # max timestamp
        )

    async def run() -> None:
        replicas, metadata = FakeReplicas(image), FakeMetadata(image)
        lg = Log.open(tmp_path / f"{DISKLESS_METADATA_TOPIC}-0-0", LogConfig(), topic_id=META_ID)
        replica = Partition(DISKLESS_METADATA_TOPIC, 0, META_ID, lg, 1)
        replica.update(image.topic(DISKLESS_METADATA_TOPIC).partitions[0])
        replicas.partitions[(DISKLESS_METADATA_TOPIC, 0)] = replica
        first = DisklessCoordinator(1, replicas, metadata, _no_controller, tmp_path / "first", config)
        first.start()
        try:
            await _loaded(first)
            created = [CP.DisklessCreatablePartitions(topic_id=DATA_ID, name="dl", num_partitions=2)]
            assert await first.create_partitions(0, created) == 0
            results = await first.commit_file(_commit(DATA_ID, "wal/a", [(0, 5, -1, -1), (0, 3, 42, 0), (1, 2, 42, 0)]), 1)
            assert [(r.error_code, r.base_offset) for r in results] == [(0, 0), (0, 5), (0, 0)]
            # producer 42 retries a batch in a new file: its original offset; a gap in its sequence: refused, retriably
            again = await first.commit_file(_commit(DATA_ID, "wal/b", [(0, 3, 42, 0), (0, 1, 42, 9)]), 1)
            assert [(r.error_code, r.base_offset, r.duplicate) for r in again] == [
                (0, 5, True), (Errors.NOT_LEADER_OR_FOLLOWER, -1, False)]
            assert await first.delete_records(DATA_ID, 0, 2) == (0, 2)
            expected = (
                [(0, 2, 8), (0, 0, 2), (Errors.OFFSET_OUT_OF_RANGE, 2, 8), (Errors.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)],
                [[("wal/a", 5, 7, 100)], [("wal/a", 0, 1, 200)], [], []],
                (0, -1, 2), (0, -1, 8), (0, MAX_TIMESTAMP, 0),
            )
            assert await answers(first) == expected
            assert (tmp_path / "first" / "diskless-coordinator" / "0.sqlite").exists()
        finally:
            first.shutdown()
        second = DisklessCoordinator(1, replicas, metadata, _no_controller, tmp_path / "second", config)
        second.start()
        try:
            await _loaded(second)
            assert await answers(second) == expected
        finally:
            second.shutdown()
            lg.close()

    asyncio.run(run())
