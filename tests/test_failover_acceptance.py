"""Leader failover loses no acknowledged message: 3 brokers, RF 3, min.insync.replicas 2. A confluent-kafka idempotent
producer sends 200,000 messages with acks=all while the partition leader is kill -9ed mid-run
and restarted; every acknowledged message is read back exactly once, offsets are contiguous,
and the restarted broker rejoins the ISR."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import wait_for_kafka as wait_for
from tools.cluster import Cluster

pytestmark = pytest.mark.slow
N = 200_000
FAST = {"replica.lag.time.max.ms": "5000", "broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}


def state(a: AdminClient, topic: str):
    md = a.list_topics(topic, timeout=3).topics[topic].partitions[0]
    return md.leader, sorted(md.isrs)



def test_idempotent_producer_survives_leader_kill(tmp_path):
    c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=FAST,
                controller_overrides={"broker.session.timeout.ms": "3000"})
    c.start()
    try:
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        a.create_topics([NewTopic("ha", 1, 3, config={"min.insync.replicas": "2"})])["ha"].result(30)
        leader, isr = wait_for(lambda: (s := state(a, "ha"))[1] == [1, 2, 3] and s, 30, "full ISR")
        p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5, "message.timeout.ms": 120000})
        acked: dict[bytes, int] = {}
        failed = []

        def cb(err, m):
            if err is None:
                acked[m.value()] = m.offset()
            else:
                failed.append(err)

        killed = threading.Event()

        def killer():
            # kill the leader once a good part of the stream is acknowledged
            while len(acked) < N // 3:
                time.sleep(0.05)
            c.kill(leader)
            killed.set()

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        for i in range(N):
            while True:
                try:
                    p.produce("ha", value=b"m%07d" % i, on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
        assert p.flush(180) == 0
        t.join(10)
        assert killed.is_set(), "the leader was killed mid-run"
        assert not failed, failed[:3]
        assert len(acked) == N
        new_leader = wait_for(lambda: (s := state(a, "ha"))[0] not in (leader, -1) and s[0], 30, "new leader")
        assert new_leader != leader
        c.start_node(leader)
        wait_for(lambda: state(a, "ha")[1] == [1, 2, 3], 90, "the restarted broker back in the ISR")

        cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "verify", "enable.auto.commit": False,
                         "enable.partition.eof": True})
        cons.assign([TopicPartition("ha", 0, 0)])
        got = []
        deadline = time.time() + 120
        while time.time() < deadline:
            msgs = cons.consume(10000, 1.0)
            if any(m.error() and m.error().code() == KafkaError._PARTITION_EOF for m in msgs):
                break
            got.extend((m.offset(), m.value()) for m in msgs if not m.error())
        cons.close()
        offsets = [o for o, _ in got]
        assert offsets == list(range(len(got))), "offsets are contiguous"
        values = [v for _, v in got]
        assert len(values) == len(set(values)), "no message appears twice"
        assert set(values) == set(acked), "every acknowledged message is there (and nothing else)"
        for v, o in acked.items():
            assert got[o][1] == v, "each message sits at the offset its acknowledgement named"
    finally:
        c.stop()
