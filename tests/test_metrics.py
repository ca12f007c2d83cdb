"""The Prometheus endpoints (metrics.listener) of real brokers and the controller: traffic
counters grow by exactly what was produced, under-replicated partitions follow a follower going
down and coming back, the controller reports itself active, and bad HTTP input gets 404/405."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import NodeClient
from protocol.generated.api_versions import ApiVersionsRequest
from protocol.generated.fetch import FetchRequest
from tests.conftest import wait_for
from tools.cluster import CONTROLLER

METRICS = {"metrics.listener": "http://127.0.0.1:0"}
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def http_status(url: str, method: str = "GET") -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def raw_exchange(url: str, data: bytes) -> bytes:
    u = urlparse(url)
    with socket.create_connection((u.hostname, u.port), timeout=5) as s:
        s.sendall(data)
        return s.recv(4096)


def queued_over_250ms(samples: dict, request: str) -> float:
    name = "kafka_network_requestmetrics_requestqueuetimems_bucket"
    return value(samples, name, request=request, le="+Inf") - value(samples, name, request=request, le="250")


async def fetch_then_api_versions(host: str, port: int, topic: str, end: int) -> None:
    F = FetchRequest
    fetch = F(replica_id=-1, max_wait_ms=600, min_bytes=1, max_bytes=1 << 20, topics=[F.FetchTopic(
        topic=topic, partitions=[F.FetchPartition(partition=0, fetch_offset=end, partition_max_bytes=1 << 20)])])
    async with NodeClient(host, port, timeout=10) as cl:
        await asyncio.gather(cl.request(fetch, 4), cl.request(ApiVersionsRequest(), 0))


def test_metrics_endpoints(cluster_factory) -> None:
    c = cluster_factory(brokers=3, broker_overrides={**METRICS, "replica.lag.time.max.ms": 2000},
                        controller_overrides={**METRICS, "broker.session.timeout.ms": 6000})
    admin = AdminClient(c.rdkafka_conf())
    for f in admin.create_topics([NewTopic("m", 1, 2, config={"segment.bytes": "4096"})]).values():
        f.result(timeout=30)
    part = wait_for(lambda: admin.list_topics("m", timeout=5).topics["m"].partitions.get(0), what="topic m")
    leader, follower = part.leader, next(r for r in part.replicas if r != part.leader)
    url = c.metrics_url(leader)

    producer = Producer({**c.rdkafka_conf(), "acks": "all", "linger.ms": 5, "batch.size": 2048})
    failed = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(err)
    produced = 0
    before = scrape(url)
    for rnd in (1, 2):  # two rounds: each scrape sees exactly what the round added
        n = 37 * rnd
        for i in range(n):
            producer.produce("m", key=b"k%d" % i, value=b"v" * (i % 50) * rnd, on_delivery=delivered)
        assert producer.flush(30) == 0 and not failed
        produced += n
        after = scrape(url)
        bytes_in = value(after, "kafka_server_brokertopicmetrics_bytesin_total", topic="m")
        log_bytes = value(after, "strata_chunk_replica_bytes", topic="m", partition="0", chunk_start="0",
                          dir=next(dict(k[1])["dir"] for k in after if k[0] == "strata_chunk_replica_bytes"
                                   and dict(k[1]).get("topic") == "m"))
        assert value(after, "kafka_server_brokertopicmetrics_messagesin_total", topic="m") == produced
        assert bytes_in == log_bytes > value(before, "kafka_server_brokertopicmetrics_bytesin_total", topic="m")
        assert value(after, "kafka_server_brokertopicmetrics_messagesin_total") >= produced  # all topics
        assert value(after, "kafka_network_requestmetrics_requests_total", request="Produce") >= rnd
        before = after
    s = scrape(url)
    assert value(s, "kafka_network_requestmetrics_totaltimems_count", request="Produce") >= 2
    assert value(s, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert all(v == 1 for (name, _), v in s.items() if name == "strata_log_dir_online")
    assert sum(v for (name, _), v in s.items() if name == "strata_log_dir_bytes") >= log_bytes
    # segments rolled at 4 KiB: each roll's flush runs in the background
    wait_for(lambda: value(scrape(url), "kafka_log_logflushstats_logflushrateandtimems_count") >= 1,
             timeout=10, what="a log flush counted")
    assert value(s, "strata_chunk_redirects_total") == 0
    assert value(s, "strata_replica_moves_in_flight") == 0
    assert ("strata_replica_moves_completed_total", frozenset()) in s

    # queue time is from the request's bytes being read to its handler's start: an ApiVersions
    # pipelined behind a consumer Fetch that long-polls 600 ms waits for it (one request per
    # connection at a time) and is counted so; before, it counted from the Fetch's answer being written
    slow_before = queued_over_250ms(scrape(url), "ApiVersions")
    asyncio.run(fetch_then_api_versions(c.host, c.broker_port(leader), "m", produced))
    s = scrape(url)
    assert queued_over_250ms(s, "ApiVersions") == slow_before + 1

    # Fetch is counted as Kafka counts it: under Fetch and under FetchFollower or FetchConsumer
    fetches = {r: value(s, "kafka_network_requestmetrics_requests_total", request=r)
               for r in ("Fetch", "FetchConsumer", "FetchFollower")}
    assert fetches["FetchConsumer"] >= 1 and fetches["FetchFollower"] >= 1, fetches
    assert fetches["Fetch"] == fetches["FetchConsumer"] + fetches["FetchFollower"], fetches
    for r in ("FetchConsumer", "FetchFollower"):  # queue time is counted at the start (long polls in flight)
        assert value(s, "kafka_network_requestmetrics_requestqueuetimems_count", request=r) >= fetches[r] > 0

    # a follower paused (its connections stay open, so the controller waits out its session
    # rather than fencing it at once): the leader shrinks it out of the ISR (replica.lag.time.max.ms)
    # and counts one under-replicated partition, then none once it is back
    pid = c.pid(follower)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    wait_for(lambda: value(scrape(url), "kafka_server_replicamanager_underreplicatedpartitions") == 1,
             timeout=20, what="under-replicated partitions = 1")
    assert value(scrape(url), "kafka_server_replicamanager_isrshrinks_total") == 1
    curl = c.metrics_url(CONTROLLER)
    ctl = wait_for(lambda: (s := scrape(curl)) and
                   value(s, "kafka_controller_kafkacontroller_fencedbrokercount") == 1 and s,
                   timeout=20, what="the controller to count the stopped broker as fenced")
    assert value(ctl, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert value(ctl, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    assert value(ctl, "kafka_network_requestmetrics_requests_total", request="BrokerHeartbeat") > 0
    c.kill(follower)  # stopped: SIGKILL still ends it
    c.start_node(follower)
    wait_for(lambda: value(scrape(url), "kafka_server_replicamanager_underreplicatedpartitions") == 0,
             timeout=30, what="under-replicated partitions = 0")
    assert value(scrape(url), "kafka_server_replicamanager_isrexpands_total") >= 1

    # a diskless topic (last: its internal metadata partitions would count as under-replicated
    # above): whichever broker takes the produce counts it
    for f in admin.create_topics([NewTopic("d", 1, 1, config={"diskless.enable": "true"})]).values():
        f.result(timeout=30)
    for i in range(10):
        producer.produce("d", value=b"d%d" % i, on_delivery=delivered)
    assert producer.flush(30) == 0 and not failed
    everywhere = [scrape(c.metrics_url(b)) for b in c.broker_ids]
    assert sum(value(s, "kafka_server_brokertopicmetrics_messagesin_total", topic="d") for s in everywhere) == 10
    assert sum(value(s, "kafka_server_brokertopicmetrics_bytesin_total", topic="d") for s in everywhere) > 10 * 2

    # bad input: answered with an HTTP error, the broker keeps serving
    assert http_status(url, "POST") == 405
    assert http_status(url.replace("/metrics", "/nope")) == 404
    assert raw_exchange(url, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400")
    producer.produce("m", value=b"after", on_delivery=delivered)
    assert producer.flush(30) == 0 and not failed
    assert value(scrape(url), "kafka_server_brokertopicmetrics_messagesin_total", topic="m") == produced + 1


def test_histogram_and_exposition() -> None:
    from node.metrics import Family, Histogram, exposition

    h = Histogram((1, 10, 100))
    for v in (0.5, 2, 3, 50, 500):
        h.observe(v)
    assert h.counts == [1, 2, 1, 1] and h.count == 5 and h.sum == 555.5
    assert 1 <= h.quantile(0.5) <= 10 and h.quantile(0.99) == 100  # the +Inf bucket reports its lower bound
    f = Family("x_seconds", "histogram", "help")
    h.add_to(f, {"request": 'a"b'})
    text = exposition([f, Family("y_total", "counter", "c").add(3)])
    assert '# TYPE x_seconds histogram\n' in text
    assert 'x_seconds_bucket{request="a\\"b",le="10"} 3\n' in text
    assert 'x_seconds_bucket{request="a\\"b",le="+Inf"} 5\n' in text
    assert "# TYPE y counter\ny_total 3\n" in text


def test_metrics_listener_config() -> None:
    from node.config import ConfigError
    from node.metrics import parse_listener

    assert parse_listener(None) is None and parse_listener("") is None
    assert parse_listener("http://127.0.0.1:9404") == ("127.0.0.1", 9404)
    assert parse_listener("http://:0") == ("0.0.0.0", 0)
    for bad in ("127.0.0.1:9404", "https://h:1", "http://h:99999", "http://h:x"):
        with pytest.raises(ConfigError, match="metrics.listener"):
            parse_listener(bad)


def test_chunk_read_metrics(cluster_factory) -> None:
    """An old chunk read for a Fetch v10 client by the active leader (proxied), served by the
    chunk's replica, and a v12 client redirected: each counted where it happened."""
    from tests.test_chunks_data import create_chunk, create_topic, fetch_v, produce

    c = cluster_factory(brokers=3, broker_overrides=METRICS)
    topic = "chunked"
    create_topic(c, topic, [1])
    produce(c, topic, [b"x%d" % i for i in range(5)])
    create_chunk(c, topic, [3])
    produce(c, topic, [b"y%d" % i for i in range(5)])
    assert fetch_v(c, 3, topic, 0, 10).error_code == 0  # broker 3 reads offsets 0.. from broker 1
    assert fetch_v(c, 3, topic, 2, 12).preferred_read_replica == 1
    leader, replica = scrape(c.metrics_url(3)), scrape(c.metrics_url(1))
    assert value(leader, "strata_chunk_proxied_reads_total") == 1
    assert value(leader, "strata_chunk_proxied_read_bytes_total") > 0
    assert value(leader, "strata_chunk_redirects_total") == 1
    chunk = {"topic": topic, "partition": "0", "chunk_start": "0"}
    assert value(replica, "strata_chunk_replica_reads_total", **chunk) == 1
    assert value(replica, "strata_chunk_replica_read_bytes_total", **chunk) == value(
        leader, "strata_chunk_proxied_read_bytes_total")


