"""The controller process, driven as brokers and admin tools drive it: a real `python -m controller`
on a free loopback port, requests over the wire with NodeClient, records checked by fetching the
metadata log and decoding it. The "brokers" here are the test itself sending what a broker sends
(registration and heartbeats)."""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from metadata import METADATA_TOPIC, METADATA_TOPIC_ID, MetadataDelta, MetadataImage, decode_record
from node.client import NodeClient
from protocol.errors import Errors
from protocol.framing import frame
from protocol.generated.alter_configs import AlterConfigsRequest
from protocol.generated.api_versions import ApiVersionsResponse
from protocol.generated.broker_heartbeat import BrokerHeartbeatRequest
from protocol.generated.broker_registration import BrokerRegistrationRequest
from protocol.generated.create_partitions import CreatePartitionsRequest
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.delete_topics import DeleteTopicsRequest
from protocol.generated.describe_cluster import DescribeClusterRequest
from protocol.generated.fetch import FetchRequest
from protocol.generated.fetch_snapshot import FetchSnapshotRequest
from protocol.generated.incremental_alter_configs import IncrementalAlterConfigsRequest
from protocol.generated.metadata import MetadataRequest
from protocol.headers import encode_request
from protocol.records import decode_batches, iter_batches
from protocol.records.control import read_leader_change

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
CT = CreateTopicsRequest
SERVED = {1, 17, 18, 19, 20, 30, 31, 33, 36, 37, 43, 44, 45, 46, 49, 51, 52, 53, 54, 55, 56, 57, 59, 60, 62, 63, 67, 73, 80, 81, 82, 1076, 1077}


# ---------------------------------------------------------------- the process
def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class ControllerProcess:
    def __init__(self, tmp: Path, **props: object) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.data = tmp / "data"
        self.config = tmp / "server.properties"
        self.log_path = tmp / "controller.log"
        self.proc: subprocess.Popen | None = None
        self.props = {
            "process.roles": "controller",
            "node.id": 1,
            "listeners": f"CONTROLLER://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "controller.quorum.voters": f"1@{HOST}:{self.port}",
            "log.dirs": str(self.data),
            "num.partitions": 2,
            "default.replication.factor": 1,
        }
        self.props.update({k.replace("_", "."): v for k, v in props.items()})

    @property
    def segment_dir(self) -> Path:
        return self.data / f"{METADATA_TOPIC}-0"

    def start(self) -> ControllerProcess:
        self.config.write_text("".join(f"{k}={v}\n" for k, v in self.props.items()))
        self._log = open(self.log_path, "ab")  # closed in wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "controller", "--config", str(self.config)],
            cwd=ROOT,
            stdout=self._log,
            stderr=self._log,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                socket.create_connection((HOST, self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"controller did not listen within 20 s:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait()

    def wait(self, timeout: float = 20) -> int:
        assert self.proc is not None
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self._log.close()
        return rc

    def restart(self, sig: int = signal.SIGTERM) -> int:
        rc = self.stop(sig)
        self.start()
        return rc


@pytest.fixture
def controllers(tmp_path):
    """Makes controller processes; every one still running is killed at teardown, even on failure."""
    made: list[ControllerProcess] = []

    def make(sub: str = "c", **props: object) -> ControllerProcess:
        d = tmp_path / sub
        d.mkdir(exist_ok=True)
        c = ControllerProcess(d, **props)
        made.append(c)
        return c

    yield make
    for c in made:
        if c.proc is not None and c.proc.poll() is None:
            c.proc.kill()
            c.wait()


@pytest.fixture
def controller(controllers):
    return controllers().start()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


# ---------------------------------------------------------------- what a broker sends
async def connect(c: ControllerProcess) -> NodeClient:
    return await NodeClient(HOST, c.port, client_id="test").connect()


async def cluster_id_of(cl: NodeClient) -> str:
    return (await cl.request(DescribeClusterRequest())).cluster_id


async def register(cl, broker_id, cluster_id, *, rack=None, incarnation=None, version=None):
    req = BrokerRegistrationRequest(
        broker_id=broker_id,
        cluster_id=cluster_id,
        incarnation_id=incarnation or uuid.uuid4(),
        listeners=[BrokerRegistrationRequest.Listener("PLAINTEXT", HOST, 9000 + broker_id, 0)],
        rack=rack,
        # a broker keeps its log dirs' ids across restarts (a replica in a dir it no longer lists may not lead)
        log_dirs=[uuid.uuid5(uuid.NAMESPACE_OID, f"broker-{broker_id}")],
    )
    return await cl.request(req, version)


async def heartbeat(cl, broker_id, epoch, offset, *, want_fence=False, want_shut_down=False):
    return await cl.request(
        BrokerHeartbeatRequest(
            broker_id=broker_id,
            broker_epoch=epoch,
            current_metadata_offset=offset,
            want_fence=want_fence,
            want_shut_down=want_shut_down,
        )
    )


async def start_brokers(cl, racks: dict[int, str | None]) -> dict[int, int]:
    """Register and unfence brokers; returns broker id -> epoch."""
    cid = await cluster_id_of(cl)
    epochs = {}
    for b, rack in racks.items():
        r = await register(cl, b, cid, rack=rack)
        assert r.error_code == 0
        epochs[b] = r.broker_epoch
    end = await log_end(cl)
    for b, e in epochs.items():
        r = await heartbeat(cl, b, e, end)
        assert r.error_code == 0 and not r.is_fenced, r
    return epochs


# ---------------------------------------------------------------- reading the metadata log
def fetch_req(offset: int, *, max_wait_ms=0, max_bytes=1 << 20, version=17) -> FetchRequest:
    part = FetchRequest.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=max_bytes)
    topic = FetchRequest.FetchTopic(
        topic=METADATA_TOPIC if version < 13 else "", topic_id=METADATA_TOPIC_ID, partitions=[part]
    )
    return FetchRequest(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, topics=[topic])


async def fetch(cl, offset=0, **kw):
    version = kw.get("version", 17)
    resp = await cl.request(fetch_req(offset, **kw), version, timeout=30)
    assert resp.error_code == 0
    return resp.responses[0].partitions[0]


async def log_end(cl) -> int:
    return (await fetch(cl, 0)).high_watermark


def decode(records) -> list[tuple[int, int, object]]:
    """(batch base offset, record offset, record) for every metadata record in a records blob; a
    control record (Raft's LEADER_CHANGE) as its LeaderChangeMessage."""
    out = []
    for b in decode_batches(bytes(records)):
        for r in b.records:
            rec = read_leader_change(r) if b.header.is_control else decode_record(r.value)[0]
            out.append((b.base_offset, r.offset, rec))
    return out


async def read_log(cl, offset=0, noops=False) -> list[tuple[int, int, object]]:
    """The records written, without (unless `noops`) the LEADER_CHANGE control record each new
    Raft leader appends in its epoch."""
    out = []
    while True:
        p = await fetch(cl, offset)
        assert p.error_code == 0, p
        got = decode(p.records)
        if not got:
            return out
        out += [e for e in got if noops or type(e[2]).__name__ != "LeaderChangeMessage"]
        offset = got[-1][1] + 1


def kinds(entries) -> list[str]:
    return [type(r).__name__ for _, _, r in entries]


def image_of(entries, image=None) -> MetadataImage:
    delta = MetadataDelta(image or MetadataImage.EMPTY)
    for _, off, r in entries:
        delta.replay(r, off)
    return delta.apply()


def topic(name, partitions=-1, rf=-1, configs=None, assignments=None):
    return CT.CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=rf,
        assignments=[CT.CreatableReplicaAssignment(i, a) for i, a in enumerate(assignments or [])],
        configs=[CT.CreatableTopicConfig(k, v) for k, v in (configs or {}).items()],
    )


