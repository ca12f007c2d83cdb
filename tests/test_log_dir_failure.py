"""A failed log dir takes down only itself, with real OS faults:

- ENOSPC: a broker's dir is a small tmpfs that fills under acks=all writes. The dir goes offline,
  the controller hears it in the next heartbeat and moves leadership (and the ISR) off the
  replica; every acknowledged message is read back; the broker's other dir keeps serving. Once
  the other dir fills too, the broker has no dir left and shuts down (exit status 1).
- EROFS: ext4 on a loop device mounted errors=remount-ro, made read-only by a real filesystem
  error (/sys/fs/ext4/<dev>/trigger_fs_error). A broker restarted while the dir is read-only
  starts on its other dir and serves every partition there.

They need root and mount; without them they skip saying so.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import wait_for
from tests.disk_faults import ext4_loop, tmpfs, unavailable
from tools.cluster import Cluster

FAST = {"broker.heartbeat.interval.ms": "300", "replica.lag.time.max.ms": "4000", "broker.session.timeout.ms": "3000"}
CTL = {"broker.session.timeout.ms": "3000"}


@pytest.fixture(autouse=True)
def _needs_mounts():
    reason = unavailable()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)


def leader_isr(a: AdminClient, topic: str, partition: int = 0) -> tuple[int, list[int]]:
    md = a.list_topics(topic, timeout=5).topics[topic].partitions[partition]
    return md.leader, sorted(md.isrs)


def dir_holding(dirs: list[Path], topic: str, partition: int = 0) -> Path:
    for d in dirs:
        if (d / f"{topic}-{partition}-0").is_dir():
            return d
    raise AssertionError(f"no dir of {dirs} holds {topic}-{partition}")


def produce(bootstrap: str, topic: str, values: list[bytes], partition: int = 0, timeout: float = 60) -> tuple[dict, list]:
    """(acknowledged value -> offset, errors) of an idempotent acks=all producer."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                  "message.timeout.ms": int(timeout * 1000)})
    acked: dict[bytes, int] = {}
    errors: list = []

    def cb(err, m):
        if err is None:
            acked[m.value()] = m.offset()
        else:
            errors.append(err)

    for v in values:
        while True:
            try:
                p.produce(topic, value=v, partition=partition, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    p.flush(timeout + 10)
    return acked, errors


def consume_all(bootstrap: str, topic: str, partition: int, end: int, timeout: float = 30) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{time.time()}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, 0)])
    out: list[bytes] = []
    deadline = time.time() + timeout
    try:
        while len(out) < end and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value())
    finally:
        c.close()
    return out


def log_text(c: Cluster, node) -> str:
    return c.log_path(node).read_text(errors="replace")


def test_full_dir_goes_offline_alone_leadership_moves_and_last_dir_stops_the_broker(tmp_path):
    d0, d1 = tmp_path / "b1-dir0", tmp_path / "b1-dir1"
    with tmpfs(d0, 3 << 20), tmpfs(d1, 3 << 20):
        c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=FAST, controller_overrides=CTL,
                    per_broker_overrides={1: {"log.dirs": f"{d0},{d1}"}})
        try:
            c.start()
            a = AdminClient({"bootstrap.servers": c.bootstrap})
            for t in ("first", "second"):  # one replica in each of broker 1's dirs
                a.create_topics([NewTopic(t, 1, replica_assignment=[[1, 2, 3]])])[t].result(30)
                wait_for(lambda t=t: leader_isr(a, t) == (1, [1, 2, 3]), 30, f"{t} led by broker 1 with a full ISR")
            victim = "first" if dir_holding([d0, d1], "first") == d0 else "second"
            healthy = "second" if victim == "first" else "first"
            assert dir_holding([d0, d1], healthy) != dir_holding([d0, d1], victim)

            # fill the victim's dir: 5 MB into a 3 MB tmpfs
            values = [b"v%05d-" % i + b"x" * 10_000 for i in range(500)]
            acked, _ = produce(c.bootstrap, victim, values)
            text = log_text(c, 1)
            assert "log_dir_offline" in text and "No space left on device" in text
            # the controller took the replica out of leadership and the ISR; writes went on
            leader, isr = wait_for(lambda: (s := leader_isr(a, victim))[0] in (2, 3) and 1 not in s[1] and s, 15,
                                   "leadership of the full dir's replica to move")
            assert len(acked) >= 400, f"only {len(acked)} of 500 acknowledged after the leader's dir failed"
            got = consume_all(c.bootstrap, victim, 0, max(acked.values()) + 1)
            assert set(acked) <= set(got), "an acknowledged message was lost"
            assert len(got) == len(set(got)), "a message was stored twice"
            # the broker's other dir serves on
            assert c.is_running(1)
            assert leader_isr(a, healthy)[0] == 1
            ok, errs = produce(c.bootstrap, healthy, [b"h%d" % i for i in range(50)], timeout=20)
            assert len(ok) == 50 and not errs
            assert sorted(consume_all(c.bootstrap, healthy, 0, 50)) == sorted(ok)

            # the last dir fills too: nothing left to serve, the broker stops (status 1)
            produce(c.bootstrap, healthy, values, timeout=20)
            assert c.process(1).wait(30) == 1
            assert "all_log_dirs_offline" in log_text(c, 1)
            wait_for(lambda: leader_isr(a, healthy)[0] in (2, 3), 15, "leadership to leave the stopped broker")
        finally:
            c.stop()


