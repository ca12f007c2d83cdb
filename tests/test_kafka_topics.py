"""kafka-topics.sh (tools/kafka_topics.py), run as the script pip installs, against a real cluster.

Errors are one line on stderr with the Kafka error name and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.conftest import eventually, installed_script
from tools.cluster import Cluster, free_ports

SCRIPT = installed_script("kafka-topics.sh")


def kt(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, "--bootstrap-server", bootstrap, *args], capture_output=True, text=True, timeout=60)


def ok(bootstrap: str, *args: str) -> str:
    r = kt(bootstrap, *args)
    assert r.returncode == 0, f"kafka-topics.sh {' '.join(args)} exited {r.returncode}: {r.stderr}"
    assert r.stderr == ""
    return r.stdout


def fails(bootstrap: str, *args: str, code: str) -> str:
    """Runs a command that must fail with one line on stderr naming the Kafka error `code`."""
    r = kt(bootstrap, *args)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, f"expected one error line, got: {r.stderr!r}"
    assert lines[0].startswith("Error: ") and f"({code})" in lines[0], lines[0]
    assert "Traceback" not in r.stderr
    return lines[0]



def parse_describe(out: str) -> dict[str, dict]:
    """kafka-topics.sh --describe output -> {topic: {header fields..., "partitions": [...]}}."""
    topics: dict[str, dict] = {}
    for line in out.splitlines():
        fields = dict(f.split(": ", 1) if ": " in f else (f.rstrip(":"), "") for f in line.strip("\t").split("\t"))
        if line.startswith("\t\tChunk\t"):  # an inactive chunk of the partition above
            last = topics[next(reversed(topics))]["partitions"][-1]
            last.setdefault("chunks", []).append(fields)
        elif line.startswith("\t"):
            topics[fields["Topic"]]["partitions"].append(fields)
        else:
            topics[fields["Topic"]] = {**fields, "partitions": []}
    return topics


def ids(value: str) -> list[int]:
    return [int(x) for x in value.split(",") if x]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # One cluster for the module (each test uses its own topics): starting one per test would
    # spend most of the run starting processes.
    c = Cluster(tmp_path_factory.mktemp("kafka-topics"), brokers=3)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def bs(cluster: Cluster) -> str:
    return cluster.bootstrap


def describe(bs: str, topic: str) -> dict:
    return parse_describe(ok(bs, "--describe", "--topic", topic))[topic]


def test_create_describe_list_alter_delete(bs: str) -> None:
    out = ok(
        bs,
        "--create",
        "--topic",
        "orders",
        "--partitions",
        "3",
        "--replication-factor",
        "2",
        "--config",
        "retention.ms=123456",
        "--config",
        "cleanup.policy=delete",
    )
    assert out == "Created topic orders.\n"

    def described() -> dict:
        d = describe(bs, "orders")
        assert d["PartitionCount"] == "3" and len(d["partitions"]) == 3
        return d

    d = eventually(described)
    assert d["ReplicationFactor"] == "2"
    assert len(d["TopicId"]) == 22 and d["TopicId"] != "AAAAAAAAAAAAAAAAAAAAAA"  # base64 of a non-zero uuid
    configs = dict(kv.split("=", 1) for kv in d["Configs"].split(",") if kv)
    assert configs.get("retention.ms") == "123456"
    assert configs.get("cleanup.policy") == "delete"
    assert [p["Partition"] for p in d["partitions"]] == ["0", "1", "2"]
    for p in d["partitions"]:
        replicas = ids(p["Replicas"])
        assert len(replicas) == 2 and len(set(replicas)) == 2 and set(replicas) <= {1, 2, 3}
        assert int(p["Leader"]) in replicas
        assert set(ids(p["Isr"])) <= set(replicas) and ids(p["Isr"])
    # the exact layout of the lines, as Kafka prints them
    raw = ok(bs, "--describe", "--topic", "orders").splitlines()
    assert (
        raw[0].startswith("Topic: orders\tTopicId: ")
        and "\tPartitionCount: 3\tReplicationFactor: 2\tConfigs: " in raw[0]
    )
    assert (
        raw[1].startswith("\tTopic: orders\tPartition: 0\tLeader: ")
        and "\tReplicas: " in raw[1]
        and "\tIsr: " in raw[1]
    )

    assert "orders" in ok(bs, "--list").split()

    assert ok(bs, "--alter", "--topic", "orders", "--partitions", "5") == ""

    def grown() -> None:
        d = describe(bs, "orders")
        assert d["PartitionCount"] == "5" and [p["Partition"] for p in d["partitions"]] == ["0", "1", "2", "3", "4"]
        assert all(len(ids(p["Replicas"])) == 2 for p in d["partitions"])

    eventually(grown)

    ok(bs, "--delete", "--topic", "orders")

    def gone() -> None:
        assert "orders" not in ok(bs, "--list").split()

    eventually(gone)
    fails(bs, "--describe", "--topic", "orders", code="UNKNOWN_TOPIC_OR_PARTITION")


def test_replica_assignment_and_defaults(bs: str) -> None:
    ok(bs, "--create", "--topic", "placed", "--replica-assignment", "1:2,2:3,3:1")
    ok(bs, "--create", "--topic", "defaults")  # num.partitions=1, default.replication.factor=1

    def check() -> None:
        d = describe(bs, "placed")
        assert [ids(p["Replicas"]) for p in d["partitions"]] == [[1, 2], [2, 3], [3, 1]]
        assert d["ReplicationFactor"] == "2"
        assert d["Configs"] == ""
        d = describe(bs, "defaults")
        assert d["PartitionCount"] == "1" and d["ReplicationFactor"] == "1"

    eventually(check)
    # --describe without --topic shows every topic; --topic is a regular expression
    eventually(lambda: {"placed", "defaults"} <= set(parse_describe(ok(bs, "--describe"))))
    assert set(parse_describe(ok(bs, "--describe", "--topic", "pla.*"))) == {"placed"}
    assert ok(bs, "--list", "--topic", "def.*").split() == ["defaults"]


def test_errors_are_one_line_with_the_kafka_error(bs: str) -> None:
    ok(bs, "--create", "--topic", "dup")
    line = fails(bs, "--create", "--topic", "dup", code="TOPIC_ALREADY_EXISTS")
    assert "'dup'" in line
    assert ok(bs, "--create", "--topic", "dup", "--if-not-exists") == ""

    fails(bs, "--create", "--topic", "zero", "--partitions", "0", code="INVALID_PARTITIONS")
    fails(bs, "--create", "--topic", "negative", "--partitions", "-3", code="INVALID_PARTITIONS")
    fails(bs, "--create", "--topic", "too-wide", "--replication-factor", "4", code="INVALID_REPLICATION_FACTOR")
    fails(bs, "--create", "--topic", "badcfg", "--config", "retention.ms=soon", code="INVALID_CONFIG")
    fails(bs, "--create", "--topic", "unknowncfg", "--config", "no.such.config=1", code="INVALID_CONFIG")
    fails(bs, "--create", "--topic", "bad/name", code="INVALID_TOPIC_EXCEPTION")

    fails(bs, "--describe", "--topic", "missing", code="UNKNOWN_TOPIC_OR_PARTITION")
    fails(bs, "--delete", "--topic", "missing", code="UNKNOWN_TOPIC_OR_PARTITION")
    fails(bs, "--alter", "--topic", "missing", "--partitions", "3", code="UNKNOWN_TOPIC_OR_PARTITION")
    assert ok(bs, "--delete", "--topic", "missing", "--if-exists") == ""

    ok(bs, "--create", "--topic", "three", "--partitions", "3")
    eventually(lambda: describe(bs, "three"))
    line = fails(bs, "--alter", "--topic", "three", "--partitions", "3", code="INVALID_PARTITIONS")
    assert "three" in line  # fewer partitions are accepted (KIP-253): tests/test_partition_counts.py

    # nothing was created by the failed requests
    listed = set(ok(bs, "--list").split())
    assert not listed & {"zero", "negative", "too-wide", "badcfg", "unknowncfg", "bad/name", "missing"}


# ---- no cluster needed


def test_unreachable_bootstrap_is_one_line() -> None:
    [port] = free_ports(1)
    r = kt(f"127.0.0.1:{port}", "--list")
    assert r.returncode == 1
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("Error: ") and str(port) in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],  # no action
        ["--create"],  # no topic
        ["--create", "--list", "--topic", "t"],  # two actions
        ["--create", "--topic", "t", "--partitions", "many"],
        ["--create", "--topic", "t", "--config", "retention.ms"],  # not NAME=VALUE
        ["--create", "--topic", "t", "--replica-assignment", "1:x"],
        ["--create", "--topic", "t", "--replica-assignment", "1:2,3", "--partitions", "2"],
        ["--alter", "--topic", "t"],  # no --partitions
        ["--alter", "--topic", "t", "--partitions", "3", "--config", "a=b"],
        ["--describe", "--topic", "a["],  # not a regular expression
        ["--delete"],
    ],
)
def test_bad_arguments_exit_2(args: list[str]) -> None:
    assert kt("127.0.0.1:9", *args).returncode == 2


def test_bootstrap_server_is_required() -> None:
    r = subprocess.run([SCRIPT, "--list"], capture_output=True, text=True)
    assert r.returncode == 2 and "--bootstrap-server" in r.stderr
