"""KIP-714 client telemetry with a real librdkafka client (confluent-kafka,
`enable.metrics.push=true`): a client-metrics subscription made with kafka-configs.sh matches one
producer by client id; that producer asks for its subscription (GetTelemetrySubscriptions), pushes
its producer metrics (PushTelemetry, OpenTelemetry protobuf) and they appear on the broker's
Prometheus endpoint with the client's labels; a producer the subscription does not match pushes
nothing; a closing producer's last push (Terminating) takes its series away."""

from __future__ import annotations

import subprocess
import time
import urllib.request

from confluent_kafka import Producer

from tests.conftest import installed_script, wait_for

METRICS = {"metrics.listener": "http://127.0.0.1:0"}
PREFIX = "org_apache_kafka_producer_"


def _series(url: str) -> list[tuple[str, dict[str, str]]]:
    """(name, labels) of every sample of a client metric on the endpoint."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out = []
    for line in text.splitlines():
        if not line.startswith(PREFIX):
            continue
        name, _, rest = line.partition("{")
        labels = {}
        for part in rest.rsplit("}", 1)[0].split('",'):
            k, _, v = part.partition('="')
            labels[k] = v.rstrip('"')
        out.append((name, labels))
    return out


def _producer(c, client_id: str) -> Producer:
    return Producer({**c.rdkafka_conf(), "client.id": client_id, "enable.metrics.push": True})


def test_librdkafka_pushes_subscribed_metrics_to_prometheus(cluster_factory) -> None:
    c = cluster_factory(brokers=1, broker_overrides=METRICS)
    r = subprocess.run([installed_script("kafka-configs.sh"), "--bootstrap-server", c.bootstrap, "--alter",
                        "--entity-type", "client-metrics", "--entity-name", "producers", "--add-config",
                        "metrics=[org.apache.kafka.producer.],interval.ms=1000,match=[client_id=tele-.*]"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    url = c.metrics_url(c.broker_ids[0])
    producers = [_producer(c, "tele-producer"), _producer(c, "quiet-producer")]
    try:
        for p in producers:
            for i in range(20):
                p.produce("telemetry", value=b"v%d" % i)
            assert p.flush(30) == 0

        def pushed():
            for p in producers:
                p.poll(0.1)
            return [s for s in _series(url) if s[1].get("client_id") == "tele-producer"]

        seen = wait_for(pushed, 30, "the subscribed producer's metrics on the endpoint", interval=0.5)
        names = {n for n, _ in seen}
        labels = seen[0][1]
        # the client's identity (KIP-714's match keys) labels every series
        assert labels["client_software_name"] == "confluent-kafka-python", labels
        assert "rdkafka" in labels["client_software_version"], labels
        assert labels["client_instance_id"] and labels["client_source_address"] == "127.0.0.1", labels
        assert any(n.startswith(PREFIX + "node_request_latency") for n in names), names
        # the unmatched producer was told to push nothing
        time.sleep(1.5)
        for p in producers:
            p.poll(0.1)
        assert not [s for s in _series(url) if s[1].get("client_id") == "quiet-producer"]
        print(sorted(names))
    finally:
        for p in producers:
            p.flush(5)
    # closing, the producer pushes once more with Terminating: its series go
    instance = labels["client_instance_id"]
    producers.clear()  # the last references: librdkafka's destroy runs
    wait_for(lambda: not [s for s in _series(url) if s[1].get("client_instance_id") == instance], 15,
             "the closed producer's series gone")


def test_push_checks_in_process() -> None:
    """PushTelemetry's refusals (Kafka's codes), one ClientTelemetry with a fake image and clock."""
    import uuid
    from types import SimpleNamespace

    from broker.telemetry.clients import TELEMETRY_MAX_BYTES, ClientTelemetry
    from protocol.errors import Errors

    configs = {(16, "all"): {"metrics": "*", "interval.ms": "1000"}}
    now = [100.0]
    t = ClientTelemetry(lambda: SimpleNamespace(configs=configs), clock=lambda: now[0])
    who = {"client_id": "c1"}
    iid, plan = t.get_subscriptions(uuid.UUID(int=0), who)
    assert iid.int and plan.requested == ("",) and plan.interval_ms == 1000
    assert t.push(iid, plan.subscription_id + 1, False, 0, b"", who)[0] == Errors.UNKNOWN_SUBSCRIPTION_ID
    assert t.push(iid, plan.subscription_id, False, 0, b"", who) == (0, None)  # an empty MetricsData
    assert t.push(iid, plan.subscription_id, False, 0, b"", who)[0] == Errors.THROTTLING_QUOTA_EXCEEDED
    now[0] += 1
    assert t.push(iid, plan.subscription_id, False, 0, b"\x0a\x05ab", who)[0] == Errors.INVALID_RECORD
    now[0] += 1
    big = bytes(TELEMETRY_MAX_BYTES + 1)
    assert t.push(iid, plan.subscription_id, False, 0, big, who)[0] == Errors.TELEMETRY_TOO_LARGE
    assert t.push(iid, plan.subscription_id, False, 2, b"", who)[0] == Errors.UNSUPPORTED_COMPRESSION_TYPE
    # a changed subscription changes the id: the client is told to ask again
    configs[(16, "all")] = {"metrics": "*", "interval.ms": "2000"}
    assert t.push(iid, plan.subscription_id, False, 0, b"", who)[0] == Errors.UNKNOWN_SUBSCRIPTION_ID
    # none matching: nothing to push, asked again after the default interval
    configs[(16, "all")] = {"metrics": "*", "match": "client_id=other"}
    _, none = t.get_subscriptions(iid, who)
    assert none.requested == () and none.interval_ms == 300000
    # bounded: instance ids minted without end keep at most MAX_CLIENTS, the oldest going first
    import broker.telemetry.clients as clients

    saved, clients.MAX_CLIENTS = clients.MAX_CLIENTS, 3
    try:
        ids = []
        for _ in range(5):
            now[0] += 1
            ids.append(t.get_subscriptions(uuid.UUID(int=0), who)[0])
        assert set(t.clients) == set(ids[-3:])
    finally:
        clients.MAX_CLIENTS = saved


def test_an_instance_keeps_bounded_labels_and_the_bound_drops_the_least_recently_heard() -> None:
    """Resource attributes pushed without end stop at MAX_LABELS_PER_CLIENT; at MAX_CLIENTS the
    instance heard from longest ago goes, not one heard from lately."""
    import uuid
    from types import SimpleNamespace

    import broker.telemetry.clients as clients
    from tests.test_otlp import _kv, _len

    configs = {(16, "all"): {"metrics": "*", "interval.ms": "1000"}}
    now = [100.0]
    t = clients.ClientTelemetry(lambda: SimpleNamespace(configs=configs), clock=lambda: now[0])
    who = {"client_id": "c1"}
    iid, plan = t.get_subscriptions(uuid.UUID(int=0), who)
    for i in range(3):
        now[0] += 1
        resource = b"".join(_len(1, _kv(f"attr{i}_{j}", "v")) for j in range(50))  # Resource.attributes
        assert t.push(iid, plan.subscription_id, False, 0, _len(1, _len(1, resource)), who) == (0, None)
    assert len(t.clients[iid].labels) == clients.MAX_LABELS_PER_CLIENT

    saved, clients.MAX_CLIENTS = clients.MAX_CLIENTS, 3
    try:
        a, b = (t.get_subscriptions(uuid.UUID(int=0), who)[0] for _ in range(2))
        now[0] += 1
        t.push(iid, plan.subscription_id, False, 0, b"", who)  # the first instance is heard again
        c = t.get_subscriptions(uuid.UUID(int=0), who)[0]
        assert set(t.clients) == {b, iid, c} and a not in t.clients
    finally:
        clients.MAX_CLIENTS = saved
