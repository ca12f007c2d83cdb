"""Diskless topics under failures: an idempotent producer whose broker is killed (-9) while it
writes (files uploaded and maybe committed, answers lost) retries through another broker with no
duplicate and no gap; a diskless coordinator's leader killed (-9) under produce load hands over to
a follower, offsets stay contiguous and no acknowledged message is lost."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.conftest import FAST_FENCING
from tests.test_diskless_acceptance import CONTROLLER, PARTITIONS, RACKS, TOPIC, _create_topic, _overrides, _read_all
from tools.cluster import Cluster


def _cluster(tmp_path: Path) -> Cluster:
    c = Cluster(tmp_path / "cluster", brokers=3,
                broker_overrides={**_overrides("local", None, tmp_path), "broker.heartbeat.interval.ms": "500"},
                controller_overrides={**CONTROLLER, **FAST_FENCING},
                per_broker_overrides={b: {"broker.rack": r} for b, r in RACKS.items()})
    c.start()
    _create_topic(c.bootstrap)
    return c


def _produce_while(c: Cluster, via: int, action: Any, n: int) -> dict[int, list[tuple[int, bytes]]]:
    """An idempotent librdkafka producer writes n messages through broker `via` (its client id
    names that broker's rack); `action` runs once a third of them are acknowledged."""
    from confluent_kafka import Producer

    acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    count = [0]
    lock = threading.Lock()

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        with lock:
            acked[msg.partition()].append((msg.offset(), msg.value()))
            count[0] += 1

    p = Producer({"bootstrap.servers": f"127.0.0.1:{c.broker_port(via)}",
                  "client.id": f"writer-diskless_az={RACKS[via]}", "linger.ms": 2, "acks": "all",
                  "enable.idempotence": True, "message.timeout.ms": 120000})
    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            while True:
                try:
                    p.produce(TOPIC, value=f"m{i}".encode(), key=f"k{i % 31}".encode(), on_delivery=on_delivery)
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
            if i % 100 == 0:
                time.sleep(0.005)  # requests keep flowing while the action happens

    third = n // 3
    send(0, third)
    assert p.flush(60) == 0
    send(third, 2 * third)  # in flight (buffered, uploaded, committing) when the action hits
    action()
    send(2 * third, n)
    assert p.flush(180) == 0
    return acked


def _check(c: Cluster, acked: dict[int, list[tuple[int, bytes]]], n: int, reader_broker: int) -> None:
    values = [v for rows in acked.values() for _, v in rows]
    assert len(values) == n and len(set(values)) == n  # every message acknowledged once
    got = _read_all(f"127.0.0.1:{c.broker_port(reader_broker)}", f"reader-diskless_az={RACKS[reader_broker]}", n)
    stored = [v for rows in got.values() for _, v in rows]
    assert sorted(stored) == sorted(values), "stored messages differ from the acknowledged ones (duplicate or loss)"
    for part in range(PARTITIONS):
        offsets = [o for o, _ in got.get(part, [])]
        assert offsets == list(range(len(offsets))), f"partition {part}: offsets not contiguous"
        assert sorted(acked.get(part, [])) == got.get(part, []), f"partition {part}: not as acknowledged"
        # per partition, a producer's messages keep the order they were sent in
        seq = [int(v[1:]) for _, v in got.get(part, [])]
        assert seq == sorted(seq), f"partition {part}: order differs from the send order"


def test_producer_broker_killed(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    try:
        n = 6000
        acked = _produce_while(c, 1, lambda: c.kill(1), n)
        _check(c, acked, n, 2)
    finally:
        c.stop()


def _coordinator_leader(c: Cluster) -> int:
    """The leader of the diskless coordinator's partition 0, once the metadata topic has one (it
    is created with the first diskless topic, and a broker may not have its leader yet)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": c.bootstrap})
    deadline = time.monotonic() + 30
    while True:
        md = admin.list_topics("__diskless_metadata", timeout=15)
        info = md.topics["__diskless_metadata"].partitions.get(0)
        if info is not None and info.leader >= 0:
            return int(info.leader)
        assert time.monotonic() < deadline, f"__diskless_metadata has no leader for partition 0: {md.topics}"
        time.sleep(0.2)


def test_coordinator_leader_killed(tmp_path: Path) -> None:
    c = _cluster(tmp_path)
    try:
        victim = _coordinator_leader(c)
        via = next(b for b in (1, 2, 3) if b != victim)
        n = 6000
        acked = _produce_while(c, via, lambda: c.kill(victim), n)
        _check(c, acked, n, via)
    finally:
        c.stop()
