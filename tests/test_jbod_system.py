"""The JBOD system tests of KIP-113's test plan, with the tools as an operator runs them:
kafka-log-dirs.sh and kafka-reassign-partitions.sh (log_dirs, --verify).

1. 3 brokers x 2 log dirs, a topic of 3 partitions with RF 1, a producer and a consumer running:
   every replica moves to the other dir of its broker, then to the unused dir of the next broker;
   each step verified with --verify; no message lost or duplicated.
2. Bad log dirs found at runtime leave the good ones serving, with real faults instead of chmod 000
   (root ignores permissions): each broker's second dir is ext4 on a loop device mounted
   errors=remount-ro and fails by a real filesystem error; on a follower of topic1, then its
   leader, then every broker; topic1 (in the first dirs) keeps serving with no message lost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.disk_faults import ext4_loop, unavailable
from tools.cluster import REPO_ROOT, Cluster

FAST = {"broker.heartbeat.interval.ms": "300", "broker.session.timeout.ms": "3000", "replica.lag.time.max.ms": "3000"}
CTL = {"broker.session.timeout.ms": "3000"}


def tool(module: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def log_dirs(bootstrap: str, *extra: str) -> dict:
    r = tool("tools.kafka_log_dirs", "--describe", "--bootstrap-server", bootstrap, *extra)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def replica_dir(desc: dict, topic: str, partition: int) -> tuple[int, str]:
    """(broker, dir) of the live replica."""
    found = [(d["broker"], d["path"]) for d in desc["log_dirs"] for p in d["partitions"]
             if (p["topic"], p["partition"]) == (topic, partition) and not p["is_temporary"]]
    assert len(found) == 1, found
    return found[0]


def reassign(bootstrap: str, tmp: Path, entries: list[dict], name: str) -> None:
    f = tmp / f"{name}.json"
    f.write_text(json.dumps({"version": 1, "partitions": entries}))
    r = tool("tools.kafka_reassign_partitions", "--bootstrap-server", bootstrap, "--execute",
             "--reassignment-json-file", str(f), "--timeout", "20000")
    assert r.returncode == 0, r.stdout + r.stderr
    deadline = time.time() + 90
    while True:
        v = tool("tools.kafka_reassign_partitions", "--bootstrap-server", bootstrap, "--verify",
                 "--reassignment-json-file", str(f))
        assert v.returncode == 0, v.stderr
        lines = [x for x in v.stdout.splitlines() if x.startswith(("Reassignment", "Partition", "There"))]
        if lines and all(x.endswith("is completed.") for x in lines):
            return
        assert time.time() < deadline, v.stdout
        time.sleep(0.5)


class Traffic:
    """An idempotent acks=all producer and an assigned consumer running on a topic."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, flush_s: float = 120) -> None:
        self.bootstrap, self.topic, self.partitions, self.flush_s = bootstrap, topic, partitions, flush_s
        self.acked: set[bytes] = set()
        self.seen: list[bytes] = []
        self.stop = threading.Event()
        self.produced = threading.Event()
        self._deadline = float("inf")
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]
        for t in self.threads:
            t.start()

    def _produce(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                      "linger.ms": 5, "message.timeout.ms": 120000})
        i = 0
        while not self.stop.is_set():
            v = b"%s-%08d" % (self.topic.encode(), i)
            try:
                p.produce(self.topic, value=v + b"." * 500, partition=i % self.partitions,
                          on_delivery=lambda err, m: err is None and self.acked.add(m.value().split(b".")[0]))
                i += 1
            except BufferError:
                pass
            p.poll(0.005)
        p.flush(self.flush_s)
        self.produced.set()

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"sys-{self.topic}",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        c.assign([TopicPartition(self.topic, i, 0) for i in range(self.partitions)])
        try:
            while not self.produced.is_set() or not self.acked <= set(self.seen):
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    self.seen.append(m.value().split(b".")[0])
                if time.time() > self._deadline:
                    break
        finally:
            c.close()

    def finish(self, timeout: float = 60) -> None:
        """Stop producing, then let the consumer read what was acknowledged (up to `timeout`)."""
        self.stop.set()
        self.threads[0].join(self.flush_s + 10)
        self._deadline = time.time() + timeout
        self.threads[1].join(timeout + 5)

    def check(self) -> None:
        assert len(self.acked) > 100, "the producer wrote too little"
        assert len(self.seen) == len(set(self.seen)), "a message was consumed twice"
        assert self.acked <= set(self.seen), f"{len(self.acked - set(self.seen))} acknowledged messages lost"


