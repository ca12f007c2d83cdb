"""Every refusable API answers a refusal in its own shape: a principal without ACLs sends every
version of every API the broker and the controller advertise (one item in each list of the
request) on one connection, and each comes back with an authorization error where its items or
its top-level field carry one. A closed connection would be read by clients as a transport error
and retried (librdkafka's _TRANSPORT), so the connection must outlive the whole walk. Then
librdkafka's CreatePartitions and DeleteRecords, the two seen failing so, get
TOPIC_AUTHORIZATION_FAILED per topic."""

from __future__ import annotations

import asyncio
import re
import sys
import typing
from collections.abc import Iterator
from typing import Any

import pytest

from node.authz import ALWAYS
from node.client import NodeClient
from protocol.errors import Errors, ProtocolError
from protocol.generated import REQUESTS
from tools.cluster import Cluster

pytestmark = pytest.mark.timeout(180)
REFUSALS = {Errors.TOPIC_AUTHORIZATION_FAILED, Errors.GROUP_AUTHORIZATION_FAILED,
            Errors.CLUSTER_AUTHORIZATION_FAILED, Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
# ListGroups leaves out the groups a principal may not describe, and DescribeLogDirs before v3 (no
# error field) answers no dirs, as Kafka: nothing carries a refusal
FILTERED = {"ListGroupsRequest", "DescribeLogDirsRequest v1", "DescribeLogDirsRequest v2"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("denials"), brokers=1, secure="SASL_PLAINTEXT", acls=True)
    try:
        c.start(timeout=60)
        yield c
    finally:
        c.stop()


# ---------------------------------------------------------------- requests with one item per list
def _filled(cls: Any) -> Any:
    """`cls` with one filled item in every list and "t" in every empty string."""
    obj = cls()
    names = vars(sys.modules[cls.__module__])
    for f, hint in cls.__dict__.get("__annotations__", {}).items():
        if f not in cls._fields:
            continue
        h = eval(hint, names) if isinstance(hint, str) else hint
        lists = [a for a in (h, *typing.get_args(h)) if typing.get_origin(a) is list]
        if lists:
            (item,) = typing.get_args(lists[0])
            one = _filled(item) if hasattr(item, "_fields") else {int: 0, str: "t"}.get(item)
            if one is not None:
                setattr(obj, f, [one])
        elif h is str and getattr(obj, f) == "":
            setattr(obj, f, "t")
    return obj


def _walk(obj: Any) -> Iterator[Any]:
    yield obj
    for f in getattr(obj, "_fields", ()):
        v = getattr(obj, f)
        for x in v if isinstance(v, list) else [v]:
            if hasattr(x, "_fields"):
                yield from _walk(x)


def request_at(key: int, version: int) -> Any:
    """A filled request of API `key` that encodes at `version`: a field the version cannot carry
    goes back to its default."""
    cls = REQUESTS[key]
    obj = _filled(cls)
    if key == 0:
        obj.acks = -1  # acks=0 is never answered
    for _ in range(50):
        try:
            obj.encode(version)
            return obj
        except ProtocolError as e:
            m = re.search(r"field (\w+)\.(\w+)\)", str(e))
            if m is None:
                raise
            owner, camel = m.groups()
            snake = re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()
            for x in _walk(obj):
                if type(x).__name__ == owner:
                    setattr(x, snake, getattr(type(x)(), snake))
    raise AssertionError(f"no request of API {key} encodes at v{version}")


def error_codes(obj: Any) -> set[int]:
    out = set()
    for name in getattr(obj, "_fields", ()):
        value = getattr(obj, name)
        if name.endswith("error_code"):
            out.add(value)
        for item in value if isinstance(value, list) else [value]:
            out |= error_codes(item)
    return out


def walk_every_api(c: Cluster, port: int) -> dict[str, set[int]]:
    """(API name vN -> error codes) for every advertised API version, sent as alice on one
    connection; a ClientError (the connection closed) fails the walk where it happens."""
    async def main() -> dict[str, set[int]]:
        out = {}
        async with NodeClient(c.host, port, security=c.client_security("alice"), client_id="walker") as cl:
            for key, (lo, hi) in sorted(cl.versions.items()):
                if key in ALWAYS or key not in REQUESTS:
                    continue
                for v in range(max(lo, REQUESTS[key].MIN_VERSION), min(hi, REQUESTS[key].MAX_VERSION) + 1):
                    out[f"{REQUESTS[key].NAME} v{v}"] = error_codes(await cl.request(request_at(key, v), v, timeout=20))
        return out
    return asyncio.run(main())


@pytest.mark.parametrize("node", ["broker", "controller"])
def test_every_refusable_api_answers_in_its_own_shape(cluster, node):
    port = cluster.broker_port(1) if node == "broker" else cluster.controller_port
    answers = walk_every_api(cluster, port)
    assert len(answers) > (60 if node == "broker" else 30), sorted(answers)
    unrefused = {name: codes for name, codes in answers.items()
                 if not codes & REFUSALS and not {name, name.split()[0]} & FILTERED}
    assert not unrefused, unrefused


def test_librdkafka_create_partitions_and_delete_records_answer_per_topic(cluster):
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        NewPartitions,
        NewTopic,
        ResourcePatternType,
        ResourceType,
    )

    admin = AdminClient(cluster.rdkafka_conf("admin"))
    for f in admin.create_topics([NewTopic("guarded", 1, 1)]).values():
        f.result(30)
    # DESCRIBE only: librdkafka finds the leader (Metadata) before it sends DeleteRecords there
    describe = AclBinding(ResourceType.TOPIC, "guarded", ResourcePatternType.LITERAL, "User:alice", "*",
                          AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    admin.create_acls([describe])[describe].result(30)
    alice = AdminClient(cluster.rdkafka_conf("alice"))
    for fut in [*alice.create_partitions([NewPartitions("guarded", 2)]).values(),
                *alice.delete_records([TopicPartition("guarded", 0, 0)], request_timeout=20).values()]:
        with pytest.raises(KafkaException) as e:
            r = fut.result(30)
            if getattr(r, "error", None) is not None:  # delete_records reports per partition
                raise KafkaException(r.error)
        assert "TOPIC_AUTHORIZATION_FAILED" in str(e.value) or "uthoriz" in str(e.value), e.value
        assert "_TRANSPORT" not in str(e.value)