async def create(cl, *topics, validate_only=False, version=None):
    resp = await cl.request(CT(topics=list(topics), timeout_ms=5000, validate_only=validate_only), version)
    return {t.name: t for t in resp.topics}


async def raw_exchange(port: int, data: bytes, timeout: float = 5) -> bytes:
    """Send bytes, read until the server closes or a whole response arrives."""
    reader, writer = await asyncio.open_connection(HOST, port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.read(4), timeout)
        if len(head) < 4:
            return b""
        return await asyncio.wait_for(reader.readexactly(struct.unpack(">i", head)[0]), timeout)
    finally:
        writer.close()


# ================================================================ start-up, framing, ApiVersions
def test_first_start_formats_and_advertises_only_what_it_serves(controller):
    meta = dict(
        line.split("=", 1) for line in (controller.data / "meta.properties").read_text().splitlines() if "=" in line
    )
    assert meta["node.id"] == "1" and meta["version"] == "1" and len(meta["cluster.id"]) == 22
    assert (controller.segment_dir / f"{0:020d}.log").exists()

    async def main():
        cl = await connect(controller)
        assert set(cl.versions) == SERVED
        assert cl.versions[1][0] == 4 and cl.versions[59] == (0, 1)
        d = await cl.request(DescribeClusterRequest())
        assert (d.cluster_id, d.controller_id, d.brokers) == (meta["cluster.id"], 1, [])
        d2 = await cl.request(DescribeClusterRequest(endpoint_type=2), 1)
        assert [(b.broker_id, b.port) for b in d2.brokers] == [(1, controller.port)]

        # ApiVersions v99: error 35 and a v0 body listing what we serve
        head = struct.pack(">hhi", 18, 99, 7) + struct.pack(">h", 1) + b"x"
        resp = await raw_exchange(controller.port, b"".join(frame([head])))
        assert struct.unpack(">i", resp[:4])[0] == 7
        body = ApiVersionsResponse.decode(resp[4:], 0)
        assert body.error_code == Errors.UNSUPPORTED_VERSION and {k.api_key for k in body.api_keys} == SERVED

        # An API the controller does not serve (Metadata), garbage, an oversized frame: that
        # connection closes, the others go on working.
        meta_req = b"".join(frame(encode_request(MetadataRequest(topics=None), 12, 3, "x")))
        assert await raw_exchange(controller.port, meta_req) == b""
        assert await raw_exchange(controller.port, struct.pack(">i", 6) + b"\x00\x12garb") == b""
        assert await raw_exchange(controller.port, struct.pack(">i", 2**31 - 1) + b"x") == b""
        assert (await cl.request(DescribeClusterRequest())).cluster_id == meta["cluster.id"]
        await cl.close()

    run(main())
    assert controller.stop() == 0
    text = controller.log_text()
    assert "MetadataRequest is not served" in text and "controller_stopped" in text


@pytest.mark.parametrize(
    ("props", "needle"),
    [
        ({"node.id": None}, "node.id is required"),
        ({"node.id": "x"}, "node.id"),
        ({"process.roles": "broker"}, "process.roles"),
        ({"controller.quorum.voters": "2@127.0.0.1:1"}, "not one of the voters"),
        ({"listeners": "PLAINTEXT://127.0.0.1:1"}, "controller.listener.names"),
        ({"num.partitions": "0"}, "num.partitions"),
        ({"cluster.id": "not-a-uuid"}, "cluster.id"),
    ],
)
def test_bad_config_exits_2_with_one_line(controllers, props, needle):
    c = controllers()
    for k, v in props.items():
        if v is None:
            c.props.pop(k)
        else:
            c.props[k] = v
    c.config.write_text("".join(f"{k}={v}\n" for k, v in c.props.items()))
    p = subprocess.run(
        [sys.executable, "-m", "controller", "--config", str(c.config)], cwd=ROOT, capture_output=True, timeout=30
    )
    err = p.stderr.decode().strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and needle in err[0], (p.returncode, err)


