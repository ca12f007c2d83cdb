"""Dynamic controller quorum (KIP-853): controllers formatted with `kafka-storage.sh format
--initial-controllers` (voters) or `--no-initial-controllers` (observers), configured with
`controller.quorum.bootstrap.servers` only, brokers too. All three voters are replaced one by one
(start the new one, `kafka-metadata-quorum.sh add-controller`, `remove-controller` of an old one,
stop the old one) while an idempotent acks=all producer and a consumer run: every acknowledged
record is consumed (by the consumer that ran throughout), and an admin request (a topic creation, forwarded by a broker to the active
controller) is never refused or unanswered for more than 3 s. The new voters keep their set in
the log (and in the snapshots that cut it: snapshots are taken every 4 KiB of records here):
one restarts and rejoins without any old controller to bootstrap from.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from controller.log_dirs import id_to_uuid, random_id
from node.client import NodeClient
from node.config import parse_properties
from protocol.errors import Errors
from protocol.generated.add_raft_voter import AddRaftVoterRequest
from protocol.generated.describe_quorum import DescribeQuorumRequest
from protocol.generated.update_raft_voter import UpdateRaftVoterRequest
from tests.conftest import wait_for
from tools.cluster import Cluster

ROOT = Path(__file__).resolve().parent.parent
FAST_RAFT = {"controller.quorum.election.timeout.ms": 300, "controller.quorum.fetch.timeout.ms": 1000}
OUTAGE_LIMIT_S = 3.0


def quorum_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.kafka_metadata_quorum", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=90)


def describe(c: Cluster, cid: int):
    """DescribeQuorum as controller `cid` answers it: (partition, nodes)."""
    R = DescribeQuorumRequest

    async def go():
        async with NodeClient(c.host, c.ports[cid], client_id="quorum-test", timeout=5) as nc:
            resp = await nc.request(R(topics=[R.TopicData(topic_name="__cluster_metadata",
                                                          partitions=[R.PartitionData(partition_index=0)])]))
            return resp.topics[0].partitions[0], resp.nodes

    return asyncio.run(go())


def leader_view(c: Cluster, cid: int):
    """DescribeQuorum as the leader answers it, found through controller `cid`."""
    def found():
        part, _ = describe(c, cid)
        assert part.leader_id >= 0, "no leader yet"
        view = describe(c, part.leader_id)
        assert view[0].error_code == 0, view[0]
        return view

    return wait_for(found, 30, "the quorum leader's view")


def directory_id(c: Cluster, cid: int) -> str:
    return parse_properties((c.node_dir(cid) / "metadata" / "meta.properties").read_text())["directory.id"]


class AdminProbe(threading.Thread):
    """Creates a topic every 0.3 s through the brokers (forwarded to the active controller) and
    records when each one succeeded: the longest gap is the admin outage."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.done: list[float] = []
        self.failures: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            fut = self.admin.create_topics([NewTopic(f"probe-{n}", 1, 1)], request_timeout=10)[f"probe-{n}"]
            try:
                fut.result(timeout=15)
                self.done.append(time.monotonic())
            except KafkaException as e:
                # Each name is new, so TOPIC_ALREADY_EXISTS means an earlier try of this very
                # create committed and its answer was lost when the controller it reached left
                # the quorum; the broker sent it again to the next one (Kafka's forwarding does
                # the same). The create took effect: not an outage.
                if e.args and e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    self.done.append(time.monotonic())
                else:
                    self.failures.append(f"probe-{n}: {e}")
            except Exception as e:  # recorded: a refusal counts as an outage
                self.failures.append(f"probe-{n}: {e}")
            self.stop.wait(0.3)

    def longest_gap(self, since: float) -> float:
        times = [since, *[t for t in self.done if t >= since]]
        return max(b - a for a, b in zip(times, times[1:], strict=False)) if len(times) > 1 else float("inf")


