"""The controller's metrics (Kafka's KafkaController beans), read from its image when scraped."""

from __future__ import annotations

from metadata.image import MetadataImage
from node.metrics import Family

PREFIX = "kafka_controller_kafkacontroller_"


def collect(image: MetadataImage, active: bool) -> list[Family]:
    partitions = [p for t in image.topics.values() for p in t.partitions.values()]
    fenced = sum(1 for b in image.brokers.values() if b.fenced)
    return [
        # 1 on the quorum leader once it serves, 0 on standbys (their sum over a cluster is 1)
        Family(PREFIX + "activecontrollercount", "gauge", "1 on the active controller.").add(1 if active else 0),
        Family(PREFIX + "offlinepartitionscount", "gauge", "Partitions without a leader.")
        .add(sum(1 for p in partitions if p.leader < 0)),
        Family(PREFIX + "preferredreplicaimbalancecount", "gauge", "Partitions not led by their first replica.")
        .add(sum(1 for p in partitions if p.replicas and p.leader != p.replicas[0])),
        Family(PREFIX + "globaltopiccount", "gauge", "Topics.").add(len(image.topics)),
        Family(PREFIX + "globalpartitioncount", "gauge", "Partitions.").add(len(partitions)),
        Family(PREFIX + "fencedbrokercount", "gauge", "Registered brokers that are fenced.").add(fenced),
        Family(PREFIX + "activebrokercount", "gauge", "Registered brokers that are not fenced.")
        .add(len(image.brokers) - fenced),
        Family("kafka_controller_kafkacontroller_lastcommittedrecordoffset", "gauge",
               "Offset of the last metadata record in the controller's image.").add(image.offset),
    ]