def test_stored_ids_must_match_config(controllers):
    c = controllers().start()
    assert c.stop() == 0
    c.props["cluster.id"] = "AAAAAAAAAAAAAAAAAAAAAA"
    c.config.write_text("".join(f"{k}={v}\n" for k, v in c.props.items()))
    p = subprocess.run([sys.executable, "-m", "controller", "--config", str(c.config)], cwd=ROOT, capture_output=True)
    assert p.returncode == 2 and b"does not match" in p.stderr


# ================================================================ registration and heartbeats
def test_registration_heartbeat_and_unfencing(controller):
    async def main():
        cl = await connect(controller)
        cid = await cluster_id_of(cl)
        bad = await register(cl, 7, "AAAAAAAAAAAAAAAAAAAAAA")
        assert bad.error_code == Errors.INCONSISTENT_CLUSTER_ID and bad.broker_epoch == -1

        inc = uuid.uuid4()
        r1 = await register(cl, 1, cid, rack="a", incarnation=inc)
        assert r1.error_code == 0
        again = await register(cl, 1, cid, rack="a", incarnation=inc, version=0)
        assert again.broker_epoch == r1.broker_epoch  # a retry gets the same answer
        entries = await read_log(cl)
        assert kinds(entries) == ["RegisterBrokerRecord"]
        off, rec = entries[0][1], entries[0][2]
        assert rec.broker_epoch == off == r1.broker_epoch and rec.fenced and rec.rack == "a"

        stale = await heartbeat(cl, 1, r1.broker_epoch + 100, 0)
        assert stale.error_code == Errors.STALE_BROKER_EPOCH and stale.is_fenced
        unknown = await heartbeat(cl, 42, 0, 0)
        assert unknown.error_code == Errors.STALE_BROKER_EPOCH

        behind = await heartbeat(cl, 1, r1.broker_epoch, r1.broker_epoch - 1)
        assert (behind.error_code, behind.is_caught_up, behind.is_fenced) == (0, False, True)
        wants_fence = await heartbeat(cl, 1, r1.broker_epoch, r1.broker_epoch, want_fence=True)
        assert wants_fence.is_caught_up and wants_fence.is_fenced
        ok = await heartbeat(cl, 1, r1.broker_epoch, r1.broker_epoch)
        assert (ok.is_caught_up, ok.is_fenced, ok.should_shut_down) == (True, False, False)
        assert kinds(await read_log(cl))[-1] == "UnfenceBrokerRecord"
        d = await cl.request(DescribeClusterRequest())
        assert [(b.broker_id, b.port, b.rack) for b in d.brokers] == [(1, 9001, "a")]

        # While broker 1 is unfenced and heartbeating its id cannot be taken over (Kafka's
        # DUPLICATE_BROKER_REGISTRATION); the registered broker keeps its epoch and standing.
        dup = await register(cl, 1, cid, rack="b")
        assert (dup.error_code, dup.broker_epoch) == (Errors.DUPLICATE_BROKER_REGISTRATION, -1)
        assert not (await heartbeat(cl, 1, r1.broker_epoch, r1.broker_epoch)).is_fenced
        # Once its session is gone (here it is fenced on request, as a session timeout would)
        # a new incarnation replaces the old one: new epoch, fenced until it catches up.
        assert (await heartbeat(cl, 1, r1.broker_epoch, r1.broker_epoch, want_fence=True)).is_fenced
        r2 = await register(cl, 1, cid, rack="b")
        assert r2.broker_epoch > r1.broker_epoch
        assert (await heartbeat(cl, 1, r1.broker_epoch, 10**9)).error_code == Errors.STALE_BROKER_EPOCH
        assert (await cl.request(DescribeClusterRequest())).brokers == []
        fenced = await cl.request(DescribeClusterRequest(include_fenced_brokers=True), 2)
        assert [(b.broker_id, b.is_fenced, b.rack) for b in fenced.brokers] == [(1, True, "b")]
        assert not (await heartbeat(cl, 1, r2.broker_epoch, r2.broker_epoch)).is_fenced
        await cl.close()

    run(main())