def test_replace_every_controller_one_by_one_under_load(tmp_path: Path) -> None:
    # small snapshots: the new controllers start from a snapshot that must carry the voter set
    c = Cluster(tmp_path / "cluster", brokers=3, controllers=6, dynamic_voters=3,
                controller_overrides={**FAST_RAFT, "metadata.log.max.record.bytes.between.snapshots": 4096},
                broker_overrides={"default.replication.factor": 3, "min.insync.replicas": 2}, verbose=False)
    c.start()
    try:
        old, new = c.controller_ids[:3], c.controller_ids[3:]
        part, nodes = leader_view(c, old[0])
        assert sorted(v.replica_id for v in part.current_voters) == old
        assert {n.node_id for n in nodes} == set(old) and all(v.replica_directory_id.int for v in part.current_voters)
        admin = AdminClient({"bootstrap.servers": c.bootstrap})
        admin.create_topics([NewTopic("t", 3, 3)])["t"].result(timeout=30)

        acked: list[bytes] = []
        errors: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            p = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "enable.idempotence": True,
                          "linger.ms": 5})

            def done(err, msg) -> None:
                if err is None:
                    acked.append(msg.value())
                else:
                    errors.append(str(err))

            i = 0
            while not stop.is_set():
                p.produce("t", f"m-{i:06d}".encode(), on_delivery=done)
                p.poll(0)
                i += 1
                time.sleep(0.002)
            assert p.flush(60) == 0

        seen: set[bytes] = set()
        consuming = threading.Event()

        def consume() -> None:
            consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "check",
                                 "auto.offset.reset": "earliest", "enable.auto.commit": True})
            consumer.subscribe(["t"])
            try:
                while not consuming.is_set():
                    m = consumer.poll(0.5)
                    if m is not None and m.error() is None:
                        seen.add(m.value())
            finally:
                consumer.close()

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        probe = AdminProbe(c.bootstrap)
        probe.start()
        wait_for(lambda: len(probe.done) >= 2, 30, "admin requests answered")
        began = time.monotonic()

        for gone, joining in zip(old, new, strict=True):
            c.start_node(joining)
            voters = ",".join(f"{c.host}:{c.ports[v]}" for v in (*[x for x in old if c.is_running(x)], *new)
                              if c.is_running(v))

            def added(voters: str = voters, joining: int = joining) -> bool:
                out = quorum_tool("--bootstrap-controller", voters, "--command-config", str(c.config_path(joining)),
                                  "add-controller")
                assert out.returncode == 0, out.stderr  # not caught up yet: REQUEST_TIMED_OUT, tried again
                return True

            wait_for(added, 60, f"controller {joining} added")
            out = quorum_tool("--bootstrap-server", c.bootstrap, "remove-controller", "--controller-id", str(gone),
                              "--controller-directory-id", directory_id(c, gone))
            assert out.returncode == 0, out.stderr
            assert out.stdout.strip() == f"Removed KRaft controller {gone} with directory id {directory_id(c, gone)}"
            time.sleep(1.0)  # as an operator would: the quorum settles before the old one stops
            c.terminate(gone)

        survivor = new[0]
        part, nodes = leader_view(c, survivor)
        assert part.leader_id in new
        assert sorted(v.replica_id for v in part.current_voters) == new, part
        assert {n.node_id for n in nodes} == set(new)
        status = quorum_tool("--bootstrap-controller", f"{c.host}:{c.ports[survivor]}", "describe", "--status")
        assert status.returncode == 0, status.stderr
        assert f'"id": {new[0]}, "directoryId": "{directory_id(c, new[0])}"' in status.stdout, status.stdout

        # a new voter restarts with no old controller left to bootstrap from: its set is in its log
        c.terminate(new[1])
        c.start_node(new[1])
        wait_for(lambda: describe(c, new[1])[0].leader_id in new, 30, "restarted voter follows the leader")

        time.sleep(1.0)
        stop.set()
        producer.join(90)
        probe.stop.set()
        probe.join(30)
        assert not producer.is_alive()
        assert not errors, errors[:5]
        assert not probe.failures, probe.failures[:5]
        gap = probe.longest_gap(began)
        print(f"admin requests {len(probe.done)}, longest gap {gap:.2f} s; records acknowledged {len(acked)}")
        assert gap <= OUTAGE_LIMIT_S, f"admin outage of {gap:.1f} s"

        want = set(acked)
        wait_for(lambda: want <= seen, 60, "every acknowledged record consumed")
        consuming.set()
        reader.join(30)
        assert len(want) > 1000 and want <= seen, f"{len(want - seen)} of {len(want)} acknowledged records missing"
    finally:
        c.stop()


