"""Replication throttle on the follower side (KIP-73): fetched bytes of throttled replicas are
held to follower.replication.throttled.rate (bytes/s) with a token bucket. Over the rate, the
throttled replicas sit out fetches (the others go on, as Kafka's fetcher does) until it recovers.
One bucket per broker serves the active chunk's follower fetches and the chunk copies (an
inactive chunk's new replica fetching its range), as Kafka's one quota serves all of a broker's
throttled replicas.

A replica is throttled when its topic's follower.replication.throttled.replicas lists
"<partition>:<this broker>" or is "*" (for a chunk replica: its partition's entry); the rate is
this broker's dynamic config (or the cluster-wide default, or server.properties).
kafka-reassign-partitions.sh --throttle sets both.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from broker.ports import ImageSource
from metadata.image import BROKER_RESOURCE, MetadataImage

RATE_KEY = "follower.replication.throttled.rate"
REPLICAS_KEY = "follower.replication.throttled.replicas"
# The log dir mover's rate: Kafka's name (what kafka-reassign-partitions.sh
# --replica-alter-log-dirs-throttle sets), then KIP-113's, which we took first and keep as an alias.
MOVE_RATE_KEYS = ("replica.alter.log.dirs.io.max.bytes.per.second", "intra.broker.throttled.rate")


def broker_rate(image: MetadataImage, node_id: int, props: Mapping[str, str], *keys: str) -> int | None:
    """A bytes/s broker config: this broker's dynamic value, else the cluster-wide default, else
    server.properties (in each, the first of `keys` set); None when unset or unlimited."""
    for layer in (image.configs.get((BROKER_RESOURCE, str(node_id)), {}), image.configs.get((BROKER_RESOURCE, ""), {}),
                  props):
        raw = next((layer[k] for k in keys if layer.get(k) is not None), None)
        if raw is not None:
            try:
                value = int(raw)
            except ValueError:
                return None
            return value if 0 < value < 2**62 else None
    return None


class Throttle:
    def __init__(self, images: ImageSource, node_id: int, props: Mapping[str, str]) -> None:
        """`props`: server.properties, the rate's last fallback."""
        self.images = images
        self.node_id = node_id
        self.props = props
        self._tokens = 0.0
        self._last = time.monotonic()
        self._rate_of: tuple[MetadataImage | None, int | None] = (None, None)  # (image, its rate)

    def rate(self) -> int | None:
        # asked several times per follower Fetch: worked out again only when the image changes
        image = self.images.image
        seen, rate = self._rate_of
        if image is not seen:
            rate = broker_rate(image, self.node_id, self.props, RATE_KEY)
            self._rate_of = (image, rate)
        return rate

    def applies(self, topic: str, index: int) -> bool:
        """Whether this broker's replica of partition `index` of `topic` is throttled."""
        if self.rate() is None:
            return False
        spec = self.images.image.topic_config(topic).get(REPLICAS_KEY, "")
        if spec.strip() == "*":
            return True
        want = f"{index}:{self.node_id}"
        return want in {x.strip() for x in spec.split(",")}

    def fetch_size(self, max_bytes: int) -> int:
        """Keep each throttled fetch small enough that the rate is smooth (about 1/4 s of it)."""
        rate = self.rate()
        return max_bytes if rate is None else max(1024, min(max_bytes, rate // 4))

    def _refill(self, rate: int) -> None:
        now = time.monotonic()
        self._tokens = min(self._tokens + (now - self._last) * rate, rate)  # at most one second of burst
        self._last = now

    def record(self, topic: str, index: int, nbytes: int) -> None:
        """Count `nbytes` fetched for that replica against the rate (if it is throttled)."""
        if not self.applies(topic, index):
            return
        rate = self.rate()
        if rate is None:
            return
        self._refill(rate)
        self._tokens -= nbytes

    def pause(self) -> float:
        """0 when under the rate; else how long to wait before throttled replicas fetch again, at
        most a quarter second so that a changed or removed rate applies promptly."""
        rate = self.rate()
        if rate is None:
            return 0.0
        self._refill(rate)
        return 0.0 if self._tokens >= 0 else min(-self._tokens / rate, 0.25)
