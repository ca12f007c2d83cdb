"""Fakes of the broker's ports (broker/ports.py) for tests that build a coordinator in-process:
just the members the component uses, over real logs and Partition objects the test creates."""

from __future__ import annotations

import asyncio

from broker.replication.partition import Partition
from metadata import MetadataImage


class FakeReplicas:
    """The replica manager as a coordinator uses it: the replicas here, the image they follow,
    the leadership listeners, topic configs."""

    def __init__(self, image: MetadataImage = MetadataImage.EMPTY) -> None:
        self.image = image
        self.partitions: dict[tuple[str, int], Partition] = {}
        self.leadership_listeners: list = []

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def topic_config(self, topic: str) -> dict[str, str]:
        return {"min.insync.replicas": "1"}


class FakeMetadata:
    """The metadata view: a fixed image (empty by default: partition counts then come from the
    component's config), caught up with the controller."""

    def __init__(self, image: MetadataImage = MetadataImage.EMPTY) -> None:
        self.image = image
        self.caught_up = asyncio.Event()
        self.caught_up.set()

    async def sync(self, timeout: float = 30.0) -> bool:
        return True

    async def wait_for_offset(self, offset: int, timeout: float = 30.0) -> bool:
        return True