def test_seed_system_test_1_moves_within_and_across_brokers(tmp_path):
    c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=FAST, controller_overrides=CTL)
    try:
        c.start()
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        a.create_topics([NewTopic("sys1", 3, 1)])["sys1"].result(30)
        traffic = Traffic(c.bootstrap, "sys1", 3)
        time.sleep(1.5)
        desc = log_dirs(c.bootstrap)
        dirs_of = {b: sorted(d["path"] for d in desc["log_dirs"] if d["broker"] == b) for b in c.broker_ids}
        where = {p: replica_dir(desc, "sys1", p) for p in range(3)}
        # 1. every replica to the other dir of its broker
        entries = []
        for p, (b, d) in where.items():
            other = next(x for x in dirs_of[b] if x != d)
            entries.append({"topic": "sys1", "partition": p, "replicas": [b], "log_dirs": [other]})
        reassign(c.bootstrap, tmp_path, entries, "within")
        desc = log_dirs(c.bootstrap)
        for e in entries:
            assert replica_dir(desc, "sys1", e["partition"]) == (e["replicas"][0], e["log_dirs"][0])
        # 2. to the unused dir of the next broker (1 -> 2 -> 3 -> 1)
        used = {(b, d) for b, d in (replica_dir(desc, "sys1", p) for p in range(3))}
        entries = []
        for p in range(3):
            b, _ = replica_dir(desc, "sys1", p)
            nxt = b % 3 + 1
            unused = next(x for x in dirs_of[nxt] if (nxt, x) not in used)
            entries.append({"topic": "sys1", "partition": p, "replicas": [nxt], "log_dirs": [unused]})
        reassign(c.bootstrap, tmp_path, entries, "across")
        desc = log_dirs(c.bootstrap)
        for e in entries:
            assert replica_dir(desc, "sys1", e["partition"]) == (e["replicas"][0], e["log_dirs"][0])
        time.sleep(1)
        traffic.finish()
        traffic.check()
        assert all(c.is_running(b) for b in c.broker_ids)
    finally:
        c.stop()


