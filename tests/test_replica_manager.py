"""The replica manager without processes or sockets: real log dirs in tmp_path, fakes for its
collaborators (replica_ports.py), metadata deltas applied as the loader applies them (prepare, then
publish). A partition assigned here appears as leader, turns follower, and is removed with its dir;
JBOD placement follows the dir the metadata names (KIP-858) and reports where a replica lives."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from broker.config import BrokerConfig
from broker.replication.chunk_replica import ChunkReplica
from broker.replication.hosted import HostedReplicas
from broker.replication.partition import Partition
from broker.replication.replica_manager import ReplicaManager
from broker.storage.log_dir import LogDir
from metadata.image import ChunkInfo, MetadataDelta, MetadataImage
from node.config import NodeConfig
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.generated.metadata_records.partition_record import PartitionRecord
from protocol.generated.metadata_records.topic_record import TopicRecord

NODE = 1
CLUSTER = "test-cluster"


class FakeFetchers:
    def __init__(self) -> None:
        self.following: dict[tuple[str, int], int] = {}
        self.settled: list[tuple[str, int]] = []

    def follow(self, p: Partition, leader_id: int) -> None:
        self.following[(p.topic, p.index)] = leader_id

    def settle(self, p: Partition) -> None:
        self.settled.append((p.topic, p.index))

    def unfollow(self, p: Partition) -> None:
        self.following.pop((p.topic, p.index), None)


class FakeChunkCopies:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def copy_chunk(self, cr: ChunkReplica) -> None:
        self.calls.append(("copy", cr.key))

    def fill_prefix(self, p: Partition, required_end: int) -> None:
        self.calls.append(("prefix", p.topic, p.index, required_end))

    def report_leaving(self, topic: str, index: int, info: ChunkInfo) -> None:
        self.calls.append(("leaving", topic, index, info.start_offset))

    def cancel(self, topic: str, index: int, start: int) -> None:
        self.calls.append(("cancel", topic, index, start))


class FakeIsr:
    def follower_caught_up(self, p: Partition, replica_id: int) -> None:
        pass


class FakeDirReports:
    def __init__(self) -> None:
        self.reports: dict[tuple[uuid.UUID, int, int], uuid.UUID] = {}

    def report(self, topic_id: uuid.UUID, partition: int, chunk_start: int, dir_id: uuid.UUID) -> None:
        self.reports[(topic_id, partition, chunk_start)] = dir_id


def config(dirs: list[Path]) -> BrokerConfig:
    return BrokerConfig.from_node_config(NodeConfig({
        "process.roles": "broker", "node.id": str(NODE), "controller.quorum.voters": "100@127.0.0.1:9091",
        "controller.listener.names": "CONTROLLER", "listeners": "PLAINTEXT://127.0.0.1:9092",
        "log.dirs": ",".join(str(d) for d in dirs),
    }))


class Harness:
    """A replica manager over formatted log dirs, fed metadata the way the loader feeds it."""

    def __init__(self, tmp_path: Path, n_dirs: int = 2) -> None:
        paths = [tmp_path / f"logs-{i}" for i in range(n_dirs)]
        self.dirs = [LogDir(p) for p in paths]
        for d in self.dirs:
            d.format_or_check(NODE, CLUSTER)
        self.fetchers = FakeFetchers()
        self.chunks = FakeChunkCopies()
        self.reports = FakeDirReports()
        self.rm = ReplicaManager(config(paths), self.dirs, HostedReplicas(), self.reports, self.fetchers, self.chunks,
                                 FakeIsr())
        self.leadership: list[tuple[str, int, bool]] = []
        self.rm.leadership_listeners.append(lambda p, led: self.leadership.append((p.topic, p.index, led)))
        self.rm.load_dirs()
        self.image = MetadataImage.EMPTY

    async def apply(self, *records: Any) -> None:
        delta = MetadataDelta(self.image)
        for r in records:
            delta.replay(r, self.image.offset + 1)
        image = delta.apply()
        await self.rm.prepare(delta, image)
        self.image = image
        await self.rm.on_metadata(delta, image)


def test_a_replica_appears_as_leader_turns_follower_and_is_removed(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        rm, tid = h.rm, uuid.uuid4()
        await h.apply(TopicRecord(name="t", topic_id=tid),
                      PartitionRecord(partition_id=0, topic_id=tid, replicas=[NODE, 2], isr=[NODE, 2], leader=NODE,
                                      leader_epoch=0, partition_epoch=0))
        p = rm.get("t", 0)
        assert p is not None and p.is_leader and p.leader_epoch == 0
        assert h.leadership == [("t", 0, True)]
        assert ("t", 0) not in h.fetchers.following
        home = rm.dir_of(("t", 0, 0))
        assert home is not None and home.replica_dir("t", 0, 0).is_dir()
        # unassigned in the metadata: the controller hears where it was placed (KIP-858)
        assert h.reports.reports == {(tid, 0, 0): home.known_id}

        await h.apply(PartitionChangeRecord(partition_id=0, topic_id=tid, leader=2))
        assert rm.get("t", 0) is p and not p.is_leader and p.leader_epoch == 1
        assert h.leadership[-1] == ("t", 0, False)
        assert h.fetchers.following == {("t", 0): 2}

        await h.apply(PartitionChangeRecord(partition_id=0, topic_id=tid, leader=2, replicas=[2, 3], isr=[2, 3]))
        assert rm.get("t", 0) is None and rm.dir_of(("t", 0, 0)) is None
        assert not home.replica_dir("t", 0, 0).exists()
        assert h.fetchers.following == {}
        assert ("cancel", "t", 0, 0) in h.chunks.calls
        rm.shutdown()

    asyncio.run(scenario())


def test_placement_follows_the_dir_the_metadata_names(tmp_path: Path) -> None:
    async def scenario() -> None:
        h = Harness(tmp_path)
        rm, tid = h.rm, uuid.uuid4()
        second = h.dirs[1]
        assert second.known_id is not None
        await h.apply(TopicRecord(name="t", topic_id=tid),
                      PartitionRecord(partition_id=0, topic_id=tid, replicas=[NODE], isr=[NODE], leader=NODE,
                                      leader_epoch=0, partition_epoch=0, directories=[second.known_id]))
        assert rm.dir_of(("t", 0, 0)) is second and second.replica_dir("t", 0, 0).is_dir()
        assert h.reports.reports == {}  # where the metadata says: nothing to tell
        rm.shutdown()
        # every log closed: each dir gets its clean-shutdown marker, and a new manager finds the replica
        again = Harness(tmp_path)
        found = again.rm.dir_of(("t", 0, 0))
        assert found is not None and found.path == second.path
        again.rm.shutdown()

    asyncio.run(scenario())
