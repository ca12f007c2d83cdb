"""ACLs: the authorizer's rules (no processes), then a SASL_SSL cluster with
`authorizer.class.name` set ("broker" and "admin" are super users): a principal with WRITE on a
topic prefix produces there and nowhere else, READ on the topic and its group lets it consume,
and a user client gets CLUSTER_AUTHORIZATION_FAILED from every inter-node API, one test each.
kafka-acls.sh adds, lists and removes ACLs with --command-config."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from metadata import acls as A
from node.client import NodeClient
from protocol.errors import Errors
from protocol.generated import REQUESTS
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(180)
E = A.AclEntry


# ---------------------------------------------------------------- rules
def test_authorizer_rules():
    acls = {i: a for i, a in enumerate([
        E(A.TOPIC, "orders-", A.PREFIXED, "User:alice", "*", A.WRITE, A.ALLOW),
        E(A.TOPIC, "orders-secret", A.LITERAL, "User:alice", "*", A.ALL, A.DENY),
        E(A.TOPIC, "*", A.LITERAL, "User:*", "10.0.0.9", A.READ, A.ALLOW),
        E(A.GROUP, "g", A.LITERAL, "User:bob", "*", A.READ, A.ALLOW),
    ])}
    az = A.Authorizer(frozenset({"User:admin"}))
    ok = lambda p, op, t, n, host="127.0.0.1": az.authorize(acls, p, host, op, t, n)  # noqa: E731
    assert ok("User:alice", A.WRITE, A.TOPIC, "orders-1")
    assert ok("User:alice", A.DESCRIBE, A.TOPIC, "orders-1")  # implied by WRITE
    assert not ok("User:alice", A.READ, A.TOPIC, "orders-1")
    assert not ok("User:alice", A.WRITE, A.TOPIC, "other")
    assert not ok("User:alice", A.WRITE, A.TOPIC, "orders-secret")  # DENY wins
    assert ok("User:anyone", A.READ, A.TOPIC, "x", "10.0.0.9") and not ok("User:anyone", A.READ, A.TOPIC, "x")
    assert ok("User:bob", A.READ, A.GROUP, "g") and not ok("User:bob", A.READ, A.GROUP, "g2")
    assert ok("User:admin", A.CLUSTER_ACTION, A.CLUSTER, A.CLUSTER_NAME)  # super user
    assert not ok("User:bob", A.READ, A.GROUP, "nobody-has-acls")  # default: deny
    assert A.Authorizer(allow_if_no_acl=True).authorize(acls, "User:bob", "h", A.READ, A.GROUP, "nobody-has-acls")
    with pytest.raises(A.AclError):
        A.check_acl(E(A.TOPIC, "t", A.MATCH, "User:a", "*", A.READ, A.ALLOW))
    with pytest.raises(A.AclError):
        A.check_acl(E(A.TOPIC, "t", A.LITERAL, "alice", "*", A.READ, A.ALLOW))
    f = E(A.ANY, "orders-1", A.MATCH, None, None, A.ANY, A.ANY)
    assert [a.resource_name for a in acls.values() if A.filter_matches(f, a)] == ["orders-", "*"]


# ---------------------------------------------------------------- the cluster
@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory) -> Cluster:
    c = Cluster(tmp_path_factory.mktemp("acls"), brokers=1, secure="SASL_SSL", acls=True,
                broker_overrides={"group.initial.rebalance.delay.ms": 0})  # a consumer joins at once
    try:
        c.start(timeout=60)
        yield c
    finally:
        c.stop()


def acls_tool(c: Cluster, *args: str) -> subprocess.CompletedProcess:
    props = Path(c.base_dir) / "admin.properties"
    props.write_text("".join(f"{k}={v}\n" for k, v in c.client_props("admin").items()))
    return subprocess.run([sys.executable, "-m", "tools.kafka_acls", "--bootstrap-server", c.bootstrap,
                           "--command-config", str(props), *args], capture_output=True, text=True, timeout=60)


def create_topics(c: Cluster, *names: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(c.rdkafka_conf("admin"))
    for f in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        f.result(30)


def produce(c: Cluster, user: str, topic: str) -> object:
    from confluent_kafka import Producer

    p = Producer({**c.rdkafka_conf(user), "message.timeout.ms": 10000})
    out = []
    p.produce(topic, b"v", on_delivery=lambda err, _m: out.append(err))
    p.flush(15)
    return out[0] if out else "no answer"


def test_prefix_write_produces_there_and_nowhere_else(acl_cluster):
    c = acl_cluster
    create_topics(c, "orders-eu", "payments")
    r = acls_tool(c, "--add", "--allow-principal", "User:alice", "--operation", "Write", "--topic", "orders-",
                  "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stderr
    assert produce(c, "alice", "orders-eu") is None
    err = produce(c, "alice", "payments")
    assert err is not None and err.code() == Errors.TOPIC_AUTHORIZATION_FAILED
    assert produce(c, "bob", "orders-eu").code() == Errors.TOPIC_AUTHORIZATION_FAILED  # not bob's prefix
    assert "authorization_failed" in Path(c.log_path(1)).read_text()


def test_read_and_group_read_lets_a_principal_consume(acl_cluster):
    from confluent_kafka import Consumer, KafkaError

    c = acl_cluster
    topic, group = f"reads-{uuid.uuid4().hex[:6]}", "billing"
    create_topics(c, topic)
    assert produce(c, "admin", topic) is None

    def consume() -> tuple[list, list]:
        cons = Consumer({**c.rdkafka_conf("bob"), "group.id": group, "auto.offset.reset": "earliest"})
        cons.subscribe([topic])
        got, errors, deadline = [], [], time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            m = cons.poll(0.5)
            if m is None:
                continue
            (errors if m.error() else got).append(m.error() or m.value())
            if errors:
                break
        cons.close()
        return got, errors

    acls_tool(c, "--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", topic)
    got, errors = consume()  # READ on the topic only: the group is refused
    assert not got and errors and errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, errors
    assert acls_tool(c, "--add", "--allow-principal", "User:bob", "--consumer", "--topic", topic,
                     "--group", group).returncode == 0
    got, errors = consume()
    assert got == [b"v"], errors


def test_kafka_acls_tool_lists_and_removes(acl_cluster):
    c = acl_cluster
    assert acls_tool(c, "--add", "--deny-principal", "User:eve", "--operation", "All", "--topic", "vault").returncode == 0
    out = acls_tool(c, "--list", "--topic", "vault").stdout
    assert "resourceType=TOPIC, name=vault, patternType=LITERAL" in out
    assert "(principal=User:eve, host=*, operation=ALL, permissionType=DENY)" in out
    r = acls_tool(c, "--remove", "--deny-principal", "User:eve", "--operation", "All", "--topic", "vault")
    assert r.returncode == 0 and "Removed ACLs: 1" in r.stdout
    assert "vault" not in acls_tool(c, "--list", "--topic", "vault").stdout
    bad = acls_tool(c, "--add", "--allow-principal", "alice", "--topic", "t")  # not TYPE:NAME
    assert bad.returncode == 1 and "Invalid principal" in bad.stderr and len(bad.stderr.splitlines()) == 1
    # a user without ALTER on the cluster may not add ACLs
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )
    admin = AdminClient(c.rdkafka_conf("alice"))
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.ALL,
                         AclPermissionType.ALLOW)
    with pytest.raises(Exception, match="[Aa]uthoriz"):  # noqa: B017 - librdkafka's KafkaException
        admin.create_acls([binding])[binding].result(timeout=30)


# ---------------------------------------------------------------- inter-node APIs, one test each
U = uuid.UUID(int=7)


def _body(key: int):
    R = REQUESTS[key]
    return {
        1: lambda: R(replica_state=R.ReplicaState(replica_id=1, replica_epoch=1),
                     topics=[R.FetchTopic(topic="t", topic_id=U, partitions=[R.FetchPartition(partition=0)])]),
        23: lambda: R(replica_id=1, topics=[R.OffsetForLeaderTopic(topic="t", partitions=[
            R.OffsetForLeaderPartition(partition=0, leader_epoch=0)])]),
        27: lambda: R(markers=[R.WritableTxnMarker(producer_id=1, producer_epoch=0, transaction_result=True, topics=[
            R.WritableTxnMarkerTopic(name="t", partition_indexes=[0])], coordinator_epoch=0)]),
        52: lambda: R(topics=[R.TopicData(topic_name="__cluster_metadata", partitions=[R.PartitionData(
            partition_index=0, replica_epoch=99, replica_id=100, last_offset_epoch=99, last_offset=10**9)])]),
        53: lambda: R(topics=[R.TopicData(topic_name="__cluster_metadata", partitions=[R.PartitionData(
            partition_index=0, leader_id=100, leader_epoch=99)])]),
        54: lambda: R(topics=[R.TopicData(topic_name="__cluster_metadata", partitions=[R.PartitionData(
            partition_index=0, leader_id=100, leader_epoch=99)])]),
        56: lambda: R(broker_id=1, broker_epoch=1, topics=[R.TopicData(topic_name="t", topic_id=U, partitions=[
            R.PartitionData(partition_index=0, new_isr_with_epochs=[R.BrokerState(broker_id=1, broker_epoch=1)])])]),
        59: lambda: R(replica_id=1, topics=[R.TopicSnapshot(name="__cluster_metadata", partitions=[
            R.PartitionSnapshot(partition=0, snapshot_id=R.SnapshotId(end_offset=1, epoch=0))])]),
        62: lambda: R(broker_id=9, cluster_id="x", incarnation_id=U, listeners=[
            R.Listener(name="SASL_SSL", host="h", port=1, security_protocol=3)]),
        63: lambda: R(broker_id=1, broker_epoch=1),
        67: lambda: R(broker_id=1, broker_epoch=1),
        73: lambda: R(broker_id=1, broker_epoch=1, directories=[R.DirectoryData(id=U, topics=[
            R.TopicData(topic_id=U, partitions=[R.PartitionData(partition_index=0)])])]),
        1076: lambda: R(topic_partitions=[R.CreateChunksTopicPartition(topic_name="t", partition_id=0, broker_ids=[1])]),
        1077: lambda: R(chunks=[R.AlterChunkAssignment(topic_name="t", partition_id=0, start_offset=0, broker_ids=[1])]),
        1093: lambda: R(topics=[R.DisklessCreatablePartitions(topic_id=U, name="t", num_partitions=1)]),
        1094: lambda: R(topics=[R.DisklessDeletableTopicState(topic_id=U)]),
        1095: lambda: R(object_key="k", batches=[R.DisklessCommitBatch(topic_id=U)]),
        1096: lambda: R(topics=[R.DisklessDeleteRecordsTopic(topic_id=U, partitions=[
            R.DisklessDeleteRecordsPartition(partition_index=0, offset=0)])]),
        1097: lambda: R(topics=[R.DisklessListOffsetsTopic(topic_id=U, partitions=[
            R.DisklessListOffsetsPartition(partition_index=0, timestamp=-1)])]),
        1098: lambda: R(topics=[R.DisklessFindBatchesTopic(topic_id=U, partitions=[
            R.DisklessFindBatchesPartition(partition_index=0)])]),
        1100: lambda: R(files=[R.DisklessDescribeFileEntry(object_key="k")]),
        1110: lambda: R(object_key="k", file_size=1, owner_ids=[0, 1], from_coordinator=0, to_coordinator=1),
        1112: lambda: R(topics=[R.DisklessDescribeProducersTopic(topic_id=U, partition_indexes=[0])]),
        1932: lambda: R(group_id="g", member_id="m", topic_id=U, partition=0, max_records=1),
    }[key]()


def _error_codes(obj) -> list[int]:
    out = []
    for name in getattr(obj, "_fields", ()):
        value = getattr(obj, name)
        if name == "error_code":
            out.append(value)
        for item in value if isinstance(value, list) else [value]:
            out += _error_codes(item)
    return out


def _ask(c: Cluster, port: int, key: int) -> list[int]:
    async def main():
        async with NodeClient(c.host, port, security=c.client_security("alice"), client_id="intruder") as cl:
            return _error_codes(await cl.request(_body(key)))
    return asyncio.run(main())


BROKER_INTER_NODE = {1: "follower Fetch", 23: "follower OffsetForLeaderEpoch", 27: "WriteTxnMarkers",
                     1076: "CreateChunks", 1077: "AlterChunkAssignments", 1093: "DisklessCreatePartitions",
                     1094: "DisklessDeleteTopics", 1095: "DisklessCommitFile", 1096: "DisklessDeleteRecords",
                     1097: "DisklessListOffsets", 1098: "DisklessFindBatches", 1100: "DisklessDescribeFiles",
                     1110: "DisklessHandOverFile", 1112: "DisklessDescribeProducers", 1932: "SharePartitionForward"}
CONTROLLER_INTER_NODE = {62: "BrokerRegistration", 63: "BrokerHeartbeat", 56: "AlterPartition",
                         67: "AllocateProducerIds", 73: "AssignReplicasToDirs", 1: "metadata Fetch",
                         59: "FetchSnapshot", 1076: "CreateChunks", 1077: "AlterChunkAssignments",
                         52: "Vote", 53: "BeginQuorumEpoch", 54: "EndQuorumEpoch"}


@pytest.mark.parametrize("key", list(BROKER_INTER_NODE), ids=list(BROKER_INTER_NODE.values()))
def test_user_gets_cluster_authorization_failed_from_broker(acl_cluster, key):
    codes = _ask(acl_cluster, acl_cluster.broker_port(1), key)
    assert codes and set(codes) == {Errors.CLUSTER_AUTHORIZATION_FAILED}, codes


@pytest.mark.parametrize("key", list(CONTROLLER_INTER_NODE), ids=list(CONTROLLER_INTER_NODE.values()))
def test_user_gets_cluster_authorization_failed_from_controller(acl_cluster, key):
    codes = _ask(acl_cluster, acl_cluster.controller_port, key)
    assert codes and set(codes) == {Errors.CLUSTER_AUTHORIZATION_FAILED}, codes


def test_transactions_need_write_on_the_transactional_id(acl_cluster):
    from confluent_kafka import KafkaException, Producer

    c = acl_cluster
    create_topics(c, "txq")
    assert acls_tool(c, "--add", "--allow-principal", "User:alice", "--producer", "--topic", "txq",
                     "--transactional-id", "tq").returncode == 0
    p = Producer({**c.rdkafka_conf("alice"), "transactional.id": "tq"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("txq", b"in a transaction")
    p.commit_transaction(30)
    bad = Producer({**c.rdkafka_conf("bob"), "transactional.id": "tq"})
    with pytest.raises(KafkaException, match="TRANSACTIONAL_ID_AUTHORIZATION_FAILED|[Tt]ransactional"):
        bad.init_transactions(10)


def test_configs_and_groups_are_checked_per_resource(acl_cluster):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource

    c = acl_cluster
    # 60 s an answer: the test failed once beside two other test workers (its output not kept);
    # a slow answer on the loaded cores is the likely cause
    create_topics(c, "cfg-a", "cfg-b")
    assert acls_tool(c, "--add", "--allow-principal", "User:alice", "--operation", "DescribeConfigs",
                     "--topic", "cfg-a").returncode == 0
    admin = AdminClient(c.rdkafka_conf("alice"))
    futs = admin.describe_configs([ConfigResource("topic", "cfg-a"), ConfigResource("topic", "cfg-b")])
    got = {r.name: f for r, f in futs.items()}
    assert "cleanup.policy" in got["cfg-a"].result(60)
    with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED|[Aa]uthoriz"):
        got["cfg-b"].result(60)
    assert acls_tool(c, "--add", "--allow-principal", "User:alice", "--operation", "Describe",
                     "--group", "seen").returncode == 0
    described = admin.describe_consumer_groups(["seen", "unseen"])
    assert described["seen"].result(60).group_id == "seen"
    with pytest.raises(KafkaException, match="GROUP_AUTHORIZATION_FAILED|[Aa]uthoriz"):
        described["unseen"].result(60)


def test_batched_group_requests_answer_per_group(acl_cluster):
    """FindCoordinator v4+ and OffsetFetch v8+ carry many groups: each refused one answers
    GROUP_AUTHORIZATION_FAILED, the others are served."""
    from protocol.generated.find_coordinator import FindCoordinatorRequest
    from protocol.generated.offset_fetch import OffsetFetchRequest

    c = acl_cluster
    assert acls_tool(c, "--add", "--allow-principal", "User:alice", "--operation", "Describe",
                     "--group", "fc-ok").returncode == 0
    OF = OffsetFetchRequest

    async def main():
        async with NodeClient(c.host, c.broker_port(1), security=c.client_security("alice")) as cl:
            fc = await cl.request(FindCoordinatorRequest(key_type=0, coordinator_keys=["fc-ok", "fc-no"]), 4)
            codes = {x.key: x.error_code for x in fc.coordinators}
            of = await cl.request(OF(groups=[OF.OffsetFetchRequestGroup(group_id=g, topics=None)
                                            for g in ("fc-ok", "fc-no")]), 8)
            return codes, {g.group_id: g.error_code for g in of.groups}

    found, fetched = asyncio.run(main())
    assert found["fc-no"] == fetched["fc-no"] == Errors.GROUP_AUTHORIZATION_FAILED
    assert Errors.GROUP_AUTHORIZATION_FAILED not in (found["fc-ok"], fetched["fc-ok"])


def test_acls_through_a_kafka_admin_client(acl_cluster):
    """confluent-kafka's create_acls / describe_acls / delete_acls (librdkafka's CreateAcls,
    DescribeAcls, DeleteAcls versions) against the broker."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(acl_cluster.rdkafka_conf("admin"))
    b = AclBinding(ResourceType.TOPIC, "lib-", ResourcePatternType.PREFIXED, "User:carol", "*", AclOperation.READ,
                   AclPermissionType.ALLOW)
    assert admin.create_acls([b])[b].result(30) is None
    f = AclBindingFilter(ResourceType.TOPIC, "lib-x", ResourcePatternType.MATCH, None, None, AclOperation.ANY,
                         AclPermissionType.ANY)
    assert admin.describe_acls(f).result(30) == [b]
    deleted = admin.delete_acls([f])[f].result(30)
    assert deleted == [b] and admin.describe_acls(f).result(30) == []
