"""KIP-714 client metrics subscriptions, as the image holds them (CLIENT_METRICS config resources):
which of them match a client, and what a client is told to push (Kafka's ClientMetricsManager's
rules). Pure functions of the image and the client's identity."""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from metadata.config_defs import CLIENT_METRICS_CONFIGS
from metadata.image import CLIENT_METRICS_RESOURCE, MetadataImage

DEFAULT_INTERVAL_MS = int(CLIENT_METRICS_CONFIGS["interval.ms"].default or 300000)
ALL_METRICS = "*"


@dataclass(frozen=True)
class Subscription:
    name: str
    metrics: tuple[str, ...]  # name prefixes; "*" for all
    interval_ms: int
    match: tuple[tuple[str, str], ...]  # (client attribute, regex): all must match the whole value


@dataclass(frozen=True)
class Plan:
    """What a client is told: the metric prefixes to push ([] none, [""] all) and how often."""

    subscription_id: int
    requested: tuple[str, ...]
    interval_ms: int


def _list(value: str | None) -> tuple[str, ...]:
    return tuple(x.strip() for x in (value or "").split(",") if x.strip())


def subscriptions(image: MetadataImage) -> list[Subscription]:
    out = []
    for (rtype, name), cfg in sorted(image.configs.items()):
        if rtype != CLIENT_METRICS_RESOURCE:
            continue
        match = []
        for entry in _list(cfg.get("match")):
            key, _, pattern = entry.partition("=")
            match.append((key.strip(), pattern.strip()))
        out.append(Subscription(name, _list(cfg.get("metrics")),
                                int(cfg.get("interval.ms") or DEFAULT_INTERVAL_MS), tuple(match)))
    return out


def matches(sub: Subscription, client: Mapping[str, str]) -> bool:
    """Every match pattern must match the whole of the client's attribute (a subscription with
    no patterns matches every client)."""
    for key, pattern in sub.match:
        try:
            if re.fullmatch(pattern, client.get(key, "")) is None:
                return False
        except re.error:
            return False
    return True


def plan(subs: list[Subscription], client: Mapping[str, str]) -> Plan:
    """Merge the subscriptions matching `client`: the union of their metrics ("*" or an empty
    prefix: all, sent as one empty string), the smallest interval; none matching: nothing to push,
    asked again after the default interval. The id changes whenever the answer does."""
    mine = [s for s in subs if matches(s, client) and s.metrics]
    if not mine:
        requested: tuple[str, ...] = ()
        interval = DEFAULT_INTERVAL_MS
    else:
        prefixes = sorted({m for s in mine for m in s.metrics})
        requested = ("",) if ALL_METRICS in prefixes or "" in prefixes else tuple(prefixes)
        interval = min(s.interval_ms for s in mine)
    digest = zlib.crc32(("|".join(requested) + f"#{interval}#" + ",".join(s.name for s in mine)).encode())
    return Plan(digest - (1 << 32) if digest >= 1 << 31 else digest, requested, interval)