def test_tools_describe_balance_and_bad_input(tmp_path):
    c = Cluster(tmp_path / "c", brokers=1, verbose=False, broker_overrides=FAST)
    try:
        c.start()
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        for f in a.create_topics([NewTopic("big", 1, 1), NewTopic("small", 2, 1)]).values():
            f.result(30)
        p = Producer({"bootstrap.servers": c.bootstrap})
        for part, n in (("big", 300), ("small", 100)):
            for k in range(n):
                p.produce(part, value=b"x" * 10_000, partition=k % 2 if part == "small" else 0)
                p.poll(0)
        p.flush(30)
        dirs = sorted(str(x) for x in c.node_dir(1).glob("logs-*"))
        # everything in the first dir: 3 MB + 2 x 0.5 MB against nothing
        reassign(c.bootstrap, tmp_path, [{"topic": t, "partition": i, "replicas": [1], "log_dirs": [dirs[0]]}
                                         for t, i in (("big", 0), ("small", 0), ("small", 1))], "gather")
        desc = log_dirs(c.bootstrap, "--topic-list", "big,small")
        assert desc["version"] == 1 and {d["is_live"] for d in desc["log_dirs"]} == {True}
        entry = next(q for d in desc["log_dirs"] for q in d["partitions"] if q["topic"] == "big")
        assert entry["size"] >= 3_000_000 and entry["chunk_start_offset"] == 0 and entry["is_temporary"] is False
        assert {d["broker"] for d in desc["log_dirs"]} == {1}
        # the balance moves the big partition alone: 1 MB against 3 MB beats anything else
        r = tool("tools.kafka_log_dirs", "--generate-balance", "--bootstrap-server", c.bootstrap, "--broker-list", "1")
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout.strip().splitlines()[-1])
        assert plan["partitions"] == [{"topic": "big", "partition": 0, "replicas": [1], "log_dirs": [dirs[1]]}]
        reassign(c.bootstrap, tmp_path, plan["partitions"], "balance")
        assert replica_dir(log_dirs(c.bootstrap), "big", 0) == (1, dirs[1])
        # bad input: one line naming the culprit, non-zero, nothing changed
        for bad, needle in ((["relative/x"], "relative/x"), (["/not/a/dir"], "/not/a/dir")):
            f = tmp_path / "bad.json"
            f.write_text(json.dumps({"version": 1, "partitions": [
                {"topic": "big", "partition": 0, "replicas": [1], "log_dirs": bad}]}))
            r = tool("tools.kafka_reassign_partitions", "--bootstrap-server", c.bootstrap, "--execute",
                     "--reassignment-json-file", str(f))
            assert r.returncode != 0 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        r = tool("tools.kafka_log_dirs", "--describe", "--bootstrap-server", c.bootstrap, "--broker-list", "7")
        assert r.returncode == 1 and "broker 7" in r.stderr
        assert replica_dir(log_dirs(c.bootstrap), "big", 0) == (1, dirs[1])
    finally:
        c.stop()


def test_seed_system_test_2_bad_dirs_at_runtime_leave_good_ones_serving(tmp_path):
    reason = unavailable()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)
    good = {b: tmp_path / f"b{b}-good" for b in (1, 2, 3)}
    bad_paths = {b: tmp_path / f"b{b}-bad" for b in (1, 2, 3)}
    with ext4_loop(bad_paths[1], 32 << 20) as f1, ext4_loop(bad_paths[2], 32 << 20) as f2, \
            ext4_loop(bad_paths[3], 32 << 20) as f3:
        faults = {1: f1, 2: f2, 3: f3}
        c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=FAST, controller_overrides=CTL,
                    per_broker_overrides={b: {"log.dirs": f"{good[b]},{bad_paths[b]}"} for b in (1, 2, 3)})
        try:
            c.start()
            a = AdminClient({"bootstrap.servers": c.bootstrap})
            for t, dirs in (("topic1", good), ("topic2", bad_paths)):
                a.create_topics([NewTopic(t, 1, 3)])[t].result(30)
                time.sleep(0.5)
                reassign(c.bootstrap, tmp_path, [{"topic": t, "partition": 0, "replicas": [1, 2, 3],
                                                  "log_dirs": [str(dirs[b]) for b in (1, 2, 3)]}], t)
            t1, t2 = Traffic(c.bootstrap, "topic1", 1), Traffic(c.bootstrap, "topic2", 1, flush_s=3)
            time.sleep(1)
            md = a.list_topics("topic1", timeout=5).topics["topic1"].partitions[0]
            leader = md.leader
            follower = next(b for b in (1, 2, 3) if b != leader)
            for victims in ([follower], [leader], [1, 2, 3]):
                for b in victims:
                    if not faults[b].is_read_only():
                        faults[b].trigger_error()
                time.sleep(3)  # topic2's writes hit the read-only dirs; topic1 goes on
                for b in victims:
                    assert "log_dir_offline" in c.log_path(b).read_text(), f"broker {b} did not notice"
                assert all(c.is_running(b) for b in (1, 2, 3)), "a broker with a good dir left stopped"
                md = a.list_topics("topic1", timeout=5).topics["topic1"].partitions[0]
                assert md.leader in (1, 2, 3) and sorted(md.isrs) == [1, 2, 3]
            t1.finish()
            t1.check()
            t2.finish(timeout=3)
            assert len(t2.acked) > 0
        finally:
            c.stop()
