"""The client instances of KIP-714 on this broker: what each is told to push
(GetTelemetrySubscriptions, from the image's client metrics subscriptions), the checks on each
push (PushTelemetry: subscription id, interval, size, compression, payload) and the latest value
of every pushed series, exported on the broker's Prometheus endpoint with the client's labels.

Counters are asked for cumulatively (DeltaTemporality false), so a pushed sum is the value to
export; a client not heard from for three push intervals (at least a minute) is forgotten, and
one that pushes with Terminating is forgotten at once."""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from metadata.client_metrics import Plan, plan, subscriptions
from node.metrics import Family
from protocol.errors import Errors, ProtocolError
from protocol.otlp import decode_metrics_data
from protocol.records.compression import Compression, decompress

log = structlog.get_logger(__name__)

# zstd, lz4, gzip: Kafka's order; snappy is left out (its framing in a push is not pinned down)
ACCEPTED_COMPRESSION = (Compression.ZSTD, Compression.LZ4, Compression.GZIP)
TELEMETRY_MAX_BYTES = 1 << 20  # Kafka's telemetry.max.bytes default
MIN_EXPIRY_S = 60.0
# bounds, so a client minting instance ids or series cannot grow the broker without end (Kafka
# bounds its client instance cache too): the least recently heard instance goes first
MAX_CLIENTS = 16384
MAX_SERIES_PER_CLIENT = 2000
MAX_LABELS_PER_CLIENT = 64  # its identity and the resource attributes it pushes
EXPIRE_EVERY_S = 1.0  # a scan of every instance at most this often, not on every request
_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL = re.compile(r"[^a-zA-Z0-9_]")


@dataclass
class ClientInstance:
    instance_id: uuid.UUID
    labels: dict[str, str]  # the client's identity (KIP-714's match keys), its resource attributes
    plan: Plan
    heard: float  # monotonic: the last request
    last_push: float = 0.0
    # (metric name, kind, point labels) -> (value, monotonic sum)
    series: dict[tuple[str, str, tuple[tuple[str, str], ...]], tuple[float, bool]] = field(default_factory=dict)


def _add_labels(labels: dict[str, str], new: dict[str, str], *, replace: bool) -> None:
    """Labels of a client, at most MAX_LABELS_PER_CLIENT: a client pushing ever new resource
    attributes cannot grow its instance without end."""
    for k, v in new.items():
        if k in labels:
            if replace:
                labels[k] = v
        elif len(labels) < MAX_LABELS_PER_CLIENT:
            labels[k] = v


def prometheus_name(metric: str, kind: str, monotonic: bool) -> str:
    name = _NAME.sub("_", metric)
    if kind in ("histogram_count", "histogram_sum"):
        return f"{name}_{kind.removeprefix('histogram_')}"
    return f"{name}_total" if monotonic and not name.endswith("_total") else name


