"""What the broker's components use of one another, as small structural interfaces.

A component names the port it needs in its constructor and the composition root
(``broker.broker.Broker``) hands it the object that plays the part: the metadata loader is the
image source, the controller channel is the controller link, and so on. A test builds the same
component with a fake that has just these members, without processes or sockets.

Nothing here imports a concrete component, so any module may import this one without making an
import circle.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from metadata.image import Endpoint, MetadataImage

# This broker's epoch as last registered with the controller (-1 before registration): followers
# send it on their Fetch and AlterPartition carries it, as KRaft brokers do (KIP-380, KIP-841).
BrokerEpoch = Callable[[], int]


class ImageSource(Protocol):
    """The current metadata image (KRaft: the broker's latest published MetadataImage)."""

    @property
    def image(self) -> MetadataImage: ...


class MetadataView(ImageSource, Protocol):
    """The image plus the means to wait for it: caught up with the controller's log at startup,
    or past an offset the controller named."""

    caught_up: asyncio.Event

    async def sync(self, timeout: float = 30.0) -> bool: ...

    async def wait_for_offset(self, offset: int, timeout: float = 30.0) -> bool: ...


class ControllerLink(Protocol):
    """Requests to the active controller (heartbeats, AlterPartition, AssignReplicasToDirs,
    chunk assignment changes), re-sent to a new leader on NOT_CONTROLLER."""

    async def request(
        self, body: Any, version: int | None = None, *, timeout: float | None = None, retry: bool = True
    ) -> Any: ...

    async def version_for(self, api_key: int) -> int: ...


class Forwarder(Protocol):
    """Sends an admin request to the controller and answers once this broker's image holds its
    effect (KIP-590's forwarding, with the wait for the metadata that KRaft brokers do)."""

    def __call__(self, body: Any, version: int | None = None, *, read_only: bool = False) -> Awaitable[Any]: ...


class TaskSpawner(Protocol):
    """Runs a coroutine as a task the broker owns: cancelled at shutdown, never left dangling."""

    def __call__(self, coro: Coroutine[Any, Any, Any]) -> None: ...


class PeerDirectory(Protocol):
    """Where other brokers serve this broker's inter-broker listener, as the image says."""

    def endpoint(self, broker_id: int) -> Endpoint | None: ...

    def live(self, broker_id: int) -> bool: ...


class PeerListing:
    """The PeerDirectory of a broker: endpoints read from the current image on `listener`."""

    def __init__(self, images: ImageSource, listener: str) -> None:
        self._images = images
        self._listener = listener

    def endpoint(self, broker_id: int) -> Endpoint | None:
        info = self._images.image.brokers.get(broker_id)
        return info.endpoint(self._listener) if info is not None else None

    def live(self, broker_id: int) -> bool:
        info = self._images.image.brokers.get(broker_id)
        return info is not None and not info.fenced and info.endpoint(self._listener) is not None


if TYPE_CHECKING:
    from broker.replication.partition import Partition


class LocalReplicas(Protocol):
    """The replicas this broker hosts (the ReplicaManager), as a coordinator of an internal topic
    uses them: its partitions, a topic's config, and a call whenever this broker becomes or stops
    being a partition's leader (Kafka's coordinators load and unload on exactly these)."""

    partitions: dict[tuple[str, int], Partition]
    leadership_listeners: list[Callable[[Partition, bool], None]]

    def get(self, topic: str, index: int) -> Partition | None: ...

    def topic_config(self, topic: str) -> dict[str, str]: ...
