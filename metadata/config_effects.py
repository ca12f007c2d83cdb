"""What each config key does in Strata: every broker, controller and topic key is in one of three
classes, so no setting is silently without effect.

- **effect**: read by the code that obeys it (every key of the catalogs not listed below, and
  Strata's own keys, STRATA_KEYS); where the effect is not quite Kafka's, DIFFERS says how.
- **refused**: Strata cannot do what the key asks, so any value but the one it behaves as is
  refused, at start (server.properties, also as `listener.name.<l>.<key>`) and by CreateTopics /
  AlterConfigs / IncrementalAlterConfigs, with a message naming the key.
- **ignored**: accepted, so a Kafka properties file starts unchanged, but without effect here
  (a thread pool or socket tuning of Kafka's design); `kafka-configs.sh --describe` marks each one
  with the reason.

A topic key's broker synonyms (log.cleanup.policy for cleanup.policy, ...) share its class.
tests/test_config_table.py walks the whole table against running processes.
"""

from __future__ import annotations

from collections.abc import Mapping

from metadata.broker_defaults import BROKER_CATALOG
from metadata.config_defs import BROKER_CONFIGS, TOPIC_CONFIGS

_ONE_LOOP = "one asyncio event loop per process serves every request: no network or I/O thread pools"
_FOLLOWER_THROTTLE = ("the replication throttle is applied on the follower side only (KIP-73's "
                      "follower.replication.throttled.replicas and .rate), which bounds the same bytes")
_OS_SOCKETS = "sockets keep the operating system's buffer sizes and backlog"
_NO_RECOMPRESSION = "batches are stored as producers compressed them (compression.type=producer only)"
_PEM = ("Strata reads PEM files: set ssl.certificate.location, ssl.key.location (ssl.key.password) and "
        "ssl.ca.location instead of a JKS/PKCS12 store")
_TIERED = "tiered storage (KIP-405) is not offered; diskless topics (diskless.enable, KIP-1164) keep data in object storage"

IGNORED_TOPIC: dict[str, str] = {
    "compression.gzip.level": _NO_RECOMPRESSION,
    "compression.lz4.level": _NO_RECOMPRESSION,
    "compression.zstd.level": _NO_RECOMPRESSION,
    "leader.replication.throttled.replicas": _FOLLOWER_THROTTLE,
    "preallocate": "segment files grow by appends; preallocation is a filesystem hint not taken",
}

# key -> (the one value accepted, why anything else is refused)
REFUSED_TOPIC: dict[str, tuple[str, str]] = {
    "compression.type": ("producer", _NO_RECOMPRESSION),
    "flush.messages": (str(2**63 - 1), "durability comes from replication and an fsync at each segment roll "
                                       "(Kafka's defaults); per-message or timed fsync is not offered"),
    "flush.ms": (str(2**63 - 1), "durability comes from replication and an fsync at each segment roll "
                                 "(Kafka's defaults); per-message or timed fsync is not offered"),
    "local.retention.bytes": ("-2", _TIERED),
    "local.retention.ms": ("-2", _TIERED),
    "remote.log.copy.disable": ("false", _TIERED),
    "remote.log.delete.on.disable": ("false", _TIERED),
    "remote.storage.enable": ("false", _TIERED),
}

IGNORED_BROKER: dict[str, str] = {
    "background.threads": _ONE_LOOP,
    "num.io.threads": _ONE_LOOP,
    "num.network.threads": _ONE_LOOP,
    "queued.max.requests": "admission is bounded by bytes (queued.max.request.bytes), not by a request count",
    "fetch.max.bytes": "a Fetch is answered up to the request's own max_bytes",
    "leader.imbalance.per.broker.percentage": "every partition led away from its preferred leader is moved back "
                                              "at each leader.imbalance.check.interval.seconds",
    "leader.replication.throttled.rate": _FOLLOWER_THROTTLE,
    "log.cleaner.threads": "compaction runs on one log-cleaner thread per broker",
    "log.cleaner.io.buffer.load.factor": "the cleaner's key map is sized by log.cleaner.dedupe.buffer.size alone",
    "log.cleaner.io.buffer.size": "the cleaner reads whole segments through the page cache",
    "log.cleaner.io.max.bytes.per.second": "compaction is not rate-limited",
    "log.flush.offset.checkpoint.interval.ms": "recovery points are checkpointed with the other checkpoints "
                                               "(replica.high.watermark.checkpoint.interval.ms)",
    "log.flush.scheduler.interval.ms": "there is no timed flush (flush.ms is refused but at its default)",
    "max.connection.creation.rate": "connection creation is limited per IP (the ips quota "
                                    "connection_creation_rate, KIP-612), not per broker",
    "metadata.log.segment.bytes": "the metadata log is bounded by snapshots "
                                  "(metadata.log.max.record.bytes.between.snapshots)",
    "metadata.max.retention.bytes": "the metadata log is bounded by snapshots "
                                    "(metadata.log.max.record.bytes.between.snapshots)",
    "num.replica.alter.log.dirs.threads": "log dir moves run on num.replica.move.threads",
    "num.replica.fetchers": "followers fetch over one connection per leader broker with two lanes",
    "replica.fetch.backoff.ms": "a follower retries a failed fetch after its own short backoff",
    "replica.fetch.min.bytes": "a follower's Fetch returns as soon as any byte is there",
    "replica.fetch.response.max.bytes": "a follower's Fetch is bounded per partition (replica.fetch.max.bytes)",
    "replica.socket.receive.buffer.bytes": _OS_SOCKETS,
    "replica.socket.timeout.ms": "follower requests time out after replica.lag.time.max.ms",
    "request.timeout.ms": "requests to the controller have their own timeouts per request kind",
    "socket.listen.backlog.size": _OS_SOCKETS,
    "socket.receive.buffer.bytes": _OS_SOCKETS,
    "socket.send.buffer.bytes": _OS_SOCKETS,
}