# ================================================================ topics
def test_create_topics_places_replicas_across_racks_and_writes_one_batch(controllers):
    c = controllers(num_partitions=3, default_replication_factor=2).start()

    async def main():
        cl = await connect(c)
        await start_brokers(cl, {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"})
        before = await log_end(cl)
        res = await create(
            cl, topic("orders", 12, 3, {"retention.ms": "1000", "cleanup.policy": "compact"}), topic("defaults")
        )
        assert all(r.error_code == 0 and r.error_message is None for r in res.values())
        o = res["orders"]
        assert (o.num_partitions, o.replication_factor) == (12, 3)
        cfg = {x.name: (x.value, x.config_source) for x in o.configs}
        assert cfg["retention.ms"] == ("1000", 1) and cfg["cleanup.policy"] == ("compact", 1)
        assert cfg["segment.bytes"] == ("1073741824", 5)
        assert (res["defaults"].num_partitions, res["defaults"].replication_factor) == (3, 2)

        entries = await read_log(cl, before)
        assert len({base for base, _, _ in entries}) == 1, "one operation, one batch"
        full = image_of(await read_log(cl))
        orders = full.topic("orders")
        assert orders.id == o.topic_id and len(orders.partitions) == 12
        racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
        leaders = Counter()
        for p in orders.partitions.values():
            assert len(set(p.replicas)) == 3 and {racks[r] for r in p.replicas} == {"a", "b", "c"}
            assert p.leader == p.replicas[0] and p.isr == p.replicas
            assert (p.leader_epoch, p.partition_epoch, p.start_offset) == (0, 0, 0)
            leaders[p.leader] += 1
        assert set(leaders.values()) == {2}, leaders  # 12 leaders over 6 brokers
        replicas = Counter(r for p in full.topics[o.topic_id].partitions.values() for r in p.replicas)
        assert set(replicas.values()) == {6}, replicas
        recs = [r for _, _, r in entries if type(r).__name__ == "PartitionRecord"]
        assert all(r.start_offset == -1 for r in recs)
        assert full.topic_config("orders") == {"retention.ms": "1000", "cleanup.policy": "compact"}
        assert full.topic("defaults") is not None
        k = kinds(entries)
        assert k.index("TopicRecord") < k.index("ConfigRecord") < k.index("PartitionRecord")
        await cl.close()

    run(main())


def test_create_topics_errors_have_kafka_codes_and_readable_messages(controller):
    async def main():
        cl = await connect(controller)
        await start_brokers(cl, {1: None, 2: None, 3: None})
        assert (await create(cl, topic("a.b")))["a.b"].error_code == 0
        end = await log_end(cl)
        cases = {
            "": (Errors.INVALID_TOPIC_EXCEPTION, "empty"),
            "..": (Errors.INVALID_TOPIC_EXCEPTION, ".."),
            "x" * 250: (Errors.INVALID_TOPIC_EXCEPTION, "249"),
            "bad name!": (Errors.INVALID_TOPIC_EXCEPTION, "illegal"),
            METADATA_TOPIC: (Errors.INVALID_TOPIC_EXCEPTION, "reserved"),
            "a.b": (Errors.TOPIC_ALREADY_EXISTS, "already exists"),
            "a_b": (Errors.INVALID_TOPIC_EXCEPTION, "collides"),
        }
        res = await create(cl, *[topic(n) for n in cases])
        for name, (code, text) in cases.items():
            assert res[name].error_code == code and text in res[name].error_message, (name, res[name])

        bad = {
            "p0": (topic("p0", 0), Errors.INVALID_PARTITIONS, "partitions"),
            "pneg": (topic("pneg", -5), Errors.INVALID_PARTITIONS, "-5"),
            "rf0": (topic("rf0", 1, 0), Errors.INVALID_REPLICATION_FACTOR, "Replication factor"),
            "rf4": (topic("rf4", 1, 4), Errors.INVALID_REPLICATION_FACTOR, "only 3 broker(s)"),
            "cfg1": (topic("cfg1", configs={"no.such": "1"}), Errors.INVALID_CONFIG, "no.such"),
            "cfg2": (topic("cfg2", configs={"retention.ms": "abc"}), Errors.INVALID_CONFIG, "retention.ms"),
            "cfg3": (topic("cfg3", configs={"cleanup.policy": "bogus"}), Errors.INVALID_CONFIG, "bogus"),
            "cfg4": (topic("cfg4", configs={"min.insync.replicas": "0"}), Errors.INVALID_CONFIG, "at least 1"),
            "cfg5": (topic("cfg5", configs={"segment.ms": None}), Errors.INVALID_CONFIG, "Null"),
            "m1": (topic("m1", assignments=[[1, 9]]), Errors.INVALID_REPLICA_ASSIGNMENT, "broker 9"),
            "m2": (topic("m2", assignments=[[1, 1]]), Errors.INVALID_REPLICA_ASSIGNMENT, "more than once"),
            "m3": (topic("m3", assignments=[[1, 2], [3]]), Errors.INVALID_REPLICA_ASSIGNMENT, "replica(s)"),
            "m4": (topic("m4", 2, assignments=[[1]]), Errors.INVALID_REQUEST, "partitions must be -1"),
            "m5": (topic("m5", assignments=[[]]), Errors.INVALID_REPLICA_ASSIGNMENT, "empty"),
        }
        gap = topic("m6")
        gap.assignments = [CT.CreatableReplicaAssignment(0, [1]), CT.CreatableReplicaAssignment(2, [2])]
        bad["m6"] = (gap, Errors.INVALID_REPLICA_ASSIGNMENT, "without gaps")
        res = await create(cl, *[t for t, _, _ in bad.values()])
        for name, (_, code, text) in bad.items():
            assert res[name].error_code == code and text in (res[name].error_message or ""), (name, res[name])
            assert res[name].num_partitions == -1

        dup = await cl.request(CT(topics=[topic("d"), topic("d")], timeout_ms=1000))
        assert [(t.name, t.error_code) for t in dup.topics] == [("d", Errors.INVALID_REQUEST)]
        vo = await create(cl, topic("vo", 4, 3), validate_only=True)
        assert vo["vo"].error_code == 0 and vo["vo"].num_partitions == 4
        assert await log_end(cl) == end, "failed and validate-only requests write nothing"
        # an old version still gets the error code (no message field in v0)
        old = await create(cl, topic("a.b"), version=0)
        assert old["a.b"].error_code == Errors.TOPIC_ALREADY_EXISTS
        # manual assignment: ISR is the usable replicas, leader the first of them
        man = await create(cl, topic("manual", assignments=[[3, 1], [2, 3]]))
        assert man["manual"].error_code == 0
        img = image_of(await read_log(cl))
        assert [(p.replicas, p.leader) for p in img.topic("manual").partitions.values()] == [((3, 1), 3), ((2, 3), 2)]
        await cl.close()

    run(main())


def test_delete_topics_and_create_partitions(controller):
    async def main():
        cl = await connect(controller)
        await start_brokers(cl, {1: None, 2: None, 3: None})
        res = await create(cl, topic("t1", 2, 2), topic("t2", 1), topic("t3", 1))
        t2_id = res["t2"].topic_id

        cp = CreatePartitionsRequest
        resp = await cl.request(
            cp(
                topics=[
                    cp.CreatePartitionsTopic("t1", 4, None),
                    cp.CreatePartitionsTopic(
                        "t3", 3, [cp.CreatePartitionsAssignment([3]), cp.CreatePartitionsAssignment([1])]
                    ),
                    cp.CreatePartitionsTopic("t2", 1, None),
                    cp.CreatePartitionsTopic("nope", 5, None),
                ],
                timeout_ms=1000,
            )
        )
        got = {r.name: (r.error_code, r.error_message) for r in resp.results}
        assert got["t1"] == (0, None) and got["t3"] == (0, None)
        assert got["t2"][0] == Errors.INVALID_PARTITIONS and "already has 1" in got["t2"][1]
        assert got["nope"][0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
        resp = await cl.request(
            cp(
                topics=[
                    cp.CreatePartitionsTopic("t1", 0, None),  # fewer is KIP-253's shrink; none is invalid
                    cp.CreatePartitionsTopic("t3", 5, [cp.CreatePartitionsAssignment([1])]),
                    cp.CreatePartitionsTopic("t2", 9, None),
                ],
                timeout_ms=1000,
                validate_only=True,
            )
        )
        got = {r.name: (r.error_code, r.error_message) for r in resp.results}
        assert got["t1"][0] == Errors.INVALID_PARTITIONS and "at least 1" in got["t1"][1]
        assert got["t3"][0] == Errors.INVALID_REPLICA_ASSIGNMENT and "2 assignment(s)" in got["t3"][1]
        assert got["t2"] == (0, None)
        img = image_of(await read_log(cl))
        assert len(img.topic("t1").partitions) == 4 and len(img.topic("t2").partitions) == 1
        assert all(len(p.replicas) == 2 for p in img.topic("t1").partitions.values())
        assert [img.topic("t3").partitions[i].replicas for i in (1, 2)] == [(3,), (1,)]

        before = await log_end(cl)
        v5 = await cl.request(DeleteTopicsRequest(topic_names=["t1", "ghost"], timeout_ms=1000), 5)
        assert {(r.name, r.error_code) for r in v5.responses} == {
            ("t1", 0),
            ("ghost", Errors.UNKNOWN_TOPIC_OR_PARTITION),
        }
        dt = DeleteTopicsRequest.DeleteTopicState
        v6 = await cl.request(
            DeleteTopicsRequest(topics=[dt(None, t2_id), dt(None, uuid.uuid4()), dt("t3", t2_id)], timeout_ms=1000), 6
        )
        got = {(r.name, r.error_code) for r in v6.responses}
        assert ("t2", 0) in got and (None, Errors.UNKNOWN_TOPIC_ID) in got and ("t3", Errors.INVALID_REQUEST) in got
        entries = await read_log(cl, before)
        assert kinds(entries) == ["RemoveTopicRecord", "RemoveTopicRecord"]
        img = image_of(await read_log(cl))
        assert set(img.topic_ids) == {"t3"}
        await cl.close()

    run(main())


# ================================================================ configs
def test_incremental_and_legacy_alter_configs(controller):
    async def main():
        cl = await connect(controller)
        await start_brokers(cl, {1: None})
        await create(cl, topic("t", configs={"retention.ms": "5000"}))
        ia = IncrementalAlterConfigsRequest
        R, C = ia.AlterConfigsResource, ia.AlterableConfig

        async def incr(*resources, validate_only=False):
            resp = await cl.request(ia(resources=list(resources), validate_only=validate_only))
            return [(r.resource_type, r.resource_name, r.error_code, r.error_message) for r in resp.responses]

        got = await incr(
            R(2, "t", [C("retention.ms", 1, None), C("cleanup.policy", 2, "compact"), C("segment.ms", 0, "60000")]),
            R(4, "", [C("log.retention.ms", 0, "99")]),
            R(4, "1", [C("leader.replication.throttled.rate", 0, "1000")]),
        )
        assert [g[2] for g in got] == [0, 0, 0]
        got = await incr(
            R(2, "t", [C("cleanup.policy", 2, "delete"), C("segment.ms", 0, "soon")]),
            R(2, "ghost", [C("segment.ms", 0, "1")]),
            R(4, "abc", [C("log.retention.ms", 0, "1")]),
            R(4, "", [C("no.such.broker.config", 0, "1")]),
            R(2, "t", [C("retention.bytes", 2, "1")]),
            R(8, "1", [C("x", 0, "1")]),
        )
        codes = [(g[2], g[3]) for g in got]
        assert codes[0][0] == Errors.INVALID_REQUEST and "more than once" in codes[0][1]
        assert codes[1][0] == Errors.UNKNOWN_TOPIC_OR_PARTITION
        assert codes[2][0] == Errors.INVALID_REQUEST and "broker id" in codes[2][1]
        assert codes[3][0] == Errors.INVALID_CONFIG and "no.such.broker.config" in codes[3][1]
        assert codes[5][0] == Errors.INVALID_REQUEST
        bad = await incr(R(2, "t", [C("segment.ms", 0, "soon")]))
        assert bad[0][2] == Errors.INVALID_CONFIG and "segment.ms" in bad[0][3] and "soon" in bad[0][3]
        notlist = await incr(R(2, "t", [C("retention.bytes", 2, "1")]))
        assert notlist[0][2] == Errors.INVALID_CONFIG and "not a list" in notlist[0][3]
        end = await log_end(cl)
        assert (await incr(R(2, "t", [C("segment.ms", 0, "1")]), validate_only=True))[0][2] == 0
        assert await log_end(cl) == end

        img = image_of(await read_log(cl))
        assert dict(img.topic_config("t")) == {"cleanup.policy": "delete,compact", "segment.ms": "60000"}
        assert dict(img.configs[(4, "")]) == {"log.retention.ms": "99"}
        assert dict(img.configs[(4, "1")]) == {"leader.replication.throttled.rate": "1000"}
        await incr(R(2, "t", [C("cleanup.policy", 3, "delete")]))
        img = image_of(await read_log(cl))
        assert img.topic_config("t")["cleanup.policy"] == "compact"
        deleted = [r for _, _, r in await read_log(cl) if type(r).__name__ == "ConfigRecord" and r.value is None]
        assert [(r.resource_name, r.name) for r in deleted] == [("t", "retention.ms")]

        # legacy AlterConfigs replaces the whole set
        ac = AlterConfigsRequest
        resp = await cl.request(
            ac(resources=[ac.AlterConfigsResource(2, "t", [ac.AlterableConfig("max.message.bytes", "2048")])])
        )
        assert resp.responses[0].error_code == 0
        img = image_of(await read_log(cl))
        assert dict(img.topic_config("t")) == {"max.message.bytes": "2048"}
        resp = await cl.request(
            ac(resources=[ac.AlterConfigsResource(2, "t", [ac.AlterableConfig("max.message.bytes", "-1")])])
        )
        assert resp.responses[0].error_code == Errors.INVALID_CONFIG
        # topic defaults shown by CreateTopics follow the cluster-wide dynamic broker config
        res = await create(cl, topic("u"))
        cfg = {x.name: (x.value, x.config_source) for x in res["u"].configs}
        assert cfg["retention.ms"] == ("99", 3)
        await cl.close()

    run(main())


# ================================================================ fetching the metadata log
def test_fetch_versions_errors_and_long_poll(controller):
    async def main():
        cl = await connect(controller)
        admin = await connect(controller)
        await start_brokers(cl, {1: None})
        end = await log_end(cl)
        # by name (v12), by id (v13+), records identical
        p12 = await fetch(cl, 0, version=12)
        p17 = await fetch(cl, 0)
        assert bytes(p12.records) == bytes(p17.records) and p12.high_watermark == end
        assert p17.current_leader.leader_id == 1 and p17.current_leader.leader_epoch == 1
        first = next(iter_batches(bytes(p17.records)))[1]
        assert first.partition_leader_epoch == 1
        # fetch offset in the middle of the log: the batch holding it comes back whole
        mid = await fetch(cl, end - 1)
        assert decode(mid.records)[0][0] <= end - 1

        beyond = await fetch(cl, end + 5)
        assert beyond.error_code == Errors.OFFSET_OUT_OF_RANGE and beyond.snapshot_id is None
        other = FetchRequest(
            max_wait_ms=0,
            topics=[FetchRequest.FetchTopic(topic_id=uuid.uuid4(), partitions=[FetchRequest.FetchPartition(0, -1, 0)])],
        )
        resp = await cl.request(other, 17)
        assert resp.responses[0].partitions[0].error_code == Errors.UNKNOWN_TOPIC_ID
        resp = await cl.request(FetchRequest(cluster_id="AAAAAAAAAAAAAAAAAAAAAA", topics=[]), 17)
        assert resp.error_code == Errors.INCONSISTENT_CLUSTER_ID

        # caught up: the poll waits max_wait_ms when nothing happens...
        t0 = time.monotonic()
        idle = await fetch(cl, end, max_wait_ms=300)
        assert bytes(idle.records) == b"" and time.monotonic() - t0 >= 0.25
        # ...and wakes as soon as an operation commits
        t0 = time.monotonic()
        poll = asyncio.ensure_future(fetch(cl, end, max_wait_ms=10_000))
        await asyncio.sleep(0.2)
        assert not poll.done()
        await create(admin, topic("wake"))
        p = await poll
        assert time.monotonic() - t0 < 5
        assert "TopicRecord" in kinds(decode(p.records)) and p.high_watermark > end
        await cl.close()
        await admin.close()

    run(main())


# ================================================================ fencing and shutdown
@pytest.mark.slow
def test_session_timeout_fences_and_moves_leadership(controllers):
    c = controllers(broker_session_timeout_ms=1200).start()

    async def main():
        cl = await connect(c)
        epochs = await start_brokers(cl, {1: None, 2: None, 3: None})
        await create(cl, topic("r3", 3, 3), topic("solo", assignments=[[3]]))
        img = image_of(await read_log(cl))
        assert any(p.leader == 3 for p in img.topic("r3").partitions.values())
        before = await log_end(cl)

        stop = asyncio.Event()

        async def keep_alive():
            while not stop.is_set():
                for b in (1, 2):
                    await heartbeat(cl, b, epochs[b], 10**9)
                await asyncio.sleep(0.2)

        alive = asyncio.ensure_future(keep_alive())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if "FenceBrokerRecord" in kinds(await read_log(cl, before)):
                break
            await asyncio.sleep(0.1)
        entries = await read_log(cl, before)
        assert kinds(entries)[-1] == "FenceBrokerRecord" and entries[-1][2].id == 3
        img = image_of(await read_log(cl))
        assert img.brokers[3].fenced
        for p in img.topic("r3").partitions.values():
            assert p.leader in (1, 2) and 3 not in p.isr
        solo = img.topic("solo").partitions[0]
        assert (solo.leader, solo.isr) == (-1, (3,))  # the last ISR member stays; no leader
        assert [b.broker_id for b in (await cl.request(DescribeClusterRequest())).brokers] == [1, 2]

        # broker 3 comes back (same incarnation): unfenced, and it leads its partition again
        back = await heartbeat(cl, 3, epochs[3], 10**9)
        assert not back.is_fenced
        img = image_of(await read_log(cl))
        assert img.topic("solo").partitions[0].leader == 3
        assert img.topic("solo").partitions[0].leader_epoch == 2
        stop.set()
        await alive
        await cl.close()

    run(main())


def test_controlled_shutdown_moves_leadership_then_says_stop(controller):
    async def main():
        cl = await connect(controller)
        epochs = await start_brokers(cl, {1: None, 2: None})
        await create(cl, topic("t", 4, 2))
        img = image_of(await read_log(cl))
        led = [p for p in img.topic("t").partitions.values() if p.leader == 1]
        assert led
        first = await heartbeat(cl, 1, epochs[1], 0, want_shut_down=True)
        assert (first.should_shut_down, first.is_fenced) == (False, False)
        img = image_of(await read_log(cl))
        assert all(p.leader == 2 and p.isr == (2,) for p in img.topic("t").partitions.values())
        assert img.brokers[1].in_controlled_shutdown
        end = await log_end(cl)
        behind = await heartbeat(cl, 1, epochs[1], 0, want_shut_down=True)
        assert not behind.should_shut_down  # has not seen its leaderships move yet
        # nor has the new leader (Kafka's lowest active offset: every active broker must have)
        assert not (await heartbeat(cl, 1, epochs[1], end - 1, want_shut_down=True)).should_shut_down
        await heartbeat(cl, 2, epochs[2], end - 1)
        done = await heartbeat(cl, 1, epochs[1], end - 1, want_shut_down=True)
        assert done.should_shut_down and done.is_fenced
        assert image_of(await read_log(cl)).brokers[1].fenced

        # Broker 1 starts again (new incarnation); then broker 2 crashes and comes back: its old
        # incarnation leaves the ISRs. Being the last ISR member it stays there with no leader,
        # unless the topic allows unclean election, where broker 1 takes over alone.
        cid = await cluster_id_of(cl)
        await create(cl, topic("u", assignments=[[2, 1]], configs={"unclean.leader.election.enable": "true"}))
        e1 = (await register(cl, 1, cid)).broker_epoch
        assert not (await heartbeat(cl, 1, e1, e1)).is_fenced
        img = image_of(await read_log(cl))
        # created while broker 1 was fenced: the ISR holds only the usable replica
        assert img.topic("u").partitions[0].isr == (2,) and img.topic("t").partitions[0].isr == (2,)
        assert (await register(cl, 2, cid)).error_code == Errors.DUPLICATE_BROKER_REGISTRATION  # 2 is alive
        assert (await heartbeat(cl, 2, epochs[2], 10**9, want_fence=True)).is_fenced  # 2 crashes: fenced
        e2 = (await register(cl, 2, cid)).broker_epoch
        img = image_of(await read_log(cl))
        assert all((p.leader, p.isr) == (-1, (2,)) for p in img.topic("t").partitions.values())
        assert (img.topic("u").partitions[0].leader, img.topic("u").partitions[0].isr) == (1, (1,))
        assert not (await heartbeat(cl, 2, e2, e2)).is_fenced
        img = image_of(await read_log(cl))
        assert all(p.leader == 2 for p in img.topic("t").partitions.values())
        await cl.close()

    run(main())


# ================================================================ durability
@pytest.mark.slow
def test_restart_keeps_topics_configs_and_registrations(controllers):
    c = controllers().start()
    inc = uuid.uuid4()

    async def setup():
        cl = await connect(c)
        epochs = await start_brokers(cl, {1: "a", 2: "b"})
        cid = await cluster_id_of(cl)
        r = await register(cl, 3, cid, rack="c", incarnation=inc)
        await create(cl, topic("kept", 3, 2, {"retention.ms": "42"}))
        ia = IncrementalAlterConfigsRequest
        await cl.request(
            ia(resources=[ia.AlterConfigsResource(4, "", [ia.AlterableConfig("log.retention.ms", 0, "7")])])
        )
        # a client that pipelines operations and hangs up at once must not leave a gap or a
        # duplicate offset in the log (its operations finish or never start)
        start = await log_end(cl)
        reader, writer = await asyncio.open_connection(HOST, c.port)
        for i in range(200):
            req = CT(topics=[topic(f"gone{i}", 1)], timeout_ms=1000)
            writer.write(b"".join(frame(encode_request(req, 7, i, "x"))))
        await writer.drain()
        while await log_end(cl) == start:
            pass
        writer.transport.abort()  # while the later operations are still being written
        await asyncio.sleep(0.5)
        assert (await create(cl, topic("after.abort", 1)))["after.abort"].error_code == 0
        entries = await read_log(cl, noops=True)
        assert [o for _, o, _ in entries] == list(range(len(entries)))
        entries = [e for e in entries if type(e[2]).__name__ != "LeaderChangeMessage"]
        assert image_of(entries).topic("after.abort") is not None
        await cl.close()
        return cid, epochs, r.broker_epoch, entries

    cid, epochs, epoch3, entries = run(setup())
    assert c.restart(signal.SIGTERM) == 0

    async def check(expect_entries):
        cl = await connect(c)
        assert await cluster_id_of(cl) == cid
        got = await read_log(cl, noops=True)
        assert [o for _, o, _ in got] == list(range(len(got)))
        got = [e for e in got if type(e[2]).__name__ != "LeaderChangeMessage"]
        assert [(o, type(r).__name__) for _, o, r in got[: len(expect_entries)]] == [
            (o, type(r).__name__) for _, o, r in expect_entries
        ]
        img = image_of(got)
        assert img.topic("kept") is not None and img.topic_config("kept")["retention.ms"] == "42"
        assert img.configs[(4, "")]["log.retention.ms"] == "7"
        assert {b.id: b.rack for b in img.brokers.values()} == {1: "a", 2: "b", 3: "c"}
        # registrations survive: same incarnation, same epoch; the live brokers stay unfenced
        assert (await register(cl, 3, cid, rack="c", incarnation=inc)).broker_epoch == epoch3
        assert [b.broker_id for b in (await cl.request(DescribeClusterRequest())).brokers] == [1, 2]
        assert not (await heartbeat(cl, 1, epochs[1], 10**9)).is_fenced
        res = await create(cl, topic("kept"))
        assert res["kept"].error_code == Errors.TOPIC_ALREADY_EXISTS
        await cl.close()
        return got

    run(check(entries))
    assert "metadata_log_truncated" not in c.log_text()

    async def more():
        cl = await connect(c)
        res = await create(cl, topic("after.restart", 1))
        assert res["after.restart"].error_code == 0
        got = await read_log(cl)
        await cl.close()
        return got

    entries = run(more())
    assert c.restart(signal.SIGKILL) == -signal.SIGKILL
    final = run(check(entries))
    assert image_of(final).topic("after.restart") is not None


@pytest.mark.slow
def test_torn_tail_is_truncated_on_restart(controllers):
    c = controllers().start()

    async def setup():
        cl = await connect(c)
        await start_brokers(cl, {1: None})
        await create(cl, topic("whole", 1))
        got = await read_log(cl)
        await cl.close()
        return got

    entries = run(setup())
    assert c.stop(signal.SIGKILL) == -signal.SIGKILL
    seg = c.segment_dir / f"{0:020d}.log"
    good = seg.read_bytes()
    last_pos, last = list(iter_batches(good))[-1]
    # a torn append: half of a copy of the last batch, renumbered as the next one
    torn = bytearray(good[last_pos:])
    struct.pack_into(">q", torn, 0, last.last_offset + 1)
    with open(seg, "ab") as f:
        f.write(bytes(torn[: len(torn) // 2]))
    c.start()

    async def check():
        cl = await connect(c)
        got = await read_log(cl)
        assert [(o, type(r).__name__) for _, o, r in got] == [(o, type(r).__name__) for _, o, r in entries]
        assert (await create(cl, topic("next", 1)))["next"].error_code == 0
        assert "TopicRecord" in kinds(await read_log(cl, entries[-1][1] + 1))
        await cl.close()

    run(check())
    assert seg.read_bytes().startswith(good)
    assert "metadata_log_truncated" in c.log_text()


@pytest.mark.slow
def test_snapshot_truncates_log_and_followers_catch_up_from_it(controllers):
    c = controllers(metadata_log_max_record_bytes_between_snapshots=4000).start()

    async def main():
        cl = await connect(c)
        await start_brokers(cl, {1: "a", 2: "b"})
        for i in range(12):
            await create(cl, topic(f"t{i}", 2, 2, {"retention.ms": str(1000 + i)}))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not list(c.segment_dir.glob("*.checkpoint")):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # let the old segments go
        snaps = sorted(c.segment_dir.glob("*.checkpoint"))
        assert len(snaps) == 1, list(c.segment_dir.iterdir())
        snap_end = int(snaps[0].name.split(".")[0])
        segments = sorted(int(p.name.split(".")[0]) for p in c.segment_dir.glob("*.log"))
        assert segments[0] == snap_end and 0 not in segments

        # below the log start: OFFSET_OUT_OF_RANGE with the snapshot id
        low = await fetch(cl, 0)
        assert low.error_code == Errors.OFFSET_OUT_OF_RANGE and low.log_start_offset == snap_end
        assert (low.snapshot_id.end_offset, low.snapshot_id.epoch) == (snap_end, 1)

        # read the snapshot in small unaligned pieces, as a follower would
        data = b""
        size = None
        while size is None or len(data) < size:
            part = FetchSnapshotRequest.PartitionSnapshot(0, 1, FetchSnapshotRequest.SnapshotId(snap_end, 1), len(data))
            req = FetchSnapshotRequest(
                replica_id=1, max_bytes=700, topics=[FetchSnapshotRequest.TopicSnapshot(METADATA_TOPIC, [part])]
            )
            resp = await cl.request(req)
            p = resp.topics[0].partitions[0]
            assert p.error_code == 0 and p.position == len(data) and 0 < len(p.unaligned_records) <= 700
            size = p.size
            data += bytes(p.unaligned_records)
        assert data == snaps[0].read_bytes()
        missing = FetchSnapshotRequest.PartitionSnapshot(0, 1, FetchSnapshotRequest.SnapshotId(snap_end + 1, 1), 0)
        resp = await cl.request(
            FetchSnapshotRequest(topics=[FetchSnapshotRequest.TopicSnapshot(METADATA_TOPIC, [missing])])
        )
        assert resp.topics[0].partitions[0].error_code == Errors.SNAPSHOT_NOT_FOUND

        snapshot_entries = [(0, r.offset, decode_record(r.value)[0]) for b in decode_batches(data) for r in b.records]
        img = image_of(snapshot_entries)
        rest = await read_log(cl, snap_end)
        full = image_of(rest, img)
        assert {f"t{i}" for i in range(12)} <= set(full.topic_ids)
        assert full.topic_config("t11")["retention.ms"] == "1011" and len(full.brokers) == 2
        await cl.close()
        return full

    before = run(main())
    assert c.restart() == 0

    async def after():
        cl = await connect(c)
        low = await fetch(cl, 0)
        assert low.error_code == Errors.OFFSET_OUT_OF_RANGE
        res = await create(cl, topic("t3"), topic("fresh", 1))
        assert res["t3"].error_code == Errors.TOPIC_ALREADY_EXISTS and res["fresh"].error_code == 0
        d = await cl.request(DescribeClusterRequest(include_fenced_brokers=True), 2)
        assert sorted(b.broker_id for b in d.brokers) == [1, 2]
        await cl.close()

    run(after())
    assert before.topic("t0").partitions[0].replicas


# ================================================================ the log file, in process
def test_metadata_log_recovery_cases(tmp_path):
    from controller.metadata_log import LogCorruption, MetadataLog
    from protocol.generated.metadata_records.no_op_record import NoOpRecord

    async def fill(log, n):
        for _ in range(n):
            await log.append([NoOpRecord(), NoOpRecord()], 1)

    async def main():
        log = MetadataLog(tmp_path)
        log.open(0)
        await fill(log, 3)
        await log.roll()  # a snapshot would end at 6
        await fill(log, 2)
        assert (log.segment_offsets, log.end_offset) == ([0, 6], 10)
        first = await log.read(2, 1)
        assert len(decode_batches(first)) == 1 and decode_batches(first)[0].base_offset == 2
        log.close()

        # a crash left the old segment behind, damaged: the snapshot covers it, so it goes unread
        seg0 = log.dir / f"{0:020d}.log"
        seg0.write_bytes(seg0.read_bytes()[:-7])
        log = MetadataLog(tmp_path)
        report = log.open(6)
        assert (report["deleted_segments"], report["truncated_bytes"]) == (1, 0)
        assert (log.start_offset, log.end_offset, log.segment_offsets) == (6, 10, [6])
        log.close()

        # records between the snapshot and the log are missing: refuse to start
        log = MetadataLog(tmp_path)
        with pytest.raises(LogCorruption):
            log.open(4)
        log.close()

    asyncio.run(main())
