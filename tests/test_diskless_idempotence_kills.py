"""Idempotence across brokers on a diskless topic: 100,000 idempotent acks=all records produced
with librdkafka while each of the 3 brokers is killed (-9) in turn and restarted (the broker the
producer writes through, coordinator leaders, gateways: every one of them once). The diskless
coordinator holds each producer's sequences, so a batch retried through another broker is not
written twice: every acknowledged record is read back exactly once, offsets contiguous, in send
order per partition."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.test_diskless_acceptance import RACKS, TOPIC
from tests.test_diskless_failover import _check, _cluster

pytestmark = pytest.mark.slow

N = 100_000
ISR_BACK_S = 4.0  # a restarted broker's __diskless_metadata replicas rejoin the ISR (min ISR 2) before the next kill


@pytest.mark.timeout(600)
def test_idempotent_records_through_brokers_killed_in_turn(tmp_path: Path) -> None:
    from confluent_kafka import Producer

    c = _cluster(tmp_path)
    try:
        acked: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
        lock = threading.Lock()

        def on_delivery(err: Any, msg: Any) -> None:
            assert err is None, err
            with lock:
                acked[msg.partition()].append((msg.offset(), msg.value()))

        p = Producer({"bootstrap.servers": ",".join(f"127.0.0.1:{c.broker_port(b)}" for b in (1, 2, 3)),
                      "client.id": f"turns-diskless_az={RACKS[1]}", "linger.ms": 5, "acks": "all",
                      "enable.idempotence": True, "message.timeout.ms": 300000})

        def send(lo: int, hi: int) -> None:
            for i in range(lo, hi):
                while True:
                    try:
                        p.produce(TOPIC, value=f"m{i}".encode(), key=f"k{i % 31}".encode(), on_delivery=on_delivery)
                        break
                    except BufferError:
                        p.poll(0.05)
                p.poll(0)
                if i % 200 == 0:
                    time.sleep(0.002)  # requests stay in flight while a broker dies

        step = N // 4
        send(0, step)
        for k, victim in enumerate((1, 2, 3), start=1):
            send(k * step, k * step + step // 2)  # buffered, uploaded, committing when it dies
            c.kill(victim)
            send(k * step + step // 2, (k + 1) * step)
            c.start_node(victim)
            time.sleep(ISR_BACK_S)
        send(4 * step, N)
        assert p.flush(300) == 0
        _check(c, acked, N, 2)
    finally:
        c.stop()
