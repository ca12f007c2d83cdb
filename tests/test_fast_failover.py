"""Failover in about a second: a broker whose process dies closes its connections to the
controller, which fences it (metadata records, as for a session timeout) unless it reconnects
within half a second, instead of waiting broker.session.timeout.ms (docs/concepts/failure-detection.md, "Broker failure
detection"). First the rule on a fake clock; then a kill -9 of a partition leader under an
acks=all producer (default 9 s session): writes resume within 3 s and no acknowledged write is
lost; then a broker paused with SIGSTOP for less than its session is not fenced: a pause closes
no connection."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field

import pytest

from controller.fencing import BrokerSessions
from tests.conftest import wait_for_kafka as wait_for
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(240)


# ---------------------------------------------------------------- the rule, on a fake clock
@dataclass
class FakeLink:
    closed: bool = False
    callbacks: list = field(default_factory=list)

    def on_close(self, callback) -> None:
        self.callbacks.append(callback)

    def close(self) -> None:
        self.closed = True
        for cb in self.callbacks:
            cb()


def test_sessions_fence_a_broker_whose_connections_all_closed_after_the_grace():
    now = [0.0]
    s = BrokerSessions(9000, clock=lambda: now[0], grace=1.0)
    first, second = FakeLink(), FakeLink()
    s.touch(1)
    s.bind(1, first)
    s.bind(1, second)  # a heartbeat and a metadata fetch on two connections
    s.touch(2)  # never bound (no connection seen): only its session can run out
    s.bind(3, FakeLink())  # a broker still connected: our own network works
    woken = []
    s.on_link_closed = lambda: woken.append(now[0])
    assert s.check_interval() == 1.0  # nothing closing: the session's pace
    first.close()
    now[0] = 5.0
    assert s.lapsed([1, 2]) == {}  # one connection still open
    second.close()
    assert woken == [0.0, 5.0]  # each close wakes the fencing loop
    assert s.lapsed([1, 2]) == {}  # which looks: closed just now, the grace starts
    assert s.check_interval() <= 0.2  # and it looks again soon
    now[0] = 5.5
    s.bind(1, FakeLink())  # reconnected within the grace (a broker's channel retries in 100 ms)
    now[0] = 7.0
    assert s.lapsed([1, 2]) == {}
    s.touch_all([1, 2])  # a new active controller: links start afresh
    gone = FakeLink()
    s.bind(1, gone)
    s.bind(3, FakeLink())
    gone.closed = True
    assert s.lapsed([1]) == {}
    now[0] = 7.9
    assert s.lapsed([1]) == {}
    now[0] = 8.1
    assert s.lapsed([1, 2]) == {1: "connection_closed"}
    now[0] = 17.0
    assert s.lapsed([1, 2]) == {1: "session_timeout", 2: "session_timeout"}
    assert s.check_interval() <= 0.2


def test_sessions_do_not_fence_every_broker_when_all_connections_close_at_once():
    """Every broker's connections closing together says more of our own network (a partition
    that resets connections) than of the brokers: only the session timeout fences then, and once
    one broker is back the others get a full grace to reconnect too."""
    now = [0.0]
    s = BrokerSessions(9000, clock=lambda: now[0], grace=0.5)
    links = {b: FakeLink() for b in (1, 2, 3)}
    for b, link in links.items():
        s.touch(b)
        s.bind(b, link)
    for link in links.values():
        link.close()
    for t in (0.0, 0.6, 2.0):
        now[0] = t
        assert s.lapsed([1, 2, 3]) == {}
    s.bind(3, FakeLink())  # the network is back: broker 3 reconnected first
    now[0] = 2.05
    assert s.lapsed([1, 2, 3]) == {}  # 1 and 2: their grace starts now
    s.bind(2, FakeLink())
    now[0] = 2.6
    assert s.lapsed([1, 2, 3]) == {1: "connection_closed"}  # 1 stayed away for the grace
    # a lone broker's new process registering: it reached us, so the old one is gone
    alone = BrokerSessions(9000, clock=lambda: now[0], grace=0.5)
    old = FakeLink()
    alone.touch(1)
    alone.bind(1, old)
    old.close()
    assert alone.lapsed([1]) == {}
    now[0] = 3.2
    assert alone.lapsed([1]) == {}  # the fencing loop waits for the session
    assert alone.lapsed([1], reachable=True) == {1: "connection_closed"}  # a registration need not


# ---------------------------------------------------------------- a real cluster
def leader_and_isr(admin, topic: str) -> tuple[int, list[int]]:
    md = admin.list_topics(topic, timeout=5).topics[topic].partitions[0]
    return md.leader, sorted(md.isrs)


def fenced_lines(c: Cluster) -> list[str]:
    return [ln for ln in c.log_path(c.controller_ids[0]).read_text().splitlines() if "broker_fenced" in ln]


def test_acks_all_writes_resume_within_3s_of_a_leader_kill(tmp_path):
    from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    c = Cluster(tmp_path / "c", brokers=3, verbose=False)  # broker.session.timeout.ms: 9 s, Kafka's default
    c.start()
    try:
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("fast", 1, 3, config={"min.insync.replicas": "2"})])["fast"].result(30)
        leader, _ = wait_for(lambda: (s := leader_and_isr(admin, "fast"))[1] == [1, 2, 3] and s, 30, "full ISR")
        p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 1, "message.timeout.ms": 60000})
        acked: dict[bytes, tuple[int, float]] = {}
        failed: list[object] = []

        def cb(err, m) -> None:
            if err is None:
                acked[m.value()] = (m.offset(), time.monotonic())
            else:
                failed.append(err)

        killed_at = 0.0
        stop = threading.Event()

        def kill_later() -> None:
            nonlocal killed_at
            time.sleep(2)
            killed_at = time.monotonic()
            c.kill(leader)
            time.sleep(6)
            stop.set()

        killer = threading.Thread(target=kill_later, daemon=True)
        killer.start()
        i = 0
        while not stop.is_set():
            p.produce("fast", value=b"v%07d" % i, on_delivery=cb)
            i += 1
            p.poll(0.005)
        assert p.flush(60) == 0
        killer.join()
        assert not failed, failed[:3]
        after = sorted(t for _, t in acked.values() if t > killed_at)
        assert after, "writes resumed after the kill"
        gap = after[0] - killed_at
        print(f"acks=all writes resumed {gap:.2f} s after kill -9 of leader {leader}")
        assert gap <= 3.0, f"writes resumed {gap:.2f} s after the kill"
        assert any(f"broker={leader} " in ln and "connection_closed" in ln for ln in fenced_lines(c)), fenced_lines(c)

        cons = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "verify", "enable.auto.commit": False,
                         "enable.partition.eof": True})
        cons.assign([TopicPartition("fast", 0, 0)])
        got: dict[bytes, int] = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msgs = cons.consume(10000, 1.0)
            got.update((m.value(), m.offset()) for m in msgs if not m.error())
            if any(m.error() and m.error().code() == KafkaError._PARTITION_EOF for m in msgs):
                break
        cons.close()
        lost = [v for v in acked if v not in got]
        assert not lost, f"{len(lost)} acknowledged writes lost, e.g. {lost[:3]}"
        assert all(got[v] == o for v, (o, _) in acked.items()), "each write sits at the offset its ack named"
    finally:
        c.stop()


def test_a_paused_broker_is_not_fenced_before_its_session_runs_out(tmp_path):
    from confluent_kafka.admin import AdminClient

    c = Cluster(tmp_path / "c", brokers=2, verbose=False)
    c.start()
    try:
        pid = c.pid(2)
        assert pid is not None
        os.killpg(pid, signal.SIGSTOP)  # a long GC pause: no connection closes
        try:
            time.sleep(5)  # under the 9 s session
        finally:
            os.killpg(pid, signal.SIGCONT)
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        wait_for(lambda: sorted(admin.list_topics(timeout=5).brokers) == [1, 2], 20, "both brokers listed")
        time.sleep(1)  # a heartbeat or two after the pause
        assert not [ln for ln in fenced_lines(c) if re.search(r"broker=2\b", ln)], fenced_lines(c)
    finally:
        c.stop()


def test_a_controller_cut_off_from_every_broker_for_a_moment_fences_none(tmp_path):
    """The active controller's links to all brokers reset for 1.5 s (past the 0.5 s grace, within
    the session): no broker is fenced, no leader moves."""
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests.faults.schedule import wire_links

    c = Cluster(tmp_path / "c", brokers=3, verbose=False)
    links = wire_links(c)  # every broker reaches the controller through a proxy
    try:
        c.start()
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("steady", 1, 3)])["steady"].result(30)
        before = wait_for(lambda: (s := leader_and_isr(admin, "steady"))[1] == [1, 2, 3] and s, 30, "full ISR")
        controller = c.controller_ids[0]
        for link in links[controller]:
            link.cut()
        time.sleep(1.5)
        for link in links[controller]:
            link.heal()
        time.sleep(2)  # the brokers reconnect and heartbeat
        assert not fenced_lines(c), fenced_lines(c)
        assert leader_and_isr(admin, "steady") == before
    finally:
        c.stop()
        for link in {id(x): x for xs in links.values() for x in xs}.values():
            link.close()


def test_brokers_reach_the_new_controller_before_their_sessions_run_out(tmp_path):
    """The active controller paused (SIGSTOP) past the brokers' sessions: another voter takes over
    within a few seconds with fresh sessions, and each broker's heartbeat gives up on the silent
    one soon enough to reach it in time (Kafka: KAFKA-14392), so none is fenced."""
    c = Cluster(tmp_path / "c", brokers=3, controllers=3, verbose=False,
                controller_overrides={"broker.session.timeout.ms": 6000},
                broker_overrides={"broker.session.timeout.ms": 6000})
    c.start()
    try:
        active = c.active_controller()
        assert active is not None
        time.sleep(1)
        pid = c.pid(active)
        assert pid is not None
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(12)
        finally:
            os.killpg(pid, signal.SIGCONT)
        time.sleep(1)
        fenced = [ln for cid in c.controller_ids for ln in c.log_path(cid).read_text().splitlines()
                  if "broker_fenced" in ln]
        assert not fenced, fenced
    finally:
        c.stop()
