"""The `strata` sink on a cluster whose every listener is SASL_SSL (SCRAM-SHA-512, the authorizer
on), configured as a Spark user configures Spark's Kafka sink: `kafka.security.protocol`,
`kafka.sasl.mechanism`, `kafka.sasl.jaas.config` and `kafka.ssl.truststore.location`. The
executors' producers and the driver's own connections (the commit log, EndTxn) all go over TLS,
authenticated; rows are checked with a read_committed confluent-kafka consumer."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import FAST_FENCING
from tests.test_spark_sink import write_inputs
from tests.test_spark_source import spark  # noqa: F401  (the module's SparkSession fixture)
from tools.cluster import SECURE_USERS, Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("spark-sink-secure"), secure="SASL_SSL", acls=True,
                broker_overrides=FAST_FENCING, controller_overrides=FAST_FENCING)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def spark_options(c: Cluster, password: str | None = None) -> dict[str, str]:
    """What a Spark job passes to the Kafka sink for a SASL_SSL cluster (the CA as PEM)."""
    assert c.certs is not None
    login = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" '
             f'password="{password or SECURE_USERS["admin"]}";')
    return {"kafka.bootstrap.servers": c.bootstrap, "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.jaas.config": login,
            "kafka.ssl.truststore.location": str(c.certs.ca), "kafka.ssl.truststore.type": "PEM"}


def create_topic(c: Cluster, name: str) -> None:
    admin = AdminClient(c.rdkafka_conf())  # kept: the result needs the client alive
    admin.create_topics([NewTopic(name, 3, 3)])[name].result(30)


def committed(c: Cluster, topic: str, expect: int) -> Counter:
    cons = Consumer({**c.rdkafka_conf(), "group.id": f"check-{topic}", "isolation.level": "read_committed",
                     "enable.auto.commit": False})
    cons.assign([TopicPartition(topic, p, 0) for p in range(3)])
    got: Counter = Counter()
    quiet = 0
    while sum(got.values()) < expect or quiet < 3:
        batch = cons.consume(10_000, 1.0)
        quiet = 0 if batch else quiet + 1
        if quiet > 30:
            break
        for m in batch:
            assert m.error() is None, m.error()
            got[int(m.key())] += 1
    cons.close()
    return got


def test_batch_and_streaming_writes_over_sasl_ssl(secure: Cluster, spark, tmp_path: Path) -> None:  # noqa: F811
    opts = spark_options(secure)
    create_topic(secure, "secure-batch")
    w = spark.range(5000).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value").write.format("strata")
    for k, v in {**opts, "topic": "secure-batch", "exactlyOnce": "true"}.items():
        w = w.option(k, v)
    w.mode("append").save()
    got = committed(secure, "secure-batch", 5000)
    assert sorted(got) == list(range(5000)) and set(got.values()) == {1}

    # streaming: the tasks' transactions, the driver's commit log and its EndTxn, all over SASL_SSL
    create_topic(secure, "secure-stream")
    src = tmp_path / "in"
    write_inputs(src, 0, 3, 300)
    ws = (spark.readStream.format("json").schema("id long").option("maxFilesPerTrigger", "1").load(str(src))
          .selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value").writeStream.format("strata"))
    for k, v in {**opts, "topic": "secure-stream", "commitLogTopic": "secure-sink-commits"}.items():
        ws = ws.option(k, v)
    q = ws.option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    q.awaitTermination(300)
    assert q.exception() is None
    got = committed(secure, "secure-stream", 900)
    assert sorted(got) == list(range(900)) and set(got.values()) == {1}
    for b in secure.broker_ids:  # the clients authenticated as admin over the SASL_SSL listener
        assert "sasl_authentication_failed" not in Path(secure.log_path(b)).read_text()


def test_wrong_password_fails_the_write(secure: Cluster, spark) -> None:  # noqa: F811
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    create_topic(secure, "secure-denied")
    w = spark.range(3).selectExpr("CAST(id AS STRING) AS value").write.format("strata")
    for k, v in {**spark_options(secure, password="wrong"), "topic": "secure-denied",
                 "kafka.message.timeout.ms": "15000"}.items():
        w = w.option(k, v)
    started = time.monotonic()
    with pytest.raises((PySparkException, Py4JJavaError)) as e:
        w.mode("append").save()
    # a refused login is final: the task fails at once, not after the 30 s metadata timeout
    assert time.monotonic() - started < 20, time.monotonic() - started
    assert "topic: no metadata for topic 'secure-denied'" in str(e.value), str(e.value)[-2000:]
    assert "authentication" in str(e.value).lower(), str(e.value)[-2000:]  # librdkafka's error_cb, in the message
