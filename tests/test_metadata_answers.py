"""Metadata's partition entries are built once per topic version (broker/metadata_answers.py),
checked on real images built from metadata records: an unchanged topic's entries are shared
between answers; a change to the topic, or to the brokers (whose fencing decides the offline
replicas), builds them again; a diskless topic's are never shared (they are rewritten per client)."""

from __future__ import annotations

import uuid

from broker.metadata_answers import PartitionEntryCache
from metadata.image import MetadataDelta, MetadataImage
from protocol.generated.metadata_records.partition_change_record import PartitionChangeRecord
from protocol.generated.metadata_records.partition_record import PartitionRecord
from protocol.generated.metadata_records.register_broker_record import RegisterBrokerRecord
from protocol.generated.metadata_records.topic_record import TopicRecord


def test_entries_are_shared_until_the_topic_or_the_brokers_change() -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    delta = MetadataDelta(MetadataImage.EMPTY)
    delta.replay(RegisterBrokerRecord(broker_id=1, incarnation_id=uuid.uuid4(), broker_epoch=1, fenced=False), 0)
    for name, tid in (("a", a), ("b", b)):
        delta.replay(TopicRecord(name=name, topic_id=tid), 1)
        for i in range(3):
            delta.replay(PartitionRecord(partition_id=i, topic_id=tid, replicas=[1, 2], isr=[1], leader=1,
                                         leader_epoch=0), 2)
    first = delta.apply()
    cache = PartitionEntryCache()
    ta = first.topics[a]
    entries_a = cache.entries(first, ta)
    assert [e.partition_index for e in entries_a] == [0, 1, 2] and entries_a[0].offline_replicas == [2]
    assert cache.entries(first, ta) is entries_a  # built once

    change = MetadataDelta(first)
    change.replay(PartitionChangeRecord(partition_id=1, topic_id=b, leader=2, isr=[2]), 3)
    second = change.apply()
    assert second.topics[a] is ta and cache.entries(second, second.topics[a]) is entries_a  # a did not change
    entries_b = cache.entries(second, second.topics[b])
    assert entries_b[1].leader_id == 2  # b did: built again
    assert cache.entries(second, second.topics[b]) is entries_b

    brokers = MetadataDelta(second)
    brokers.replay(RegisterBrokerRecord(broker_id=2, incarnation_id=uuid.uuid4(), broker_epoch=2, fenced=False), 4)
    third = brokers.apply()
    again = cache.entries(third, third.topics[a])
    assert again is not entries_a and list(again[0].offline_replicas) == []  # broker 2 is live now


def test_a_diskless_topics_entries_are_built_for_each_answer() -> None:
    tid = uuid.uuid4()
    delta = MetadataDelta(MetadataImage.EMPTY)
    delta.replay(TopicRecord(name="d", topic_id=tid), 0)
    delta.replay(PartitionRecord(partition_id=0, topic_id=tid, replicas=[], isr=[], leader=-1, leader_epoch=0,
                                 diskless_coordinator=0), 1)
    image = delta.apply()
    cache = PartitionEntryCache()
    assert cache.entries(image, image.topics[tid]) is not cache.entries(image, image.topics[tid])