def test_restart_with_a_read_only_dir_serves_every_partition_of_the_other_dir(tmp_path):
    d0, d1 = tmp_path / "b1-dir0", tmp_path / "b1-dir1"
    with ext4_loop(d0, 32 << 20) as bad, ext4_loop(d1, 32 << 20):
        c = Cluster(tmp_path / "c", brokers=2, verbose=False, broker_overrides=FAST, controller_overrides=CTL,
                    per_broker_overrides={1: {"log.dirs": f"{d0},{d1}"}})
        try:
            c.start()
            a = AdminClient({"bootstrap.servers": c.bootstrap})
            # 4 partitions only on broker 1: two in each dir
            a.create_topics([NewTopic("solo", 4, replica_assignment=[[1]] * 4)])["solo"].result(30)
            wait_for(lambda: all(leader_isr(a, "solo", i)[0] == 1 for i in range(4)), 30, "solo led by broker 1")
            on_bad = [i for i in range(4) if dir_holding([d0, d1], "solo", i) == d0]
            on_good = [i for i in range(4) if i not in on_bad]
            assert on_bad and on_good
            before = {i: produce(c.bootstrap, "solo", [b"%d-%d" % (i, n) for n in range(20)], i)[0] for i in range(4)}
            assert all(len(v) == 20 for v in before.values())

            bad.trigger_error()
            wait_for(bad.is_read_only, 10, "the kernel to remount the failed ext4 read-only")
            # the next write to it fails with EROFS: that dir goes offline, the other serves on
            produce(c.bootstrap, "solo", [b"late"], on_bad[0], timeout=5)
            wait_for(lambda: "log_dir_offline" in log_text(c, 1), 10, "the dir to go offline")
            assert "Read-only file system" in log_text(c, 1)
            for i in on_good:
                ok, _ = produce(c.bootstrap, "solo", [b"after-%d" % i], i, timeout=10)
                assert len(ok) == 1

            # restart while the dir is still read-only: it starts on the good dir alone
            c.terminate(1)
            c.start_node(1)
            assert "log_dir_unusable" in log_text(c, 1)
            for i in on_good:
                wait_for(lambda i=i: leader_isr(a, "solo", i)[0] == 1, 20, f"solo-{i} led again")
                ok, errs = produce(c.bootstrap, "solo", [b"restarted-%d" % i], i, timeout=10)
                assert len(ok) == 1 and not errs
                got = consume_all(c.bootstrap, "solo", i, 22)
                assert set(before[i]) | {b"after-%d" % i, b"restarted-%d" % i} == set(got)
            # the read-only dir's partitions are not served from an empty copy elsewhere
            for i in on_bad:
                assert leader_isr(a, "solo", i)[0] == -1
                assert not (d1 / f"solo-{i}-0").exists()
        finally:
            c.stop()


def test_placement_prefers_room_and_a_move_into_a_filling_dir_stops_leaving_the_source(tmp_path):
    from tests.test_log_dir_moves import alter, describe, where

    small = tmp_path / "small"
    with tmpfs(small, 4 << 20):
        c = Cluster(tmp_path / "c", brokers=1, verbose=False, broker_overrides=FAST, controller_overrides=CTL,
                    per_broker_overrides={1: {"log.dirs": f"{tmp_path / 'big'},{small}"}})
        try:
            c.start()
            a = AdminClient({"bootstrap.servers": c.bootstrap})
            a.create_topics([NewTopic("pl", 3, 1)])["pl"].result(30)
            wait_for(lambda: all(leader_isr(a, "pl", i)[0] == 1 for i in range(3)), 30, "pl led")
            # placement: the dir with the most usable bytes, not round-robin
            assert all(dir_holding([tmp_path / "big", small], "pl", i) == tmp_path / "big" for i in range(3))
            acked, _ = produce(c.bootstrap, "pl", [b"p%04d-" % i + b"z" * 10_000 for i in range(800)])
            assert len(acked) == 800
            # 8 MB into a 4 MB dir: the copy hits ENOSPC, the move stops, the source stays the live copy
            assert alter(c, 1, str(small), "pl", [0]) == {0: 0}
            wait_for(lambda: describe(c, 1)[str(small)] is None, 30, "the full dir to go offline")
            assert where(c, 1, "pl") == (str(tmp_path / "big"), False)
            assert "replica_move_io_error" in log_text(c, 1)
            assert alter(c, 1, str(small), "pl", [1]) == {1: 56}  # KAFKA_STORAGE_ERROR: offline destination
            more, errs = produce(c.bootstrap, "pl", [b"after"], timeout=10)
            assert len(more) == 1 and not errs
            got = consume_all(c.bootstrap, "pl", 0, 801)
            assert set(acked) | set(more) == set(got) and len(got) == 801
            assert c.is_running(1)
        finally:
            c.stop()
