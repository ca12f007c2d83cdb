"""Options of the `strata` sink, named as Spark's Kafka sink names them, checked on the driver
before any task starts, and the input columns it accepts.

Columns (as Spark's Kafka sink): `value` (string or binary, required; a null value is written as a
null value, a tombstone), `key` (string or binary), `topic` (string; the `topic` option, when
given, wins over the column, as in Spark), `partition` (int; null or absent: the producer's
partitioner, murmur2 of the key like the Java client's), `headers`
(array<struct<key: string, value: binary>>). Other columns are ignored.

`kafka.*` options go to the producer (librdkafka) with the prefix stripped; the Java client's
names that librdkafka spells differently are translated, and the serializer options Spark's sink
refuses are refused here too.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from connector.cluster_view import SourceError, parse_bootstrap

# Spark's Kafka sink refuses these (it serializes key and value itself); so does this one.
_REFUSED = {
    "key.serializer": "the key column is written as bytes",
    "value.serializer": "the value column is written as bytes",
    "transactional.id": "the sink names its transactions itself (see exactlyOnce)",
    "enable.auto.commit": "a consumer setting",
}
# The Java client's names -> librdkafka's, where they differ.
_JAVA_NAMES = {
    "max.request.size": "message.max.bytes",
    "ssl.truststore.location": "ssl.ca.location",
    "ssl.keystore.location": "ssl.keystore.location",
    "sasl.mechanism": "sasl.mechanism",
    "request.timeout.ms": "request.timeout.ms",
    "delivery.timeout.ms": "message.timeout.ms",
    "buffer.memory": None,  # librdkafka bounds its queue by queue.buffering.max.kbytes instead
    "max.block.ms": None,
    "key.deserializer": None,
    "value.deserializer": None,
}
_JAAS = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


class SinkError(SourceError):
    """A write the sink refuses: bad options, bad columns, or a row it cannot write."""


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    producer: dict[str, str]  # librdkafka settings
    exactly_once: bool
    commit_log_topic: str
    txn_prefix: str | None  # the stable part of the transactional.ids (None: the streaming query id)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # a batch job's own prefix

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SinkOptions:
        o = {k.lower(): v for k, v in options.items()}
        bootstrap = o.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise SinkError("option kafka.bootstrap.servers is required")
        parse_bootstrap(bootstrap)  # host:port check, the message the source gives
        producer = {"bootstrap.servers": bootstrap}
        for key, value in options.items():
            if not key.lower().startswith("kafka.") or key.lower() == "kafka.bootstrap.servers":
                continue
            name = key[len("kafka."):]
            if name in _REFUSED:
                raise SinkError(f"option kafka.{name} is not supported: {_REFUSED[name]}")
            if name == "sasl.jaas.config":  # PlainLoginModule / ScramLoginModule username="" password=""
                creds = dict(_JAAS.findall(value))
                producer.update({"sasl." + k: creds[k] for k in ("username", "password") if k in creds})
                continue
            if name == "ssl.truststore.type":  # librdkafka reads the CA as PEM (ssl.ca.location)
                if value.upper() != "PEM":
                    raise SinkError(f"option kafka.ssl.truststore.type={value}: the truststore must be a PEM file "
                                    "of CA certificates (librdkafka's ssl.ca.location)")
                continue
            if name == "ssl.endpoint.identification.algorithm" and not value:
                value = "none"  # the Java client's "" turns host name checks off; librdkafka spells it none
            if name in _JAVA_NAMES:
                mapped = _JAVA_NAMES[name]
                if mapped is None:
                    continue
                name = mapped
            producer[name] = value
        producer.setdefault("acks", "all")
        producer.setdefault("partitioner", "murmur2_random")  # the Java client's default, as Spark's sink uses
        # A misspelt topic name is refused, never created: without this, librdkafka's producer asks
        # for auto-creation in its Metadata requests, and a broker with auto.create.topics.enable
        # creates the topic while a task is still checking it (a race between the tasks).
        producer.setdefault("allow.auto.create.topics", "false")
        eo = o.get("exactlyonce", "true" if streaming else "false").lower()
        if eo not in ("true", "false"):
            raise SinkError(f"exactlyOnce: expected true or false, got {o['exactlyonce']!r}")
        exactly_once = eo == "true"
        if exactly_once:
            producer.setdefault("transaction.timeout.ms", "900000")  # transaction.max.timeout.ms's default
            if producer.get("acks") not in ("all", "-1"):
                raise SinkError(f"kafka.acks: exactly-once writes need acks=all, got {producer['acks']!r}")
        else:
            producer.setdefault("enable.idempotence", "true")
        topic = o.get("topic")
        return cls(
            bootstrap=bootstrap,
            topic=topic.strip() if topic and topic.strip() else None,
            producer=producer,
            exactly_once=exactly_once,
            commit_log_topic=o.get("commitlogtopic", "strata-spark-sink-commits"),
            txn_prefix=o.get("transactionalidprefix"),
        )

    def client_get(self, key: str) -> str | None:
        """Kafka's client settings for the driver's own connections (node/security.py)."""
        return self.producer.get(key)


def check_schema(schema, topic_option: str | None) -> None:
    """The input columns against what the sink writes (Spark's Kafka sink's rules): one message
    naming the column and what is wrong with it."""
    from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

    cols = {f.name.lower(): f.dataType for f in schema.fields}
    if "value" not in cols:
        raise SinkError("value: the required column value (string or binary) is missing")
    for name in ("key", "value"):
        if name in cols and not isinstance(cols[name], (StringType, BinaryType)):
            raise SinkError(f"{name}: must be string or binary, got {cols[name].simpleString()}")
    if "topic" in cols and not isinstance(cols["topic"], StringType):
        raise SinkError(f"topic: must be string, got {cols['topic'].simpleString()}")
    if "topic" not in cols and topic_option is None:
        raise SinkError("topic: no topic column and no topic option: set one of them")
    if "partition" in cols and not isinstance(cols["partition"], IntegerType):
        raise SinkError(f"partition: must be int, got {cols['partition'].simpleString()}")
    if "headers" in cols:
        h = cols["headers"]
        ok = isinstance(h, ArrayType) and isinstance(h.elementType, StructType)
        if ok:
            inner = {f.name: f.dataType for f in h.elementType.fields}
            ok = isinstance(inner.get("key"), StringType) and isinstance(inner.get("value"), (BinaryType, StringType))
        if not ok:
            raise SinkError(f"headers: must be array<struct<key: string, value: binary>>, got {h.simpleString()}")
