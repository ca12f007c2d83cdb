"""A Kafka broker's connection limits.

3,000 idle connections against `max.connections=1000` (and `max.connections.per.ip.overrides`
for one source address): the excess is refused at once, the idle ones are closed after
`connections.max.idle.ms`, refusals are logged rate-limited, and a normal client is served
throughout. Then 8 connections each send the start of a 60 MiB request and stall: with
`queued.max.request.bytes` = 32 MiB the broker reads one of them (one reservation may overshoot,
as Kafka's memory pool) and leaves the others in their sockets, so its RSS grows by about one
request, not eight.
"""

from __future__ import annotations

import resource
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tools.cluster import Cluster

# timing- or CPU-sensitive: runs after the parallel part of `make test`, alone
pytestmark = pytest.mark.serial

MAX_CONNECTIONS = 1000
PER_IP_OVERRIDE = 700  # for 127.0.0.2
IDLE_MS = 6000
QUEUED_MAX = 32 << 20
PARTIAL = 60 << 20
ROOT = Path(__file__).resolve().parent.parent


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def open_idle(port: int, source: str, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))  # completes from the backlog whether or not the broker accepts it
        socks.append(s)
    return socks


def closed_by_broker(socks: list[socket.socket]) -> int:
    """How many of `socks` the broker closed (readable at EOF; none of them sent anything)."""
    poller = select.poll()
    by_fd = {}
    for s in socks:
        poller.register(s, select.POLLIN | select.POLLHUP | select.POLLERR)
        by_fd[s.fileno()] = s
    return len(poller.poll(0))


