"""The operations guide's procedures, run as the pages write them (docs/operations/).

Each test reads the page's ```sh blocks (found by the marker comment above each), checks they are
the commands this file runs, and runs them line by line in bash with the venv's scripts first on
PATH, checking the cluster between lines. Starting and stopping a node is the one thing the test
does in its own way: `kill -TERM $PID` and `python -m broker|controller --config $CONFIG` lines
go through tools.cluster (the same command, started the way the launcher starts it, so the
process is the test's to stop). So a page and its test cannot drift apart.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import FAST_FENCING, eventually, wait_for
from tests.disk_faults import ext4_loop, unavailable
from tests.doc_blocks import run_line, sh_block
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "orders"


def page_block(page: str, marker: str) -> list[str]:
    return sh_block(ROOT / "docs" / "operations" / page, f"<!-- tests/test_ops_procedures.py runs this block: {marker} -->")


class Shell:
    """Runs a page's lines in bash from a scratch dir, carrying what a line exports to the next;
    node start and stop lines go to the cluster."""

    def __init__(self, cluster: Cluster, env: dict[str, str], cwd: Path) -> None:
        self.cluster = cluster
        self.cwd = cwd
        self.env_file = cwd / "shell.env"
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env}

    def __call__(self, line: str, node: int | str | None = None) -> str:
        if line.startswith("kill -TERM "):
            assert node is not None
            self.cluster.terminate(node)
            return ""
        if re.match(r"python -m (broker|controller) --config ", line):
            assert node is not None
            self.cluster.start_node(node)
            return ""
        out, self.env = run_line(line, line, cwd=self.cwd, env=self.env, env_file=self.env_file, timeout=120)
        return out


def produce(bootstrap: str, values: list[bytes], partition: int) -> list[bytes]:
    acked: list[bytes] = []
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 2,
                  "message.timeout.ms": 20000})
    for v in values:
        p.produce(TOPIC, value=v, partition=partition,
                  on_delivery=lambda err, m: acked.append(m.value() or b"") if err is None else None)
    p.flush(30)
    return acked


def read_all(bootstrap: str, partition: int, n: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ops-{time.time()}", "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, partition, 0)])
    out: list[bytes] = []
    deadline = time.time() + 30
    try:
        while len(out) < n and time.time() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                out.append(m.value() or b"")
    finally:
        c.close()
    return out


def isr(a: AdminClient, partition: int) -> list[int]:
    return sorted(a.list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[partition].isrs)


# ---- replace a failed disk (docs/operations/replace-disk.md)

DISK_BEFORE = [
    "kafka-log-dirs.sh --describe --bootstrap-server $BOOTSTRAP --broker-list 1 --kafka-json",
    "kafka-topics.sh --bootstrap-server $BOOTSTRAP --describe --topic orders",
    "kill -TERM $BROKER_PID",
]
DISK_AFTER = [
    "export CLUSTER_ID=$(kafka-metadata-quorum.sh --bootstrap-server $BOOTSTRAP describe --status "
    "| awk '/^ClusterId:/ {print $2}')",
    "kafka-storage.sh format -t $CLUSTER_ID -c $CONFIG --ignore-formatted",
    "python -m broker --config $CONFIG",
    "kafka-topics.sh --bootstrap-server $BOOTSTRAP --describe --topic orders",
    "kafka-log-dirs.sh --describe --bootstrap-server $BOOTSTRAP --broker-list 1 --kafka-json",
]


def test_replace_disk_page_is_what_the_test_runs() -> None:
    assert page_block("replace-disk.md", "replace a failed disk, before") == DISK_BEFORE
    assert page_block("replace-disk.md", "replace a failed disk, after") == DISK_AFTER


def test_replace_a_failed_disk(tmp_path: Path) -> None:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    d0, d1 = tmp_path / "b1-disk0", tmp_path / "b1-disk1"
    # both dirs small filesystems of one size, so placement puts replicas in each
    with ext4_loop(d1, 32 << 20), ExitStack() as disk:
        bad = disk.enter_context(ext4_loop(d0, 32 << 20))
        c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=FAST_FENCING,
                    controller_overrides=FAST_FENCING, per_broker_overrides={1: {"log.dirs": f"{d0},{d1}"}})
        try:
            c.start()
            a = AdminClient({"bootstrap.servers": c.bootstrap})
            a.create_topics([NewTopic(TOPIC, 4, replica_assignment=[[1, 2, 3], [2, 3, 1], [3, 1, 2], [1, 3, 2]])]
                            )[TOPIC].result(30)
            wait_for(lambda: all(isr(a, p) == [1, 2, 3] for p in range(4)), 30, "every ISR full")
            on_bad = [p for p in range(4) if (d0 / f"{TOPIC}-{p}-0").is_dir()]
            assert on_bad, "no replica in the dir to fail"
            written = {p: produce(c.bootstrap, [b"%d-%d" % (p, i) for i in range(50)], p) for p in range(4)}
            assert all(len(v) == 50 for v in written.values())

            # the disk fails: a real filesystem error, the next write to it gets EROFS
            bad.trigger_error()
            wait_for(bad.is_read_only, 10, "the kernel to remount the failed ext4 read-only")
            for p in on_bad:
                written[p] += produce(c.bootstrap, [b"%d-late" % p], p)
            wait_for(lambda: all(1 not in isr(a, p) for p in on_bad), 20, "the failed dir's replicas out of the ISR")

            sh = Shell(c, {"BOOTSTRAP": c.bootstrap, "CONFIG": str(c.config_path(1)),
                           "BROKER_PID": str(c.pid(1))}, tmp_path)
            out = sh(DISK_BEFORE[0])
            dirs = {d["logDir"]: d for b in json.loads(out.strip().splitlines()[-1])["brokers"] for d in b["logDirs"]}
            assert dirs[str(d0)]["error"].endswith("KafkaStorageException") and dirs[str(d1)]["error"] is None
            assert "Isr" in sh(DISK_BEFORE[1])
            sh(DISK_BEFORE[2], node=1)
            assert not c.is_running(1)

            # the disk is replaced: a new, empty filesystem at the same path
            disk.close()
            assert d0.is_dir() and not any(d0.iterdir()), "the failed filesystem is still mounted"

            sh(DISK_AFTER[0])
            assert f"cluster.id={sh.env['CLUSTER_ID']}" in (d1 / "meta.properties").read_text()
            sh(DISK_AFTER[1])
            assert (d0 / "meta.properties").is_file()
            sh(DISK_AFTER[2], node=1)

            eventually(lambda: all(isr(a, p) == [1, 2, 3] for p in range(4)), 60)
            described = [ln for ln in sh(DISK_AFTER[3]).splitlines() if "Partition:" in ln]
            assert len(described) == 4 and all(sorted(ln.split("Isr:")[1].split()[0].split(",")) == ["1", "2", "3"]
                                                for ln in described)
            for p in on_bad:
                assert (d0 / f"{TOPIC}-{p}-0").is_dir() or (d1 / f"{TOPIC}-{p}-0").is_dir()
            out = sh(DISK_AFTER[4])
            dirs = {d["logDir"]: d for b in json.loads(out.strip().splitlines()[-1])["brokers"] for d in b["logDirs"]}
            assert dirs[str(d0)]["error"] is None and dirs[str(d1)]["error"] is None
            # nothing acknowledged was lost, and broker 1's fetched replicas hold it all
            for p in range(4):
                assert set(written[p]) <= set(read_all(c.bootstrap, p, len(written[p])))
        finally:
            c.stop()


# ---- lose and replace a controller (docs/operations/replace-controller.md)

QUORUM_BEFORE = [
    "kafka-metadata-quorum.sh --bootstrap-server $BOOTSTRAP describe --status",
    "kafka-metadata-quorum.sh --bootstrap-server $BOOTSTRAP describe --replication",
]
QUORUM_AFTER = [
    "export CLUSTER_ID=$(kafka-metadata-quorum.sh --bootstrap-server $BOOTSTRAP describe --status "
    "| awk '/^ClusterId:/ {print $2}')",
    "kafka-storage.sh format -t $CLUSTER_ID -c $CONFIG",
    "python -m controller --config $CONFIG",
    "kafka-metadata-quorum.sh --bootstrap-server $BOOTSTRAP describe --replication",
]


def status_of(out: str) -> dict[str, str]:
    return dict(re.findall(r"^(\w+):[ \t]*(.*)$", out, re.M))


def replication_rows(out: str) -> dict[int, dict[str, str]]:
    lines = [ln.split() for ln in out.splitlines() if ln.strip()]
    head = lines[0]
    return {int(row[0]): dict(zip(head, row, strict=False)) for row in lines[1:] if row[0].isdigit()}


def test_replace_controller_page_is_what_the_test_runs() -> None:
    assert page_block("replace-controller.md", "replace a controller, before") == QUORUM_BEFORE
    assert page_block("replace-controller.md", "replace a controller, after") == QUORUM_AFTER


def test_replace_a_controller(tmp_path: Path) -> None:
    fast = {"controller.quorum.election.timeout.ms": "300", "controller.quorum.fetch.timeout.ms": "1000"}
    c = Cluster(tmp_path / "c", brokers=2, controllers=3, verbose=False,
                broker_overrides=FAST_FENCING, controller_overrides={**FAST_FENCING, **fast})
    try:
        c.start()
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        a.create_topics([NewTopic("before", 1, 2)])["before"].result(30)

        # the active controller's machine is lost: the process and its metadata dir
        lost = c.active_controller()
        assert lost is not None
        c.kill(lost)
        metadata_dir = c.node_dir(lost) / "metadata"
        subprocess.run(["rm", "-rf", str(metadata_dir)], check=True)
        wait_for(lambda: (n := c.active_controller()) is not None and n != lost, 20, "a new active controller")

        sh = Shell(c, {"BOOTSTRAP": c.bootstrap, "CONFIG": str(c.config_path(lost))}, tmp_path)
        status = status_of(sh(QUORUM_BEFORE[0]))
        assert int(status["LeaderId"]) != lost and str(lost) in status["CurrentVoters"]
        assert lost in replication_rows(sh(QUORUM_BEFORE[1]))

        # the replacement: the same config, an empty metadata dir
        metadata_dir.mkdir(parents=True)
        sh(QUORUM_AFTER[0])
        sh(QUORUM_AFTER[1])
        assert f"cluster.id={sh.env['CLUSTER_ID']}" in (metadata_dir / "meta.properties").read_text()
        sh(QUORUM_AFTER[2], node=lost)

        def caught_up() -> bool:
            rows = replication_rows(sh(QUORUM_AFTER[3]))
            return rows[lost]["Lag"] == "0" and rows[lost]["Status"] == "Follower"

        eventually(caught_up, 60)
        a.create_topics([NewTopic("after", 1, 2)])["after"].result(30)

        # the replaced voter counts toward the majority: lose another voter, the quorum goes on
        other = next(n for n in c.controller_ids if n != lost and n != c.active_controller())
        c.kill(other)
        wait_for(lambda: c.active_controller() in {n for n in c.controller_ids if n != other}, 20,
                 "an active controller among the two left")
        a.create_topics([NewTopic("after-loss", 1, 2)])["after-loss"].result(30)
        assert {"before", "after", "after-loss"} <= set(a.list_topics(timeout=10).topics)
    finally:
        c.stop()
