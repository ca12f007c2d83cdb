"""kafka-chunks.sh (tools/kafka_chunks.py), run as the script pip installs, against a real cluster,
and kafka-topics.sh --describe listing chunks.

Bad input (malformed JSON, missing fields, unknown topic/partition/broker/chunk, wrong replica
count, duplicate brokers) prints one line on stderr, exits non-zero and changes nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from node.client import NodeClient
from protocol.generated.alter_partition_reassignments import AlterPartitionReassignmentsRequest
from protocol.generated.create_chunks import CreateChunksRequest as CC
from tests.conftest import eventually, installed_script
from tools.cluster import Cluster

CHUNKS = installed_script("kafka-chunks.sh")
TOPICS = installed_script("kafka-topics.sh")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("kafka-chunks"), brokers=3, verbose=False)
    try:
        c.start()
        yield c
    finally:
        c.stop()


def kc(bs: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHUNKS, *args, "--bootstrap-server", bs], capture_output=True, text=True, timeout=60)


def write(tmp_path: Path, name: str, doc: Any) -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def fails(bs: str, *args: str, needle: str) -> str:
    r = kc(bs, *args)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, f"expected one error line, got: {r.stderr!r}"
    assert lines[0].startswith("Error: ") and needle in lines[0], lines[0]
    assert r.stdout == ""
    return lines[0]


def describe(bs: str, topic: str) -> list[dict]:
    """kafka-topics.sh --describe of one topic -> its partitions, each with a "chunks" list."""
    r = subprocess.run(
        [TOPICS, "--bootstrap-server", bs, "--describe", "--topic", topic], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    parts: list[dict] = []
    for line in r.stdout.splitlines():
        fields = dict(f.split(": ", 1) for f in line.strip("\t").split("\t") if ": " in f)
        if line.startswith("\t\tChunk\t"):
            parts[-1]["chunks"].append(fields)
        elif line.startswith("\t"):
            parts.append({**fields, "chunks": []})
    return parts



def create_topic(bs: str, name: str, replicas: list[int]) -> None:
    assignment = ":".join(map(str, replicas))
    r = subprocess.run(
        [TOPICS, "--bootstrap-server", bs, "--create", "--topic", name, "--replica-assignment", assignment],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr


def produce(bs: str, topic: str, n: int) -> None:
    p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 5, "message.timeout.ms": 30000})
    for i in range(n):
        p.produce(topic, f"v{i}".encode(), partition=0)
    assert p.flush(30) == 0


def state(bs: str, topic: str) -> tuple:
    [p] = describe(bs, topic)
    chunks = [(c["StartOffset"], c["StopOffset"], c["EndOffset"], c["Replicas"], c["Isr"]) for c in p["chunks"]]
    return p["Leader"], p["Replicas"], p.get("StartOffset"), chunks


def test_create_alter_and_describe(cluster: Cluster, tmp_path: Path) -> None:
    bs = cluster.bootstrap
    create_topic(bs, "kc-main", [1, 2])
    produce(bs, "kc-main", 5)
    assert state(bs, "kc-main") == ("1", "1,2", None, [])  # no chunks: Kafka's output, unchanged

    f = write(tmp_path, "create.json", {"partitions": [{"topic": "kc-main", "partition": 0, "replicas": [3, 1]}]})
    r = kc(bs, "create", "--create-chunk-json-file", f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Created a new chunk of kc-main-0 on brokers 3,1, starting at offset 5.\n"
    eventually(lambda: _eq(state(bs, "kc-main"), ("3", "3,1", "5", [("0", "4", "4", "1,2", "1,2")])))

    # a reorder of the brokers that hold the chunk applies at once
    f = write(
        tmp_path,
        "reorder.json",
        {"chunks": [{"topic": "kc-main", "partition": 0, "startOffset": 0, "replicas": [2, 1]}]},
    )
    r = kc(bs, "alter", "--alter-chunk-json-file", f)
    assert r.returncode == 0, r.stderr
    eventually(lambda: _eq(state(bs, "kc-main")[3], [("0", "4", "4", "2,1", "1,2")]))
    # move the old chunk: broker 3 must catch up first, so the move starts (adding 3, removing 1)
    f = write(
        tmp_path, "alter.json", {"chunks": [{"topic": "kc-main", "partition": 0, "startOffset": 0, "replicas": [2, 3]}]}
    )
    r = kc(bs, "alter", "--alter-chunk-json-file", f)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "Reassigning chunk kc-main-0@0 to brokers 2,3.\n"

    def moving_or_moved() -> None:
        _, _, _, [(start, stop, end, replicas, _isr)] = state(bs, "kc-main")
        assert (start, stop, end) == ("0", "4", "4")
        assert replicas in ("2,3,1", "2,3"), replicas  # "2,3" once the data plane reported 3 caught up

    eventually(moving_or_moved)


def _eq(got: Any, want: Any) -> None:
    assert got == want


async def _request(port: int, body: Any) -> Any:
    async with NodeClient("127.0.0.1", port, client_id="test-kafka-chunks") as cl:
        return await cl.request(body)


def test_bad_input_changes_nothing(cluster: Cluster, tmp_path: Path) -> None:
    bs = cluster.bootstrap
    create_topic(bs, "kc-bad", [1, 2])
    produce(bs, "kc-bad", 3)
    # one chunk to name in alter files
    f = write(tmp_path, "c.json", {"partitions": [{"topic": "kc-bad", "partition": 0, "replicas": [2, 3]}]})
    assert kc(bs, "create", "--create-chunk-json-file", f).returncode == 0
    eventually(lambda: _eq(state(bs, "kc-bad"), ("2", "2,3", "3", [("0", "2", "2", "1,2", "1,2")])))
    before = state(bs, "kc-bad")

    def entry(**kw: Any) -> dict:
        return {"topic": "kc-bad", "partition": 0, "replicas": [3, 1], **kw}

    # every file is good except the last entry, so nothing may be sent for the good ones either
    create_cases = [
        ("{not json", "not valid JSON"),
        ([1, 2], "must hold a JSON object"),
        ({"partitions": []}, '"partitions" is empty'),
        ({"chunks": []}, 'needs "partitions"'),
        ({"partitions": [{"partition": 0, "replicas": [1, 2]}]}, 'needs a "topic"'),
        ({"partitions": [{"topic": "kc-bad", "replicas": [1, 2]}]}, 'needs a "partition"'),
        ({"partitions": [{"topic": "kc-bad", "partition": 0}]}, 'needs "replicas"'),
        ({"partitions": [entry(), entry(topic="kc-nope")]}, "topic 'kc-nope' does not exist"),
        ({"partitions": [entry(), entry(topic="kc-bad", partition=7)]}, "partition kc-bad-7 does not exist"),
        ({"partitions": [entry(replicas=[3, 9])]}, "unknown broker id 9"),
        ({"partitions": [entry(replicas=[3])]}, "replication factor is 2"),
        ({"partitions": [entry(replicas=[3, 3])]}, "more than once"),
        ({"partitions": [entry(), entry()]}, "listed more than once"),
    ]
    for doc, needle in create_cases:
        fails(bs, "create", "--create-chunk-json-file", write(tmp_path, "bad.json", doc), needle=needle)

    def chunk(**kw: Any) -> dict:
        return {"topic": "kc-bad", "partition": 0, "startOffset": 0, "replicas": [1, 3], **kw}

    alter_cases = [
        ('{"chunks": [', "not valid JSON"),
        ({"chunks": [{"topic": "kc-bad", "partition": 0, "replicas": [1, 3]}]}, 'needs a "startOffset"'),
        ({"chunks": [chunk(), chunk(startOffset=1)]}, "no inactive chunk starting at offset 1"),
        ({"chunks": [chunk(), chunk(topic="kc-nope")]}, "topic 'kc-nope' does not exist"),
        ({"chunks": [chunk(replicas=[1, 9])]}, "unknown broker id 9"),
        ({"chunks": [chunk(replicas=[1, 2, 3])]}, "replication factor is 2"),
        ({"chunks": [chunk(replicas=[1, 1])]}, "more than once"),
        ({"version": 2, "chunks": [chunk()]}, 'unsupported "version"'),
    ]
    for doc, needle in alter_cases:
        fails(bs, "alter", "--alter-chunk-json-file", write(tmp_path, "bad.json", doc), needle=needle)
    fails(bs, "create", "--create-chunk-json-file", str(tmp_path / "missing.json"), needle="cannot read")
    assert state(bs, "kc-bad") == before

    # wrong arguments: a usage error on one line, exit 2
    for args in (("create",), ("alter", "--create-chunk-json-file", "x"), ("delete",)):
        r = kc(bs, *args)
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "kafka-chunks.sh: error:" in r.stderr, r


def test_create_at_a_leader_that_moved_is_refused_by_the_broker(cluster: Cluster, tmp_path: Path) -> None:
    """The tool sends CreateChunks to the leader Metadata names; sent elsewhere, a broker refuses."""
    bs = cluster.bootstrap
    create_topic(bs, "kc-leader", [1, 2])

    async def send(port: int) -> Any:
        e = CC.CreateChunksTopicPartition(
            topic_name="kc-leader",
            partition_id=0,
            broker_ids=[3, 2],
            start_offset=-1,
            start_timestamp=-1,
            prev_stop_offset=-1,
        )
        return (await _request(port, CC(topic_partitions=[e]))).results[0]

    r = asyncio.run(send(cluster.broker_port(3)))
    assert r.error_code == 6 and "does not lead" in r.error_message  # NOT_LEADER_OR_FOLLOWER
    assert state(bs, "kc-leader") == ("1", "1,2", None, [])


def test_create_on_several_leaders_at_once(cluster: Cluster, tmp_path: Path) -> None:
    """Each partition's request goes to its own leader; empty active chunks just move."""
    bs = cluster.bootstrap
    r = subprocess.run(
        [TOPICS, "--bootstrap-server", bs, "--create", "--topic", "kc-multi", "--replica-assignment", "1:2,2:3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    doc = {
        "partitions": [
            {"topic": "kc-multi", "partition": 1, "replicas": [1, 2]},
            {"topic": "kc-multi", "partition": 0, "replicas": [3, 1]},
        ]
    }
    r = kc(bs, "create", "--create-chunk-json-file", write(tmp_path, "multi.json", doc))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "Created a new chunk of kc-multi-1 on brokers 1,2, starting at offset 0.",
        "Created a new chunk of kc-multi-0 on brokers 3,1, starting at offset 0.",
    ]

    def moved() -> None:
        parts = {p["Partition"]: p for p in describe(bs, "kc-multi")}
        assert (parts["0"]["Leader"], parts["0"]["Replicas"], parts["0"]["chunks"]) == ("3", "3,1", [])
        assert (parts["1"]["Leader"], parts["1"]["Replicas"], parts["1"]["chunks"]) == ("1", "1,2", [])

    eventually(moved)


