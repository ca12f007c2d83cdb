"""Every broker config DescribeConfigs lists for a broker: Kafka 4.0's names, types and defaults
(KafkaConfig's definitions: ServerConfigs, ServerLogConfigs, ReplicationConfigs, KRaftConfigs,
SocketServerConfigs, GroupCoordinatorConfig, CleanerConfig, LogConfig, TransactionLogConfig,
QuotaConfig, BrokerSecurityConfigs; checked against them, with KIP-1030's 4.0 defaults), so
`kafka-configs.sh --describe --all --broker N` shows what a Kafka broker shows. Where Strata's
own default departs from Kafka's (STRATA_DEFAULTS), the broker reports the one it runs with.
Keys with no default appear only when set. Which keys may change at runtime is
metadata.config_defs.BROKER_CONFIGS; every other key is read-only."""

from __future__ import annotations

from metadata.config_defs import INT64_MAX, TOPIC_CONFIGS

_MAX_INT = str(2**31 - 1)
_MAX_LONG = str(INT64_MAX)

# name: (type, default); PASSWORD values are sensitive, SHORT is Kafka's int16 type
_CATALOG: dict[str, tuple[str, str | None]] = {
    "advertised.listeners": ("STRING", None),
    "authorizer.class.name": ("STRING", ""),
    "auto.create.topics.enable": ("BOOLEAN", "true"),
    "auto.leader.rebalance.enable": ("BOOLEAN", "true"),
    "background.threads": ("INT", "10"),
    "broker.heartbeat.interval.ms": ("INT", "2000"),
    "broker.rack": ("STRING", None),
    "broker.session.timeout.ms": ("INT", "9000"),
    "connections.max.idle.ms": ("LONG", "600000"),
    "connections.max.reauth.ms": ("LONG", "0"),
    "controller.listener.names": ("STRING", None),
    "controller.quorum.bootstrap.servers": ("LIST", ""),
    "controller.quorum.voters": ("LIST", ""),
    "default.replication.factor": ("INT", "1"),
    "delete.topic.enable": ("BOOLEAN", "true"),
    "fetch.max.bytes": ("INT", "57671680"),
    "group.initial.rebalance.delay.ms": ("INT", "3000"),
    "group.max.session.timeout.ms": ("INT", "1800000"),
    "group.max.size": ("INT", _MAX_INT),
    "group.min.session.timeout.ms": ("INT", "6000"),
    "initial.broker.registration.timeout.ms": ("INT", "60000"),
    "inter.broker.listener.name": ("STRING", None),
    "leader.imbalance.check.interval.seconds": ("LONG", "300"),
    "leader.imbalance.per.broker.percentage": ("INT", "10"),
    "listener.security.protocol.map": (
        "STRING", "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"),
    "listeners": ("STRING", "PLAINTEXT://:9092"),
    "log.cleaner.backoff.ms": ("LONG", "15000"),
    "log.cleaner.dedupe.buffer.size": ("LONG", "134217728"),
    "log.cleaner.enable": ("BOOLEAN", "true"),
    "log.cleaner.io.buffer.load.factor": ("DOUBLE", "0.9"),
    "log.cleaner.io.buffer.size": ("INT", "524288"),
    "log.cleaner.io.max.bytes.per.second": ("DOUBLE", "1.7976931348623157E308"),
    "log.cleaner.threads": ("INT", "1"),
    "log.dir": ("STRING", "/tmp/kafka-logs"),
    "log.dirs": ("STRING", None),
    "log.flush.offset.checkpoint.interval.ms": ("INT", "60000"),
    "log.flush.scheduler.interval.ms": ("LONG", _MAX_LONG),
    "log.retention.check.interval.ms": ("LONG", "300000"),
    "log.retention.hours": ("INT", "168"),
    "log.retention.minutes": ("INT", None),
    "log.retention.ms": ("LONG", None),
    "log.roll.hours": ("INT", "168"),
    "log.roll.jitter.hours": ("INT", "0"),
    "log.roll.jitter.ms": ("LONG", None),
    "log.roll.ms": ("LONG", None),
    "log.flush.interval.ms": ("LONG", None),
    "max.connection.creation.rate": ("INT", _MAX_INT),
    "max.connections": ("INT", _MAX_INT),
    "max.connections.per.ip": ("INT", _MAX_INT),
    "max.connections.per.ip.overrides": ("STRING", ""),
    "max.incremental.fetch.session.cache.slots": ("INT", "1000"),
    "metadata.log.dir": ("STRING", None),
    "metadata.log.segment.bytes": ("INT", "1073741824"),
    "metadata.max.retention.bytes": ("LONG", "104857600"),
    "node.id": ("INT", None),
    "num.io.threads": ("INT", "8"),
    "num.network.threads": ("INT", "3"),
    "num.partitions": ("INT", "1"),
    "num.recovery.threads.per.data.dir": ("INT", "2"),
    "num.replica.alter.log.dirs.threads": ("INT", None),
    "num.replica.fetchers": ("INT", "1"),
    "offset.metadata.max.bytes": ("INT", "4096"),
    "offsets.commit.timeout.ms": ("INT", "5000"),
    "offsets.load.buffer.size": ("INT", "5242880"),
    "offsets.retention.check.interval.ms": ("LONG", "600000"),
    "offsets.retention.minutes": ("INT", "10080"),
    "offsets.topic.num.partitions": ("INT", "50"),
    "offsets.topic.replication.factor": ("SHORT", "3"),
    "offsets.topic.segment.bytes": ("INT", "104857600"),
    "process.roles": ("LIST", ""),
    "producer.id.expiration.check.interval.ms": ("INT", "600000"),
    "producer.id.expiration.ms": ("INT", "86400000"),
    "queued.max.request.bytes": ("LONG", "-1"),
    "queued.max.requests": ("INT", "500"),
    "quota.window.num": ("INT", "11"),
    "quota.window.size.seconds": ("INT", "1"),
    "replica.fetch.backoff.ms": ("INT", "1000"),
    "replica.fetch.max.bytes": ("INT", "1048576"),
    "replica.fetch.min.bytes": ("INT", "1"),
    "replica.fetch.response.max.bytes": ("INT", "10485760"),
    "replica.fetch.wait.max.ms": ("INT", "500"),
    "replica.high.watermark.checkpoint.interval.ms": ("LONG", "5000"),
    "replica.lag.time.max.ms": ("LONG", "30000"),
    "replica.selector.class": ("STRING", None),
    "replica.socket.receive.buffer.bytes": ("INT", "65536"),
    "replica.socket.timeout.ms": ("INT", "30000"),
    "request.timeout.ms": ("INT", "30000"),
    "sasl.enabled.mechanisms": ("LIST", "GSSAPI"),
    "sasl.jaas.config": ("PASSWORD", None),
    "sasl.mechanism.controller.protocol": ("STRING", "GSSAPI"),
    "sasl.mechanism.inter.broker.protocol": ("STRING", "GSSAPI"),
    "security.inter.broker.protocol": ("STRING", "PLAINTEXT"),
    "socket.listen.backlog.size": ("INT", "50"),
    "socket.receive.buffer.bytes": ("INT", "102400"),
    "socket.request.max.bytes": ("INT", "104857600"),
    "socket.send.buffer.bytes": ("INT", "102400"),
    "ssl.client.auth": ("STRING", "none"),
    "ssl.enabled.protocols": ("LIST", "TLSv1.2,TLSv1.3"),
    "ssl.endpoint.identification.algorithm": ("STRING", "https"),
    "ssl.key.password": ("PASSWORD", None),
    "ssl.keystore.location": ("STRING", None),
    "ssl.keystore.password": ("PASSWORD", None),
    "ssl.keystore.type": ("STRING", "JKS"),
    "ssl.protocol": ("STRING", "TLSv1.3"),
    "ssl.truststore.location": ("STRING", None),
    "ssl.truststore.password": ("PASSWORD", None),
    "ssl.truststore.type": ("STRING", "JKS"),
    "super.users": ("STRING", None),
    "transaction.max.timeout.ms": ("INT", "900000"),
    "transaction.state.log.min.isr": ("INT", "2"),
    "transaction.state.log.num.partitions": ("INT", "50"),
    "transaction.state.log.replication.factor": ("SHORT", "3"),
    "transaction.state.log.segment.bytes": ("INT", "104857600"),
    "transactional.id.expiration.ms": ("INT", "604800000"),
}


