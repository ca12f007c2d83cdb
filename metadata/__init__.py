"""Cluster metadata shared by controller and brokers: record framing, MetadataImage, MetadataDelta."""

from metadata.image import (
    METADATA_TOPIC,
    METADATA_TOPIC_ID,
    BrokerInfo,
    ChunkInfo,
    MetadataDelta,
    MetadataImage,
    PartitionInfo,
    TopicInfo,
)
from metadata.records import decode_record, encode_record

__all__ = [
    "METADATA_TOPIC",
    "METADATA_TOPIC_ID",
    "BrokerInfo",
    "ChunkInfo",
    "MetadataDelta",
    "MetadataImage",
    "PartitionInfo",
    "TopicInfo",
    "decode_record",
    "encode_record",
]