class ClientTelemetry:
    def __init__(self, image: Callable[[], Any], clock: Callable[[], float] = time.monotonic) -> None:
        self.image = image  # the current MetadataImage
        self.clock = clock
        # least recently heard first: the bound evicts from the front in O(1)
        self.clients: OrderedDict[uuid.UUID, ClientInstance] = OrderedDict()
        self.pushes = 0
        self._expired_at = float("-inf")

    def _plan(self, identity: dict[str, str]) -> Plan:
        return plan(subscriptions(self.image()), identity)

    def get_subscriptions(self, instance_id: uuid.UUID, identity: dict[str, str]) -> tuple[uuid.UUID, Plan]:
        """The client's instance id (a new one if it sent zero) and what it is to push."""
        self._expire()
        if instance_id.int == 0:
            instance_id = uuid.uuid4()
        ident = {**identity, "client_instance_id": str(instance_id)}
        p = self._plan(ident)
        c = self.clients.get(instance_id)
        now = self.clock()
        if c is None:
            self._make_room()
            self.clients[instance_id] = ClientInstance(instance_id, ident, p, now)
        else:
            _add_labels(c.labels, ident, replace=True)
            c.plan, c.heard = p, now
            self.clients.move_to_end(instance_id)
        return instance_id, p

    def push(self, instance_id: uuid.UUID, subscription_id: int, terminating: bool, compression: int,
             payload: bytes, identity: dict[str, str]) -> tuple[int, str | None]:
        """(error code, why) for one PushTelemetry."""
        now = self.clock()
        ident = {**identity, "client_instance_id": str(instance_id)}
        c = self.clients.get(instance_id)
        if c is None:  # pushed to a broker it never asked (or one that forgot it): Kafka takes it
            self._make_room()
            c = self.clients[instance_id] = ClientInstance(instance_id, ident, self._plan(ident), now)
        c.heard = now
        self.clients.move_to_end(instance_id)
        current = self._plan(c.labels)
        if subscription_id != current.subscription_id:
            c.plan = current
            return Errors.UNKNOWN_SUBSCRIPTION_ID, "the subscriptions changed: ask again"
        if not terminating and c.last_push and now - c.last_push < current.interval_ms / 2000:
            # half the interval: clients add jitter to it (Kafka refuses any push before it)
            return Errors.THROTTLING_QUOTA_EXCEEDED, f"pushed again within {current.interval_ms // 2} ms"
        if len(payload) > TELEMETRY_MAX_BYTES:
            return Errors.TELEMETRY_TOO_LARGE, f"{len(payload)} bytes, at most {TELEMETRY_MAX_BYTES}"
        if compression != Compression.NONE and compression not in ACCEPTED_COMPRESSION:
            return Errors.UNSUPPORTED_COMPRESSION_TYPE, f"compression {compression} is not accepted"
        try:
            data = decompress(compression, payload, TELEMETRY_MAX_BYTES * 16)
            decoded = decode_metrics_data(data)
        except ProtocolError as e:
            log.warning("telemetry_push_invalid", client_instance_id=str(instance_id), error=str(e))
            return Errors.INVALID_RECORD, str(e)
        c.last_push = now
        self.pushes += 1
        if terminating:
            self.clients.pop(instance_id, None)
            return 0, None
        wanted = current.requested
        for m in decoded:
            _add_labels(c.labels, m.resource, replace=False)
            for p in m.points:
                if wanted != ("",) and not any(p.metric.startswith(w) for w in wanted):
                    continue
                key = (p.metric, p.kind, tuple(sorted(p.attributes.items())))
                if key in c.series or len(c.series) < MAX_SERIES_PER_CLIENT:
                    c.series[key] = (p.value, p.monotonic)
        return 0, None

    def _make_room(self) -> None:
        self._expire()
        while len(self.clients) >= MAX_CLIENTS:
            self.clients.popitem(last=False)

    def _expire(self) -> None:
        now = self.clock()
        if now - self._expired_at < EXPIRE_EVERY_S:
            return
        self._expired_at = now
        for iid, c in list(self.clients.items()):
            if now - c.heard > max(3 * c.plan.interval_ms / 1000, MIN_EXPIRY_S):
                del self.clients[iid]

    def families(self) -> list[Family]:
        """Every client's latest series, one family per metric, labelled with the client."""
        self._expire()
        by_name: dict[str, Family] = {}
        for c in self.clients.values():
            base = {_LABEL.sub("_", k): v for k, v in sorted(c.labels.items())}
            for (metric, kind, attrs), (value, monotonic) in sorted(c.series.items()):
                name = prometheus_name(metric, kind, monotonic)
                fam = by_name.get(name)
                if fam is None:
                    ftype = "counter" if monotonic and kind == "sum" else "gauge"
                    fam = by_name[name] = Family(name, ftype, f"KIP-714 client metric {metric}")
                labels = {**base, **{_LABEL.sub("_", k): v for k, v in attrs}}
                fam.add(value, labels)
        return list(by_name.values())