def test_metrics_port_in_use_stops_the_node_with_one_line(cluster_factory) -> None:
    from tools.cluster import ClusterError

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = f"http://127.0.0.1:{held.getsockname()[1]}"
        c = cluster_factory(brokers=1, start=False, controller_overrides={"metrics.listener": taken})
        with pytest.raises(ClusterError):
            c.start(timeout=20)
        assert c.process(CONTROLLER).wait(10) == 1
        # the same for a broker
        b = cluster_factory(brokers=1, start=False, broker_overrides={"metrics.listener": taken})
        with pytest.raises(ClusterError):
            b.start(timeout=20)
        assert b.process(1).wait(10) == 1
    for cl, node in ((c, CONTROLLER), (b, 1)):
        out = cl.log_path(node).read_text()
        assert f"cannot start: cannot listen on metrics.listener {taken}: " in out
        assert "Traceback" not in out


def test_process_metrics_on_every_node(cluster_factory) -> None:
    """process_* (as Prometheus client libraries name them) and the event loop's task count, on a
    broker and on the controller: what a soak watches for leaks."""
    c = cluster_factory(brokers=1, broker_overrides=METRICS, controller_overrides=METRICS)
    for node in (1, CONTROLLER):
        s = scrape(c.metrics_url(node))
        pid = c.pid(node)
        assert pid is not None
        assert value(s, "process_open_fds") == pytest.approx(len(os.listdir(f"/proc/{pid}/fd")), abs=5)
        assert value(s, "process_resident_memory_bytes") > 20 << 20
        assert value(s, "process_max_fds") >= value(s, "process_open_fds")
        assert 0 < value(s, "process_cpu_seconds_total") < 120
        assert abs(value(s, "process_start_time_seconds") - time.time()) < 300
        assert value(s, "strata_event_loop_tasks") >= 1
