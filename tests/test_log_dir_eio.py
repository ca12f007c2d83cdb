"""EIO takes only its log dir offline, with a real OS fault: one of a
broker's two log dirs is a FUSE passthrough filesystem (tests/disk_faults.py) whose fault switch
makes every read, write, fsync and create answer EIO from then on, under the running broker.

3 brokers, RF 3, one partition led by broker 1 in each of its dirs. After the switch: the FUSE dir
alone goes offline (DescribeLogDirs: KAFKA_STORAGE_ERROR for it, the other dir live), the
controller hears it in the heartbeat's OfflineLogDirs and moves leadership and the ISR off the
replica, every acknowledged message is read back, the other dir keeps taking writes, and the
broker keeps running. Needs root, /dev/fuse and libfuse3; without them it skips saying so.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from protocol.errors import Errors
from protocol.generated.describe_log_dirs import DescribeLogDirsRequest
from tests.disk_faults import fuse_passthrough, fuse_unavailable
from tests.test_log_dir_failure import CTL, FAST, consume_all, leader_isr, log_text, produce, wait_for
from tests.test_log_dir_moves import alter, request, where
from tools.cluster import Cluster


@pytest.fixture(autouse=True)
def _needs_fuse():
    reason = fuse_unavailable()
    if reason:
        print(f"skipping: {reason}")
        pytest.skip(reason)


def dir_errors(c: Cluster, broker: int) -> dict[str, int]:
    resp = request(c, broker, DescribeLogDirsRequest(topics=None), 4)
    return {r.log_dir: r.error_code for r in resp.results}


def test_eio_takes_only_its_dir_offline_and_leadership_moves(tmp_path):
    plain = tmp_path / "b1-plain"
    with fuse_passthrough(tmp_path / "b1-backing", tmp_path / "b1-fuse") as fs:
        c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=FAST, controller_overrides=CTL,
                    per_broker_overrides={1: {"log.dirs": f"{fs.path},{plain}"}})
        try:
            c.start()
            a = AdminClient({"bootstrap.servers": c.bootstrap})
            for t in ("victim", "healthy"):
                a.create_topics([NewTopic(t, 1, replica_assignment=[[1, 2, 3]])])[t].result(30)
                wait_for(lambda t=t: leader_isr(a, t) == (1, [1, 2, 3]), 30, f"{t} led by broker 1 with a full ISR")
            # the two dirs report nearly the same free bytes (one backing filesystem): place explicitly
            for t, d in (("victim", fs.path), ("healthy", plain)):
                if where(c, 1, t)[0] != str(d):
                    # broker 1 may answer UNKNOWN_TOPIC_OR_PARTITION until it has applied the replica
                    wait_for(lambda t=t, d=d: alter(c, 1, str(d), t, [0]) == {0: 0}, 30, f"broker 1 to take {t}'s move")
                    wait_for(lambda t=t, d=d: where(c, 1, t) == (str(d), False), 30, f"{t} to move to {d}")
            assert (fs.backing / "victim-0-0").is_dir()
            acked, errs = produce(c.bootstrap, "victim", [b"before-%d" % i for i in range(200)], timeout=20)
            assert len(acked) == 200 and not errs
            ok, errs = produce(c.bootstrap, "healthy", [b"h-before-%d" % i for i in range(50)], timeout=20)
            assert len(ok) == 50 and not errs

            fs.fail()
            # the next append on the FUSE dir gets EIO: the dir goes offline, the producer follows the new leader
            more, errs = produce(c.bootstrap, "victim", [b"after-%d" % i for i in range(200)], timeout=30)
            assert len(more) == 200, f"only {len(more)} of 200 acknowledged after the leader's dir failed: {errs[:3]}"
            acked.update(more)
            text = log_text(c, 1)
            assert "log_dir_offline" in text and "Input/output error" in text
            # the controller learned it from the heartbeat (OfflineLogDirs) and moved leadership and the ISR
            wait_for(lambda: (s := leader_isr(a, "victim"))[0] in (2, 3) and s[1] == [2, 3], 15,
                     "leadership and the ISR to leave the failed dir's replica")
            assert "log_dirs_offline" in log_text(c, "controller")
            assert dir_errors(c, 1) == {str(fs.path): Errors.KAFKA_STORAGE_ERROR, str(plain): 0}

            got = consume_all(c.bootstrap, "victim", 0, max(acked.values()) + 1)
            assert set(acked) <= set(got), "an acknowledged message was lost"
            assert len(got) == len(set(got)), "a message was stored twice"
            # the other dir serves on, still led here with a full ISR
            assert leader_isr(a, "healthy") == (1, [1, 2, 3])
            after, errs = produce(c.bootstrap, "healthy", [b"h-after-%d" % i for i in range(50)], timeout=20)
            assert len(after) == 50 and not errs
            assert sorted(consume_all(c.bootstrap, "healthy", 0, 100)) == sorted([*ok, *after])
            assert c.is_running(1)
        finally:
            c.stop()