def test_voter_changes_refused_by_error_code(tmp_path: Path) -> None:
    """A static quorum's voters cannot change (kraft.version 0): UNSUPPORTED_VERSION; a
    dynamic quorum refuses a voter it has (DUPLICATE_VOTER), a controller that is not a
    caught-up observer (REQUEST_TIMED_OUT), removing an unknown voter (VOTER_NOT_FOUND, one line
    from the tool) and an update naming another directory id (VOTER_NOT_FOUND); a quorum formatted
    for one voter (`--standalone`) then grows to two."""
    static = Cluster(tmp_path / "static", brokers=1, verbose=False)
    static.start()
    try:
        A = AddRaftVoterRequest

        async def add(cl: Cluster, port: int, voter: int):
            async with NodeClient(cl.host, port, client_id="quorum-test", timeout=10) as nc:
                return await nc.request(A(cluster_id=None, timeout_ms=2000, voter_id=voter,
                                          voter_directory_id=uuid.uuid4(),
                                          listeners=[A.Listener(name="CONTROLLER", host="127.0.0.1", port=1)]))

        r = asyncio.run(add(static, static.ports[static.controller_ids[0]], 999))
        assert r.error_code == Errors.UNSUPPORTED_VERSION and "static" in r.error_message
    finally:
        static.stop()
    dyn = Cluster(tmp_path / "dynamic", brokers=1, controllers=2, dynamic_voters=1, verbose=False)
    dyn.start()
    try:
        first, other = dyn.controller_ids
        r = asyncio.run(add(dyn, dyn.ports[first], first))
        assert r.error_code == Errors.DUPLICATE_VOTER, r
        r = asyncio.run(add(dyn, dyn.ports[first], other))  # never started: no observer
        assert r.error_code == Errors.REQUEST_TIMED_OUT and "observer" in r.error_message, r
        out = quorum_tool("--bootstrap-controller", f"{dyn.host}:{dyn.ports[first]}", "remove-controller",
                          "--controller-id", "7", "--controller-directory-id", random_id())  # never "-..."
        assert out.returncode == 1 and len(out.stderr.splitlines()) == 1 and "VOTER_NOT_FOUND" in out.stderr, out
        # UpdateRaftVoter: a voter's own endpoints (unchanged here) are taken; a wrong directory id is not
        U = UpdateRaftVoterRequest
        me = U.Listener(name="CONTROLLER", host=dyn.host, port=dyn.ports[first])
        feature = U.KRaftVersionFeature(min_supported_version=0, max_supported_version=1)

        async def update(dir_id: uuid.UUID):
            async with NodeClient(dyn.host, dyn.ports[first], client_id="quorum-test", timeout=10) as nc:
                return await nc.request(U(cluster_id=None, current_leader_epoch=-1, voter_id=first,
                                          voter_directory_id=dir_id, listeners=[me], k_raft_version_feature=feature))

        r = asyncio.run(update(id_to_uuid(directory_id(dyn, first))))
        assert r.error_code == 0 and (r.current_leader.leader_id, r.current_leader.port) == (first, dyn.ports[first])
        assert asyncio.run(update(uuid.uuid4())).error_code == Errors.VOTER_NOT_FOUND
        # a standalone-formatted quorum grows from one voter to two
        dyn.start_node(other)
        wait_for(lambda: quorum_tool("--bootstrap-controller", f"{dyn.host}:{dyn.ports[first]}", "--command-config",
                                     str(dyn.config_path(other)), "add-controller").returncode == 0, 60,
                 "second voter added")
        part, _ = leader_view(dyn, first)
        assert sorted(v.replica_id for v in part.current_voters) == [first, other]
    finally:
        dyn.stop()
