"""Strata's client library for what stock clients cannot carry: KIP-253's OrderedProducer and
OrderedConsumer (keyed order across partition count changes), on protocol/ and node/."""

from client.consumer import ConsumerRecord, GroupError, OrderedConsumer, PartitionKeyRebalanceListener
from client.partitioner import murmur2, partition_for
from client.producer import OrderedProducer, RecordMetadata

__all__ = [
    "ConsumerRecord",
    "GroupError",
    "OrderedConsumer",
    "OrderedProducer",
    "PartitionKeyRebalanceListener",
    "RecordMetadata",
    "murmur2",
    "partition_for",
]