def test_create_during_a_reassignment_counts_only_the_final_replicas(cluster: Cluster, tmp_path: Path) -> None:
    """Metadata lists the replicas a reassignment is removing; they do not count towards the
    replication factor the new chunk must match (the controller's rule too)."""
    bs = cluster.bootstrap
    create_topic(bs, "kc-reassigning", [1])
    produce(bs, "kc-reassigning", 3)
    cluster.terminate(3)  # the reassignment to broker 3 stays in flight while it is down
    try:
        R = AlterPartitionReassignmentsRequest
        req = R(
            timeout_ms=30000,
            topics=[R.ReassignableTopic("kc-reassigning", [R.ReassignablePartition(partition_index=0, replicas=[3])])],
        )
        resp = asyncio.run(_request(cluster.broker_port(1), req))
        assert resp.responses[0].partitions[0].error_code == 0, resp
        eventually(lambda: _eq(state(bs, "kc-reassigning")[:2], ("1", "3,1")))

        f = write(tmp_path, "c.json", {"partitions": [{"topic": "kc-reassigning", "partition": 0, "replicas": [2]}]})
        r = kc(bs, "create", "--create-chunk-json-file", f)
        assert r.returncode == 0, r.stderr
        # the closed chunk keeps the reassignment's replica list; the new active chunk is on 2 alone
        eventually(lambda: _eq(state(bs, "kc-reassigning"), ("2", "2", "3", [("0", "2", "2", "3,1", "1")])))
    finally:
        cluster.start_node(3)
