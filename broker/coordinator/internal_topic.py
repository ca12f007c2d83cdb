"""Creating a coordinator's internal topic (__consumer_offsets, __transaction_state) on first use:
a compacted topic, forwarded to the controller as CreateTopics, its replication factor capped at
the live brokers (as Kafka does for a cluster smaller than the configured factor)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from protocol.errors import Errors
from protocol.generated.create_topics import CreateTopicsRequest

if TYPE_CHECKING:
    from broker.ports import ImageSource

log = structlog.get_logger(__name__)


async def create_internal_topic(
    metadata: ImageSource, forward: Callable[[Any], Awaitable[Any]], name: str, partitions: int, replication_factor: int, configs: dict[str, str],
    *, min_isr: int | None = None,
) -> None:
    """Create `name` unless it exists. `min_isr`, when given, is capped at the replication factor
    used and set as min.insync.replicas. `forward` sends the request to the controller. Failures are logged: the next request that needs the
    topic tries again."""
    image = metadata.image
    if image.topic(name) is not None:
        return
    live = len(image.live_brokers()) or 1
    rf = max(1, min(replication_factor, live))
    settings = {"cleanup.policy": "compact", "compression.type": "producer", **configs}
    if min_isr is not None:
        settings["min.insync.replicas"] = str(max(1, min(min_isr, rf)))
    C = CreateTopicsRequest
    req = C(
        topics=[C.CreatableTopic(
            name=name, num_partitions=partitions, replication_factor=rf,
            configs=[C.CreatableTopicConfig(name=k, value=v) for k, v in settings.items()],
        )],
        timeout_ms=30000,
    )
    try:
        resp = await forward(req)
    except Exception as e:
        log.warning("internal_topic_create_failed", topic=name, error=repr(e))
        return
    for t in resp.topics:
        if t.error_code == 0:
            log.info("internal_topic_created", topic=name, partitions=partitions, replication_factor=rf,
                     configs=settings)
        elif t.error_code != Errors.TOPIC_ALREADY_EXISTS:
            log.warning("internal_topic_create_failed", topic=name, error_code=t.error_code, error=t.error_message)
