"""The metadata image's replay of partition records, and the decoders' shared UUIDs (built in
process: no nodes)."""

from __future__ import annotations

import dataclasses
import uuid

from metadata.image import MetadataDelta, MetadataImage
from metadata.records import decode_record, encode_record
from protocol.codec_runtime import uuid_of
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.generated.metadata_records.partition_record import PartitionRecord
from protocol.generated.metadata_records.topic_record import TopicRecord

PR = PartitionRecord


def _image_with_one_partition(tid: uuid.UUID, d1: uuid.UUID, d2: uuid.UUID) -> MetadataImage:
    """A partition with every field away from its default."""
    delta = MetadataDelta(MetadataImage.EMPTY)
    delta.replay(TopicRecord(name="t", topic_id=tid), 0)
    delta.replay(PR(
        partition_id=3, topic_id=tid, replicas=[1, 2, 3], isr=[1, 2], removing_replicas=[3], adding_replicas=[2],
        leader=1, leader_epoch=7, partition_epoch=9, directories=[d1, d2, d1], eligible_leader_replicas=[3],
        last_known_elr=[2], start_offset=500, start_timestamp=1234, diskless_coordinator=4,
        leader_epoch_after_creation=[PR.PartitionEpochAfterCreation(partition_id=0, leader_epoch=5)],
        leader_epoch_before_deletion=[PR.PartitionEpochBeforeDeletion(partition_id=1, leader_epoch=6)],
    ), 1)
    return delta.apply()


def test_a_partition_change_keeps_every_field_it_does_not_name() -> None:
    tid, d1, d2 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    image = _image_with_one_partition(tid, d1, d2)
    before = image.topics[tid].partitions[3]
    delta = MetadataDelta(image)
    delta.replay(PartitionChangeRecord(partition_id=3, topic_id=tid, isr=[1]), 2)
    after = delta.apply().topics[tid].partitions[3]
    assert after.isr == (1,) and after.partition_epoch == before.partition_epoch + 1
    for f in dataclasses.fields(after):  # a field added later must be carried over too
        if f.name not in ("isr", "partition_epoch"):
            assert getattr(after, f.name) == getattr(before, f.name), f.name


def test_a_partition_change_naming_a_leader_or_a_chunk_starts_a_leader_epoch() -> None:
    tid = uuid.uuid4()
    image = _image_with_one_partition(tid, uuid.uuid4(), uuid.uuid4())
    delta = MetadataDelta(image)
    delta.replay(PartitionChangeRecord(partition_id=3, topic_id=tid, leader=2), 2)
    led = delta.apply()
    p = led.topics[tid].partitions[3]
    assert (p.leader, p.leader_epoch) == (2, 8)
    delta = MetadataDelta(led)
    delta.replay(PartitionChangeRecord(partition_id=3, topic_id=tid, start_offset=900, start_timestamp=99), 3)
    p = delta.apply().topics[tid].partitions[3]
    assert (p.leader, p.leader_epoch, p.start_offset, p.start_timestamp) == (2, 9, 900, 99)


def test_partitions_share_their_topics_uuid_and_equal_tuples() -> None:
    tid, d = uuid.uuid4(), uuid.uuid4()
    delta = MetadataDelta(MetadataImage.EMPTY)
    delta.replay(TopicRecord(name="t", topic_id=tid), 0)
    for i in range(3):  # through the wire format, as a broker replays them
        rec, _ = decode_record(encode_record(PR(partition_id=i, topic_id=tid, replicas=[1, 2], isr=[1, 2],
                                                leader=1, leader_epoch=0, directories=[d, d])))
        delta.replay(rec, i + 1)
    parts = list(delta.apply().topics[tid].partitions.values())
    assert all(p.topic_id is parts[0].topic_id and p.topic_id == tid for p in parts)
    assert all(p.replicas is parts[0].replicas and p.directories is parts[0].directories for p in parts)
    assert parts[0].replicas == (1, 2) and parts[0].directories == (d, d)


def test_decoded_uuids_are_equal_and_shared() -> None:
    u = uuid.uuid4()
    a, b = uuid_of(u.bytes), uuid_of(bytes(u.bytes))
    assert a == u and a is b and hash(a) == hash(u) and str(a) == str(u) and a.version == 4
    assert uuid_of(bytes(16)) == uuid.UUID(int=0)