REFUSED_BROKER: dict[str, tuple[str | None, str]] = {
    "delete.topic.enable": ("true", "topics can always be deleted"),
    "replica.selector.class": (None, "no follower fetching by a replica selector (KIP-392): the preferred read "
                                     "replica serves inactive chunks only"),
    "ssl.enabled.protocols": ("TLSv1.2,TLSv1.3", "TLS 1.2 and 1.3 are both enabled, as Python's ssl offers them"),
    "ssl.protocol": ("TLSv1.3", "TLS 1.2 and 1.3 are both enabled, as Python's ssl offers them"),
    "ssl.keystore.location": (None, _PEM),
    "ssl.keystore.password": (None, _PEM),
    "ssl.keystore.type": ("JKS", _PEM),
    "ssl.truststore.location": (None, _PEM),
    "ssl.truststore.password": (None, _PEM),
    "ssl.truststore.type": ("JKS", _PEM),
}

# Keys with an effect that is not quite Kafka's: how it differs
DIFFERS: dict[str, str] = {
    "num.recovery.threads.per.data.dir": ("threads for the whole broker, not per log dir: opening a log is "
                                          "Python under one interpreter lock, and more threads only contend"),
}

# Strata's own keys, and Kafka keys outside its broker catalog (metadata.broker_defaults) that
# Strata reads: each has an effect (docs/: the page of each feature)
STRATA_KEYS: tuple[str, ...] = (
    "admission.lag.target.ms", "allow.everyone.if.no.acl.found", "bootstrap.scram.credentials", "cluster.id",
    "controller.quorum.election.timeout.ms", "controller.quorum.fetch.timeout.ms",
    "eligible.leader.replicas.enable",  # Kafka 3.x's KIP-966 switch; 4.x turns the feature on with a tool
    "intra.broker.throttled.rate", "log.level", "log.open.files.max", "loop.lag.log.interval.ms",
    "max.request.partition.size.limit", "metadata.log.max.record.bytes.between.snapshots", "metrics.listener",
    "num.replica.move.threads", "partition.deletion.check.interval.ms",
    "replica.alter.log.dirs.io.max.bytes.per.second", "ssl.ca.location", "ssl.certificate.location",
    "ssl.key.location", "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "transaction.remove.expired.transaction.cleanup.interval.ms", "transaction.state.log.load.buffer.size",
)
# key families read by prefix: per-listener settings, diskless storage, KIP-848 groups
STRATA_PREFIXES: tuple[str, ...] = ("listener.name.", "diskless.", "group.consumer.", "group.share.",
                                      "share.coordinator.")


def _with_synonyms() -> tuple[dict[str, str], dict[str, tuple[str | None, str]]]:
    ignored, refused = dict(IGNORED_BROKER), dict(REFUSED_BROKER)
    for name, d in TOPIC_CONFIGS.items():
        for syn, mult in d.synonyms:
            if name in IGNORED_TOPIC:
                ignored.setdefault(syn, IGNORED_TOPIC[name])
            elif name in REFUSED_TOPIC:
                allowed, why = REFUSED_TOPIC[name]
                refused.setdefault(syn, (allowed if mult == 1 else None, why))
    return ignored, refused


IGNORED, REFUSED = _with_synonyms()
IGNORED.update(IGNORED_TOPIC)
REFUSED.update(REFUSED_TOPIC)

def _base(name: str) -> str:
    """`listener.name.<l>.<key>` is `<key>` for one listener."""
    if name.startswith("listener.name."):
        parts = name.split(".", 3)
        if len(parts) == 4:
            return parts[3]
    return name


def refusal(name: str, value: str | None) -> str | None:
    """Why `name=value` is refused, naming the key; None when it is accepted."""
    entry = REFUSED.get(_base(name))
    if entry is None:
        return None
    allowed, why = entry
    if allowed is not None and value is not None and _same(value, allowed):
        return None
    only = f"only {allowed} is accepted: " if allowed is not None else ""
    return f"{name}={value} is not supported: {only}{why}"


def _same(value: str, allowed: str) -> bool:
    norm = [", ".join(sorted(x.strip().lower() for x in v.split(","))) for v in (value, allowed)]
    return norm[0] == norm[1]


def ignored(name: str) -> str | None:
    """Why an accepted key has no effect here, or None."""
    return IGNORED.get(_base(name))


def first_refusal(props: Mapping[str, str]) -> str | None:
    """The first refused setting of a properties file (sorted by key), or None."""
    for name in sorted(props):
        why = refusal(name, props[name])
        if why is not None:
            return why
    return None


def is_known(name: str) -> bool:
    return (name in BROKER_CATALOG or name in BROKER_CONFIGS or name in TOPIC_CONFIGS or name in STRATA_KEYS
            or name.startswith(STRATA_PREFIXES) or name in IGNORED or name in REFUSED)


def unknown_keys(props: Mapping[str, str]) -> list[str]:
    """Keys that are neither Kafka's (the broker catalog, topic configs) nor Strata's own: they have
    no effect, and the process says so at start (Kafka warns about such keys too)."""
    return sorted(k for k in props if not is_known(k))