def wait_closed_count(socks: list[socket.socket], want: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    n = closed_by_broker(socks)
    while n < want and time.monotonic() < deadline:
        time.sleep(0.1)
        n = closed_by_broker(socks)
    time.sleep(0.3)  # anything more would be refused by now
    return closed_by_broker(socks)


class SteadyClient:
    """A normal producer sending a record every 50 ms, counting deliveries and failures."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0,
                                  "message.timeout.ms": 10000, "log_level": 3})
        self.topic = topic
        self.delivered = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err, _msg) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed.append(str(err))

    def _run(self) -> None:
        while not self.stop.is_set():
            self.producer.produce(self.topic, b"steady", on_delivery=self._on_delivery)
            self.producer.poll(0.05)
        self.producer.flush(15)

    def delivered_within(self, seconds: float) -> int:
        before = self.delivered
        time.sleep(seconds)
        return self.delivered - before


def test_connection_limits_idle_close_and_request_memory(cluster_factory) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds 3,000 sockets
    assert hard >= 4000, f"RLIMIT_NOFILE hard limit {hard} is too low for 3,000 connections"
    c: Cluster = cluster_factory(brokers=1, broker_overrides={
        "max.connections": MAX_CONNECTIONS,
        "max.connections.per.ip.overrides": f"127.0.0.2:{PER_IP_OVERRIDE}",
        "connections.max.idle.ms": IDLE_MS,
        "queued.max.request.bytes": QUEUED_MAX,
    })
    port = c.broker_port(1)
    topic = f"steady-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)
    del admin
    log_from = c.log_path(1).stat().st_size
    client = SteadyClient(c.bootstrap, topic)
    client.thread.start()
    flood: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while client.delivered < 5 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.delivered >= 5, f"the normal client got nowhere: {client.failed}"

        # 1,500 from 127.0.0.2: its override admits 700
        from_2 = open_idle(port, "127.0.0.2", 1500)
        flood += from_2
        assert wait_closed_count(from_2, 1500 - PER_IP_OVERRIDE, 5) == 1500 - PER_IP_OVERRIDE
        # 1,500 from 127.0.0.3: max.connections admits what is left of 1,000 (the normal client
        # holds a few)
        from_3 = open_idle(port, "127.0.0.3", 1500)
        flood += from_3
        closed_3 = wait_closed_count(from_3, 1500 - (MAX_CONNECTIONS - PER_IP_OVERRIDE), 5)
        admitted_3 = 1500 - closed_3
        assert MAX_CONNECTIONS - PER_IP_OVERRIDE - 10 <= admitted_3 <= MAX_CONNECTIONS - PER_IP_OVERRIDE, admitted_3
        assert client.delivered_within(1.0) > 0, "the normal client stalled while the broker was full"

        # the idle ones are closed after connections.max.idle.ms; the busy client is not
        assert wait_closed_count(flood, len(flood), IDLE_MS / 1000 + 10) == len(flood)
        assert client.delivered_within(1.0) > 0
        for s in flood:
            s.close()
        flood.clear()

        # refusals are logged, rate-limited (a burst, then a trickle with a count of the rest)
        text = c.log_path(1).read_bytes()[log_from:].decode(errors="replace")
        refused_lines = [ln for ln in text.splitlines() if "event='connection_refused'" in ln]
        assert 1 <= len(refused_lines) <= 210, len(refused_lines)
        assert "connections_idle_closed" in text

        # partial 60 MiB requests: only one is read while the budget is spent
        pid = c.pid(1)
        assert pid is not None
        before = rss_bytes(pid)
        payload = memoryview(b"\0" * PARTIAL)
        stalled = []
        threads = []
        for _ in range(8):
            s = socket.create_connection(("127.0.0.1", port), timeout=3)
            stalled.append(s)
            s.sendall(struct.pack(">i", PARTIAL + 100))  # declared larger than what follows: never complete

            def push(s: socket.socket = s) -> None:
                try:
                    s.sendall(payload)
                except OSError:
                    pass  # blocked: the broker stopped reading this one

            t = threading.Thread(target=push, daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(15)
        time.sleep(0.5)
        grown = rss_bytes(pid) - before
        print(f"broker RSS grew by {grown >> 20} MiB holding 8 partial 60 MiB requests (cap 32 MiB)")
        assert grown < QUEUED_MAX + PARTIAL + (24 << 20), f"RSS grew by {grown >> 20} MiB"
        assert "request_memory_full" in c.log_path(1).read_bytes()[log_from:].decode(errors="replace")
        for s in stalled:
            s.close()
        time.sleep(0.5)
        assert client.delivered_within(1.0) > 0, "the normal client stalled after the partial requests"
    finally:
        client.stop.set()
        client.thread.join(20)
        for s in flood:
            s.close()
    assert not client.failed, client.failed[:5]


def test_accept_without_descriptors_is_logged_and_recovers(cluster_factory) -> None:
    """The broker's descriptor limit is lowered under its feet (prlimit): accepts fail with
    EMFILE, which the broker logs (not libuv's silent drop), and service resumes when the limit
    is back."""
    c: Cluster = cluster_factory(brokers=1)
    pid = c.pid(1)
    assert pid is not None
    log_from = c.log_path(1).stat().st_size
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    in_use = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (in_use + 5, hard))
    socks = []
    try:
        socks = [socket.create_connection(("127.0.0.1", c.broker_port(1)), timeout=5) for _ in range(30)]
        deadline = time.monotonic() + 10
        text = ""
        while "accept_failed" not in text and time.monotonic() < deadline:
            time.sleep(0.2)
            text = c.log_path(1).read_bytes()[log_from:].decode(errors="replace")
        lines = [ln for ln in text.splitlines() if "event='accept_failed'" in ln]
        assert lines and "EMFILE" in lines[0], text[-2000:]
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    # the connections that waited in the backlog are accepted now, and a client is served
    for s in socks:
        s.close()
    producer = Producer({"bootstrap.servers": c.bootstrap, "log_level": 3})
    producer.produce("after-emfile", b"v")
    assert producer.flush(30) == 0, "the broker did not serve a client after descriptors came back"


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("max.connections.per.ip.overrides", "127.0.0.1", "is not HOST:COUNT"),
    ("max.connections.per.ip.overrides", "no-such-host.invalid:5", "cannot resolve"),
    ("max.connections", "-1", "max.connections: -1 is below 0"),
    ("max.connections.per.ip", "0", "must be set when max.connections.per.ip is 0"),
    ("queued.max.request.bytes", "lots", "is not an integer"),
    ("connections.max.idle.ms", "0", "connections.max.idle.ms: 0 is below 1"),
])
def test_bad_connection_configs_exit_with_one_line(tmp_path: Path, key: str, value: str, needle: str) -> None:
    props = {"node.id": 1, "process.roles": "broker", "listeners": "PLAINTEXT://127.0.0.1:1",
             "controller.quorum.voters": "100@127.0.0.1:2", "log.dirs": tmp_path / "logs", key: value}
    cfg = tmp_path / "server.properties"
    cfg.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    p = subprocess.run([sys.executable, "-m", "broker", "--config", str(cfg)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and needle in err[0], (p.returncode, err)