# Strata's defaults where they depart from Kafka's (docs/reference/broker-configs.md, generated): the value DescribeConfigs reports as
# DEFAULT_CONFIG is the one the broker uses.
STRATA_DEFAULTS: dict[str, str | None] = {
    "num.recovery.threads.per.data.dir": "1",  # Kafka 4.0: 2; opening logs is GIL-bound (config_effects.DIFFERS)
    "queued.max.request.bytes": str(500 * 1024 * 1024),  # Kafka: -1, unbounded
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",  # Kafka: GSSAPI, not served here
    # Kafka: GSSAPI; here the listener's first enabled mechanism, so no fixed default
    "sasl.mechanism.controller.protocol": None,
    "sasl.mechanism.inter.broker.protocol": None,
}


def _with_topic_synonyms() -> dict[str, tuple[str, str | None]]:
    """The broker keys that set topic defaults take the topic config's type and default
    (log.segment.bytes, message.max.bytes, ...), unless listed above with Kafka's own."""
    out = dict(_CATALOG)
    for name, default in STRATA_DEFAULTS.items():
        out[name] = (out[name][0], default)
    for d in TOPIC_CONFIGS.values():
        for syn, mult in d.synonyms:
            if syn not in out and mult == 1:
                out[syn] = (d.type, d.default)
    return dict(sorted(out.items()))


BROKER_CATALOG: dict[str, tuple[str, str | None]] = _with_topic_synonyms()
BROKER_DEFAULTS: dict[str, str] = {n: d for n, (_, d) in BROKER_CATALOG.items() if d is not None}

# Keys that are names of one setting in different units: a broker config's synonyms are the
# group from its own name on (log.retention.ms: ms, minutes, hours), as Kafka lists them.
_GROUPS = [tuple(s for s, _ in d.synonyms) for d in TOPIC_CONFIGS.values() if len(d.synonyms) > 1]


def broker_synonyms(name: str) -> tuple[str, ...]:
    for group in _GROUPS:
        if name in group:
            return group[group.index(name):]
    return (name,)


def is_sensitive(name: str) -> bool:
    """PASSWORD-typed keys, and any key whose name says it holds a secret."""
    kind = BROKER_CATALOG.get(name, ("STRING", None))[0]
    return kind == "PASSWORD" or any(w in name for w in ("password", "secret", "sasl.jaas"))
