"""The everyday Kafka scripts, run as the scripts pip installs, against one real
cluster: kafka-console-producer.sh, kafka-console-consumer.sh, kafka-consumer-groups.sh,
kafka-get-offsets.sh, kafka-delete-records.sh, kafka-leader-election.sh and
kafka-broker-api-versions.sh. Output is compared with what Kafka's scripts print (column headers,
widths, order, line formats); stock clients (kafka-python, confluent-kafka) write and read beside
them. Bad input to every script is one line on stderr and a non-zero exit (2 for bad arguments).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer

from client.partitioner import murmur2
from node.client import NodeClient
from protocol.generated.metadata import MetadataRequest
from tests.conftest import FAST_FENCING, installed_script, wait_for
from tools import (
    kafka_broker_api_versions,
    kafka_chunks,
    kafka_console_consumer,
    kafka_console_producer,
    kafka_consumer_groups,
    kafka_delete_records,
    kafka_get_offsets,
    kafka_leader_election,
    kafka_topics,
)
from tools.cluster import Cluster, free_ports

PRODUCER = installed_script("kafka-console-producer.sh")
CONSUMER = installed_script("kafka-console-consumer.sh")
GROUPS = installed_script("kafka-consumer-groups.sh")
OFFSETS = installed_script("kafka-get-offsets.sh")
DELETE_RECORDS = installed_script("kafka-delete-records.sh")
ELECTION = installed_script("kafka-leader-election.sh")
API_VERSIONS = installed_script("kafka-broker-api-versions.sh")
TOPICS = installed_script("kafka-topics.sh")
CHUNKS = installed_script("kafka-chunks.sh")
MODULES = {
    PRODUCER: kafka_console_producer, CONSUMER: kafka_console_consumer, GROUPS: kafka_consumer_groups,
    OFFSETS: kafka_get_offsets, DELETE_RECORDS: kafka_delete_records, ELECTION: kafka_leader_election,
    API_VERSIONS: kafka_broker_api_versions, TOPICS: kafka_topics, CHUNKS: kafka_chunks,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # One cluster for the module: each test uses its own topics and groups.
    c = Cluster(tmp_path_factory.mktemp("kafka-scripts"), brokers=3, verbose=False,
                broker_overrides={"group.initial.rebalance.delay.ms": 0, "offsets.topic.num.partitions": 3,
                                  **FAST_FENCING},
                # a test kills broker 3 and starts it again; test_leader_election moves leaders by
                # hand, and the periodic rebalance (300 s) fired mid-test on a slow run
                controller_overrides={**FAST_FENCING, "auto.leader.rebalance.enable": "false"})
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def bs(cluster: Cluster) -> str:
    return cluster.bootstrap


def run(script: str, bs: str | None, *args: str, stdin: str | None = None, real: bool = False,
        timeout: float = 60) -> subprocess.CompletedProcess:
    """A script's run: the installed script in its own process when `real`, else its main() in
    this one (the same code without a Python start per call, which made this file take minutes)."""
    argv = [*(["--bootstrap-server", bs] if bs else []), *args]
    if real:
        return subprocess.run([script, *argv], capture_output=True, text=True, input=stdin, timeout=timeout)
    out, err = io.TextIOWrapper(io.BytesIO(), write_through=True), io.StringIO()
    saved_stdin = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO((stdin or "").encode()))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = MODULES[script].main(argv)
            except SystemExit as e:
                code = e.code
    finally:
        sys.stdin = saved_stdin
    return subprocess.CompletedProcess(argv, code, out.buffer.getvalue().decode(), err.getvalue())


def ok(script: str, bs: str, *args: str, stdin: str | None = None, real: bool = False) -> subprocess.CompletedProcess:
    r = run(script, bs, *args, stdin=stdin, real=real)
    assert r.returncode == 0, f"{Path(script).name} {' '.join(args)} exited {r.returncode}: {r.stderr}"
    assert "Traceback" not in r.stderr
    return r


def fails(script: str, bs: str | None, *args: str, code: int = 1, needle: str = "", stdin: str | None = None,
          real: bool = False) -> str:
    """One line on stderr, exit `code`, no traceback; returns the line."""
    r = run(script, bs, *args, stdin=stdin, real=real)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1, f"expected one error line, got: {r.stderr!r}"
    assert needle in lines[0], lines[0]
    return lines[0]


def create_topic(cluster: Cluster, name: str, *args: str) -> None:
    ok(TOPICS, cluster.bootstrap, "--create", "--topic", name, *args)

    async def everywhere() -> bool:  # the metadata reaches every broker shortly after the controller commits
        for b in cluster.broker_ids:
            async with NodeClient("127.0.0.1", cluster.broker_port(b), timeout=5) as c:
                md = await c.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=name)],
                                                     allow_auto_topic_creation=False))
            if md.topics[0].error_code or any(p.leader_id < 0 for p in md.topics[0].partitions):
                return False
        return True

    wait_for(lambda: asyncio.run(everywhere()), what=f"topic {name} on every broker")


def consume(bs: str, *args: str, real: bool = False) -> subprocess.CompletedProcess:
    return ok(CONSUMER, bs, *args, real=real)


# ---------------------------------------------------------------- console producer and consumer
def test_console_producer_and_consumer(cluster: Cluster, bs: str) -> None:
    create_topic(cluster, "cp", "--partitions", "3", "--replication-factor", "2")
    lines = "".join(f"k{i}:v{i}\n" for i in range(12))
    r = ok(PRODUCER, bs, "--topic", "cp", "--property", "parse.key=true", "--property", "key.separator=:",
           stdin=lines, real=True)
    assert r.stdout == "" and r.stderr == ""
    ok(PRODUCER, bs, "--topic", "cp", "--property", "parse.headers=true", "--property", "parse.key=true",
       "--request-required-acks", "1", stdin="h1:x,h2:y\thk\thv\n")
    ok(PRODUCER, bs, "--topic", "cp", "--producer-property", "acks=0", "--compression-codec", "lz4",
       "--property", "parse.key=true", "--property", "null.marker=NULL", stdin="NULL\tnokey\n")

    r = consume(bs, "--topic", "cp", "--from-beginning", "--max-messages", "14", "--property", "print.key=true",
                "--property", "print.timestamp=true", "--property", "print.partition=true",
                "--property", "print.offset=true", "--property", "print.headers=true", real=True)
    assert r.stderr.splitlines() == ["Processed a total of 14 messages"]
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert len(rows) == 14
    now = time.time() * 1000
    seen = {}
    for ts, part, off, headers, key, value in rows:
        # Kafka's DefaultMessageFormatter: CreateTime:ts, Partition:p, Offset:o, headers, key, value
        assert ts.startswith("CreateTime:") and now - 60_000 < int(ts.split(":")[1]) <= now
        assert re.fullmatch(r"Partition:\d", part) and re.fullmatch(r"Offset:\d+", off)
        seen[value] = (key, headers, int(part.split(":")[1]))
    for i in range(12):
        key, headers, p = seen[f"v{i}"]
        assert key == f"k{i}" and headers == "NO_HEADERS"
        assert p == (murmur2(key.encode()) & 0x7FFFFFFF) % 3  # Kafka's partition for the key
    assert seen["hv"][:2] == ("hk", "h1:x,h2:y")
    assert seen["nokey"][0] == "null"  # null.marker made it a null key; the formatter prints null

    # a stock client reads what the console producer wrote, headers too
    c = KafkaConsumer("cp", bootstrap_servers=bs, auto_offset_reset="earliest", consumer_timeout_ms=5000)
    got = {m.value: m for m in c}
    c.close()
    assert len(got) == 14 and got[b"hv"].headers == [("h1", b"x"), ("h2", b"y")] and got[b"hv"].key == b"hk"

    # --partition/--offset, custom separator, no value printed
    p = seen["v0"][2]
    r = consume(bs, "--topic", "cp", "--partition", str(p), "--offset", "1", "--max-messages", "1",
                "--property", "print.key=true", "--property", "key.separator=|", "--property", "print.offset=true")
    assert re.fullmatch(r"Offset:1\|k\d+\|v\d+\n", r.stdout), r.stdout
    # --timeout-ms ends a consumer with nothing more to read
    t0 = time.monotonic()
    r = consume(bs, "--topic", "cp", "--timeout-ms", "1500")
    assert r.stdout == "" and r.stderr.splitlines() == ["Processed a total of 0 messages"]
    assert time.monotonic() - t0 < 20


def test_console_consumer_read_committed(cluster: Cluster, bs: str) -> None:
    create_topic(cluster, "txn", "--partitions", "1", "--replication-factor", "1")
    p = Producer({"bootstrap.servers": bs, "transactional.id": "scripts-txn"})
    p.init_transactions(30)
    for value, commit in (("committed-1", True), ("aborted", False), ("committed-2", True)):
        p.begin_transaction()
        p.produce("txn", value.encode())
        p.flush(30)  # written before the abort (an abort purges what librdkafka has not sent)
        p.commit_transaction(30) if commit else p.abort_transaction(30)
    r = consume(bs, "--topic", "txn", "--from-beginning", "--max-messages", "2", "--isolation-level",
                "read_committed")
    assert r.stdout == "committed-1\ncommitted-2\n"
    r = consume(bs, "--topic", "txn", "--from-beginning", "--max-messages", "3")
    assert r.stdout == "committed-1\naborted\ncommitted-2\n"


# ---------------------------------------------------------------- consumer groups
def groups(bs: str, *args: str) -> str:
    return ok(GROUPS, bs, *args).stdout


def table(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.strip()]


def test_consumer_groups(cluster: Cluster, bs: str, tmp_path: Path) -> None:
    create_topic(cluster, "cg", "--partitions", "2", "--replication-factor", "2")
    ok(PRODUCER, bs, "--topic", "cg", "--property", "parse.key=true", "--property", "key.separator=:",
       stdin="".join(f"k{i}:v{i}\n" for i in range(20)))
    stock = KafkaConsumer("cg", bootstrap_servers=bs, group_id="cg-group", client_id="kp-client",
                          auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        n = 0
        deadline = time.monotonic() + 30
        while n < 15 and time.monotonic() < deadline:
            n += sum(len(v) for v in stock.poll(500, max_records=15 - n).values())
        stock.commit()

        assert "cg-group" in groups(bs, "--list").splitlines()
        out = groups(bs, "--list", "--state")
        assert out.splitlines()[0] == f"{'GROUP':<25} {'STATE':<20}"
        assert f"{'cg-group':<25} {'Stable':<20}" in out.splitlines()

        out = ok(GROUPS, bs, "--describe", "--group", "cg-group", real=True).stdout
        lines = out.split("\n")
        assert lines[0] == ""  # Kafka's table starts with a newline
        header = lines[1]
        assert header.split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
                                  "CONSUMER-ID", "HOST", "CLIENT-ID"]
        # Kafka's widths: group 15+, topic 15+, then 10, 15, 15, 15, consumer id, host 15+, client id
        assert header.startswith(f"{'GROUP':<15} {'TOPIC':<15} {'PARTITION':<10} {'CURRENT-OFFSET':<15} "
                                 f"{'LOG-END-OFFSET':<15} {'LAG':<15} CONSUMER-ID")
        rows = table(out)[1:]
        assert [r[:2] for r in rows] == [["cg-group", "cg"]] * 2
        assert sorted(int(r[2]) for r in rows) == [0, 1]
        assert sum(int(r[4]) for r in rows) == 20
        assert sum(int(r[3]) for r in rows) == 15 and sum(int(r[5]) for r in rows) == 5
        for line, r in zip(lines[2:], rows):
            assert int(r[4]) - int(r[3]) == int(r[5])
            assert r[7] == "/127.0.0.1" and r[8] == "kp-client" and r[6].startswith("kp-client")
            # columns line up under their headers (the consumer id sets its column's width)
            assert line.index(r[6]) == header.index("CONSUMER-ID") and line.index("/127") == header.index("HOST")
            assert header.index("HOST") == header.index("CONSUMER-ID") + max(15, len(r[6])) + 1

        out = groups(bs, "--describe", "--group", "cg-group", "--members", "--verbose")
        assert out.split("\n")[1].split() == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS",
                                              "ASSIGNMENT"]
        assert table(out)[1][2:] == ["/127.0.0.1", "kp-client", "2", "cg(0,1)"]

        out = groups(bs, "--describe", "--group", "cg-group", "--state")
        assert out.split("\n")[1].split() == ["GROUP", "COORDINATOR", "(ID)", "ASSIGNMENT-STRATEGY", "STATE",
                                              "#MEMBERS"]
        row = table(out)[1]
        assert row[0] == "cg-group" and re.fullmatch(r"\(\d\)", row[2]) and row[3:] == ["range", "Stable", "1"]

        # a reset needs an inactive group
        line = fails(GROUPS, bs, "--reset-offsets", "--group", "cg-group", "--topic", "cg", "--to-earliest",
                     "--execute")
        assert "Assignments can only be reset if the group 'cg-group' is inactive, but the current state is Stable." in line
    finally:
        stock.close()

    def empty() -> bool:
        r = run(GROUPS, bs, "--describe", "--group", "cg-group")
        return "Consumer group 'cg-group' has no active members." in r.stderr

    wait_for(empty, what="the group to be empty")
    # Kafka prints the members header even for a group without members
    assert groups(bs, "--describe", "--group", "cg-group", "--members") == \
        "\n" + " ".join(f"{h:<15}" for h in ("GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS")) + " \n"
    out = groups(bs, "--list", "--type", "--state", "Empty")
    assert out.splitlines()[0] == f"{'GROUP':<25} {'TYPE':<20} {'STATE':<20}"
    assert f"{'cg-group':<25} {'Classic':<20} {'Empty':<20}" in out.splitlines()
    rows = table(groups(bs, "--describe", "--group", "cg-group"))[1:]
    assert {r[6] for r in rows} == {"-"} and {r[7] for r in rows} == {"-"} and {r[8] for r in rows} == {"-"}

    # --reset-offsets: dry run (the default) changes nothing; --execute commits
    r = ok(GROUPS, bs, "--reset-offsets", "--group", "cg-group", "--topic", "cg", "--to-earliest")
    assert "WARN: No action will be performed as the --execute option is missing" in r.stderr
    assert r.stdout.split("\n")[1] == f"{'GROUP':<30} {'TOPIC':<30} {'PARTITION':<10} {'NEW-OFFSET':<15}"
    assert [row[3] for row in table(r.stdout)[1:]] == ["0", "0"]
    assert sum(int(row[3]) for row in table(groups(bs, "--describe", "--group", "cg-group"))[1:]) == 15
    groups(bs, "--reset-offsets", "--group", "cg-group", "--all-topics", "--to-offset", "3", "--execute")
    assert [row[3] for row in table(groups(bs, "--describe", "--group", "cg-group"))[1:]] == ["3", "3"]
    out = groups(bs, "--reset-offsets", "--group", "cg-group", "--topic", "cg:1", "--shift-by", "-10", "--execute")
    assert table(out)[1:] == [["cg-group", "cg", "1", "0"]]  # clamped to the earliest, as Kafka
    out = groups(bs, "--reset-offsets", "--group", "cg-group", "--all-topics", "--to-latest", "--dry-run",
                 "--export")
    ends = {f"cg,{row[2]},{row[4]}" for row in table(groups(bs, "--describe", "--group", "cg-group"))[1:]}
    assert set(out.split()) == ends
    # --from-file reads what --export writes (Kafka's CSV: topic,partition,offset for one group)
    plan = tmp_path / "plan.csv"
    plan.write_text(groups(bs, "--reset-offsets", "--group", "cg-group", "--all-topics", "--to-offset", "2",
                           "--export"))
    assert set(plan.read_text().split()) == {"cg,0,2", "cg,1,2"}
    out = groups(bs, "--reset-offsets", "--group", "cg-group", "--from-file", str(plan), "--execute")
    assert table(out)[1:] == [["cg-group", "cg", "0", "2"], ["cg-group", "cg", "1", "2"]]
    assert [row[3] for row in table(groups(bs, "--describe", "--group", "cg-group"))[1:]] == ["2", "2"]
    # the group form (group,topic,partition,offset), as --export writes for several groups; offsets
    # past the end are clamped to it as Kafka does
    plan.write_text("cg-group,cg,0,1\ncg-group,cg,1,999999\nother-group,cg,0,0\n")
    out = groups(bs, "--reset-offsets", "--group", "cg-group", "--from-file", str(plan), "--dry-run", "--export")
    end1 = next(row[4] for row in table(groups(bs, "--describe", "--group", "cg-group"))[1:] if row[2] == "1")
    assert out.split() == ["cg,0,1", f"cg,1,{end1}"]
    for content, needle in (("cg,zero,1\n", "line 1: 'cg,zero,1' is not topic,partition,offset"),
                            ("cg,0,1\ncg,0\n", "line 2: 'cg,0' is not topic,partition,offset"),
                            ("x,cg,0,1\n", "No reset plan for group cg-group found"),
                            ("cg,7,1\n", "partition cg-7 does not exist")):
        plan.write_text(content)
        fails(GROUPS, bs, "--reset-offsets", "--group", "cg-group", "--from-file", str(plan), "--execute",
              needle=needle)
    fails(GROUPS, bs, "--reset-offsets", "--group", "cg-group", "--from-file", str(tmp_path / "none.csv"),
          "--dry-run", needle="cannot read")
    assert [row[3] for row in table(groups(bs, "--describe", "--group", "cg-group"))[1:]] == ["2", "2"]
    out = groups(bs, "--reset-offsets", "--group", "cg-group", "--all-topics", "--to-datetime",
                 "2000-01-01T00:00:00.000", "--dry-run")
    assert [row[3] for row in table(out)[1:]] == ["0", "0"]
    fails(GROUPS, bs, "--reset-offsets", "--group", "cg-group", "--topic", "nope", "--to-earliest", "--dry-run",
          needle="does not exist")

    # --delete-offsets, then --delete
    out = groups(bs, "--delete-offsets", "--group", "cg-group", "--topic", "cg:0")
    assert out.split("\n")[0] == "Request succeed for deleting offsets with topic cg:0 group cg-group"
    assert out.split("\n")[2] == f"{'TOPIC':<30} {'PARTITION':<15} {'STATUS':<15}"
    assert table(out)[2] == ["cg", "0", "Successful"]
    assert [row[2] for row in table(groups(bs, "--describe", "--group", "cg-group"))[1:]] == ["1"]
    assert groups(bs, "--delete", "--group", "cg-group") == \
        "Deletion of requested consumer groups ('cg-group') was successful.\n"
    assert "cg-group" not in groups(bs, "--list").split()
    fails(GROUPS, bs, "--describe", "--group", "cg-group", needle="Consumer group 'cg-group' does not exist.")
    fails(GROUPS, bs, "--delete", "--group", "cg-group", needle="Deletion of some consumer groups failed")


def test_console_consumer_group(cluster: Cluster, bs: str) -> None:
    """--group: joins with Kafka's range assignor beside a stock consumer, starts at the committed
    offsets and commits what it printed."""
    create_topic(cluster, "ccg", "--partitions", "2", "--replication-factor", "1")
    ok(PRODUCER, bs, "--topic", "ccg", stdin="".join(f"v{i}\n" for i in range(6)))
    r = consume(bs, "--topic", "ccg", "--group", "ccg-group", "--from-beginning", "--max-messages", "4")
    assert len(r.stdout.splitlines()) == 4
    rows = table(groups(bs, "--describe", "--group", "ccg-group"))[1:]
    assert sum(int(row[3]) for row in rows) == 4  # committed what it printed, no more
    first = set(r.stdout.split())
    r = consume(bs, "--topic", "ccg", "--group", "ccg-group", "--max-messages", "2")
    assert first | set(r.stdout.split()) == {f"v{i}" for i in range(6)}  # went on where the group was
    rows = table(groups(bs, "--describe", "--group", "ccg-group"))[1:]
    assert all(row[5] == "0" for row in rows)

    # shares a group with a stock consumer: the range assignment gives each one partition
    stock = KafkaConsumer("ccg", bootstrap_servers=bs, group_id="ccg-shared", client_id="kp-shared")
    try:
        stock.poll(500)
        proc = subprocess.Popen([CONSUMER, "--bootstrap-server", bs, "--topic", "ccg", "--group", "ccg-shared"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            def both_assigned() -> bool:
                stock.poll(200)
                out = run(GROUPS, bs, "--describe", "--group", "ccg-shared", "--members").stdout
                counts = {row[3]: row[4] for row in table(out)[1:]}
                return counts == {"kp-shared": "1", "console-consumer": "1"}

            wait_for(both_assigned, timeout=60, what="a partition for each member")
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and err.splitlines()[-1].startswith("Processed a total of ")
    finally:
        stock.close()


# ---------------------------------------------------------------- offsets, delete records
def test_get_offsets_and_delete_records(cluster: Cluster, bs: str, tmp_path: Path) -> None:
    create_topic(cluster, "go", "--partitions", "2", "--replication-factor", "1")
    create_topic(cluster, "go2", "--partitions", "1", "--replication-factor", "1")
    p = Producer({"bootstrap.servers": bs})
    for i in range(10):
        p.produce("go", f"v{i}".encode(), partition=0, timestamp=1_000_000 + i * 1000)
    for i in range(3):
        p.produce("go", f"w{i}".encode(), partition=1, timestamp=2_000_000 + i)
    assert p.flush(30) == 0
    assert ok(OFFSETS, bs, "--topic", "go", real=True).stdout == "go:0:10\ngo:1:3\n"
    assert ok(OFFSETS, bs, "--topic", "go", "--time", "-2").stdout == "go:0:0\ngo:1:0\n"
    assert ok(OFFSETS, bs, "--topic", "go", "--time", "earliest", "--partitions", "1").stdout == "go:1:0\n"
    assert ok(OFFSETS, bs, "--topic", "go", "--time", "max-timestamp").stdout == "go:0:9\ngo:1:2\n"
    # by timestamp: the first offset at or after it; none after the last record: left out, as Kafka
    assert ok(OFFSETS, bs, "--topic", "go", "--time", "1004500").stdout == "go:0:5\ngo:1:0\n"
    assert ok(OFFSETS, bs, "--topic", "go", "--time", "3000000").stdout == ""
    assert ok(OFFSETS, bs, "--topic-partitions", "go.*:0").stdout == "go:0:10\ngo2:0:0\n"  # "go-0" < "go2-0"
    assert ok(OFFSETS, bs, "--topic-partitions", "go:1-,go2").stdout == "go:1:3\ngo2:0:0\n"
    internal = ok(OFFSETS, bs).stdout
    assert "go:0:10" in internal and "__consumer_offsets" in internal
    assert "__consumer_offsets" not in ok(OFFSETS, bs, "--exclude-internal-topics").stdout

    f = tmp_path / "delete.json"
    f.write_text(json.dumps({"partitions": [{"topic": "go", "partition": 0, "offset": 4},
                                            {"topic": "go", "partition": 1, "offset": -1}], "version": 1}))
    out = ok(DELETE_RECORDS, bs, "--offset-json-file", str(f), real=True).stdout
    assert out == ("Executing records delete operation\nRecords delete operation completed:\n"
                   "partition: go-0\tlow_watermark: 4\npartition: go-1\tlow_watermark: 3\n")
    assert ok(OFFSETS, bs, "--topic", "go", "--time", "-2").stdout == "go:0:4\ngo:1:3\n"
    r = consume(bs, "--topic", "go", "--partition", "0", "--offset", "earliest", "--max-messages", "1")
    assert r.stdout == "v4\n"

    # bad files and unknown partitions change nothing
    for doc, needle in (
        ("{not json", "is not valid JSON"),
        ({"partitions": [{"topic": "go", "partition": 0, "offset": 5}] * 2}, "duplicate topic partitions: go-0"),
        ({"partitions": [{"topic": "go", "partition": 7, "offset": 5}]}, "partition go-7 does not exist"),
        ({"partitions": [{"topic": "nope", "partition": 0, "offset": 5}]}, "topic 'nope' does not exist"),
        ({"partitions": [{"topic": "go", "partition": 0, "offset": -5}]}, '"offset" of -1 or more'),
        ({"version": 2, "partitions": []}, 'unsupported "version"'),
    ):
        f.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        fails(DELETE_RECORDS, bs, "--offset-json-file", str(f), needle=needle)
    assert ok(OFFSETS, bs, "--topic", "go", "--time", "-2").stdout == "go:0:4\ngo:1:3\n"
    # past the high watermark: Kafka's per-partition line, then the error
    f.write_text(json.dumps({"partitions": [{"topic": "go", "partition": 0, "offset": 99}]}))
    r = run(DELETE_RECORDS, bs, "--offset-json-file", str(f))
    assert r.returncode == 1 and "partition: go-0\terror: " in r.stdout and len(r.stderr.splitlines()) == 1


# ---------------------------------------------------------------- broker api versions
def test_broker_api_versions(cluster: Cluster, bs: str) -> None:
    out = ok(API_VERSIONS, bs, real=True).stdout
    blocks = re.findall(r"^(\S+) \(id: (\d+) rack: null\) -> \(\n((?:\t.*\n)+)\)$", out, re.M)
    assert [int(b[1]) for b in blocks] == [1, 2, 3]
    for addr, broker, body in blocks:
        assert addr == f"127.0.0.1:{cluster.broker_port(int(broker))}"
        lines = body.rstrip("\n").split(",\n")
        assert lines[0] == "\tProduce(0): 3 to 12 [usable: 12]"
        assert "\tApiVersions(18): 0 to 4 [usable: 4]" in lines
        keys = [int(re.search(r"\((\d+)\)", x).group(1)) for x in lines]
        assert keys == sorted(keys)


# ---------------------------------------------------------------- leader election, chunks
def leader(bs: str, topic: str) -> str:
    out = ok(TOPICS, bs, "--describe", "--topic", topic).stdout
    return re.search(r"\tLeader: (\S+)", out).group(1)


def test_leader_election(cluster: Cluster, bs: str, tmp_path: Path) -> None:
    create_topic(cluster, "le", "--replica-assignment", "1:2")
    r = ok(ELECTION, bs, "--election-type", "preferred", "--topic", "le", "--partition", "0")
    assert r.stdout == "Valid replica already elected for partitions le-0\n"
    cluster.restart(1)  # a controlled shutdown moves the leadership to broker 2
    wait_for(lambda: re.search(r"\tIsr: (1,2|2,1)", ok(TOPICS, bs, "--describe", "--topic", "le").stdout),
             what="broker 1 back in the ISR")
    assert leader(bs, "le") == "2"
    f = tmp_path / "election.json"
    f.write_text(json.dumps({"partitions": [{"topic": "le", "partition": 0}]}))
    r = ok(ELECTION, bs, "--election-type", "PREFERRED", "--path-to-json-file", str(f), real=True)
    assert r.stdout == "Successfully completed leader election (PREFERRED) for partitions le-0\n"
    wait_for(lambda: leader(bs, "le") == "1", what="broker 1 leading again")
    r = ok(ELECTION, bs, "--election-type", "preferred", "--all-topic-partitions")
    for line in r.stdout.splitlines():  # the partitions broker 1 led before its restart, if any left
        assert re.fullmatch(r"(Successfully completed leader election \(PREFERRED\) for partitions|"
                            r"Valid replica already elected for partitions) \S+-\d+(, \S+-\d+)*", line), line

    r = run(ELECTION, bs, "--election-type", "unclean", "--topic", "nope", "--partition", "0")
    assert r.returncode == 1
    assert r.stdout.startswith("Error completing leader election (UNCLEAN) for partition: nope-0: "
                               "UNKNOWN_TOPIC_OR_PARTITION")
    assert r.stderr.splitlines() == ["Error: 1 replica(s) could not be elected"]
    f.write_text(json.dumps({"partitions": [{"topic": "le", "partition": 0}] * 2}))
    fails(ELECTION, bs, "--election-type", "preferred", "--path-to-json-file", str(f), needle="duplicate partitions")


def test_console_consumer_reads_old_chunks_from_their_replicas(cluster: Cluster, bs: str, tmp_path: Path) -> None:
    """An old chunk lives on broker 1 only, the active chunk on broker 3: the console consumer
    reads the old offsets from broker 1 (chunk_read with its client id there), and still does with
    broker 3, the active chunk's leader, down."""
    create_topic(cluster, "chunked", "--replica-assignment", "1")
    ok(PRODUCER, bs, "--topic", "chunked", stdin="".join(f"old{i}\n" for i in range(5)))
    f = tmp_path / "chunk.json"
    f.write_text(json.dumps({"partitions": [{"topic": "chunked", "partition": 0, "replicas": [3]}]}))
    ok(CHUNKS, bs, "create", "--create-chunk-json-file", str(f))
    wait_for(lambda: leader(bs, "chunked") == "3", what="the new active chunk on broker 3")
    ok(PRODUCER, bs, "--topic", "chunked", stdin="new0\nnew1\n")
    client = "chunk-reader-test"
    r = consume(bs, "--topic", "chunked", "--from-beginning", "--max-messages", "7",
                "--consumer-property", f"client.id={client}")
    assert r.stdout.split() == [f"old{i}" for i in range(5)] + ["new0", "new1"]
    log1 = cluster.log_path(1).read_text()
    assert "event='chunk_read' topic='chunked'" in log1 and f"client='{client}'" in log1

    cluster.kill(3)
    try:  # an explicit offset: the earliest offset is the active chunk leader's to tell
        r = consume(bs.split(",")[0], "--topic", "chunked", "--partition", "0", "--offset", "0",
                    "--max-messages", "5")
        assert r.stdout.split() == [f"old{i}" for i in range(5)]
    finally:
        cluster.start_node(3)


# ---------------------------------------------------------------- bad input, every script
def fail_together(cases: list[tuple[str, str | None, list[str], str, str | None]]) -> None:
    """(script, bootstrap, args, needle, stdin) cases: each must exit 1 with one line on stderr
    holding the needle."""
    for script, bs, args, needle, stdin in cases:
        fails(script, bs, *args, needle=needle, stdin=stdin)


def test_bad_input(cluster: Cluster, bs: str, tmp_path: Path) -> None:
    create_topic(cluster, "bad", "--partitions", "1", "--replication-factor", "1")
    [dead] = free_ports(1)
    nowhere = f"127.0.0.1:{dead}"
    records = tmp_path / "records.json"
    records.write_text(json.dumps({"partitions": [{"topic": "bad", "partition": 0, "offset": 1}]}))
    plan, bad_plan = tmp_path / "plan.csv", tmp_path / "bad.csv"
    plan.write_text("bad,0,1\n")
    bad_plan.write_text("bad;0;1\n")
    reset = ["--reset-offsets", "--group", "g", "--dry-run", "--from-file"]
    fail_together([
        (DELETE_RECORDS, nowhere, ["--offset-json-file", str(records)], "cannot connect", None),
        (GROUPS, nowhere, [*reset, str(plan)], "cannot connect", None),
        # a bad file is refused before connecting
        (GROUPS, nowhere, [*reset, str(bad_plan)], "line 1: 'bad;0;1' is not topic,partition,offset", None),
    ])
    fail_together([
        (PRODUCER, nowhere, ["--topic", "cp"], "cannot connect", "x\n"),
        (CONSUMER, nowhere, ["--topic", "cp"], "cannot connect", None),
        (GROUPS, nowhere, ["--list"], "cannot connect", None),
        (OFFSETS, nowhere, [], "cannot connect", None),
        (ELECTION, nowhere, ["--election-type", "preferred", "--all-topic-partitions"], "cannot connect", None),
        (API_VERSIONS, nowhere, [], "cannot connect", None),
        (DELETE_RECORDS, bs, ["--offset-json-file", "/nonexistent.json"], "cannot read /nonexistent.json", None),
    ])
    fail_together([  # unknown topics and groups, lines the producer cannot parse
        (PRODUCER, bs, ["--topic", "nope"], "topic 'nope' does not exist", "x\n"),
        (CONSUMER, bs, ["--topic", "nope"], "topic 'nope' does not exist", None),
        (CONSUMER, bs, ["--include", "nope.*"], "no topic matches", None),
        (OFFSETS, bs, ["--topic", "nope"], "Could not match any topic-partitions", None),
        (GROUPS, bs, ["--describe", "--group", "nope"], "Consumer group 'nope' does not exist.", None),
        (GROUPS, bs, ["--delete-offsets", "--group", "nope", "--topic", "nope"], "does not exist", None),
        (PRODUCER, bs, ["--topic", "bad", "--property", "parse.key=true"],
         "No key separator found on line number 1: 'no separator'", "no separator\n"),
        (PRODUCER, bs, ["--topic", "bad", "--property", "parse.headers=true"],
         "No header key separator found in pair 'h1' on line number 1", "h1\tv\n"),
    ])


@pytest.mark.parametrize(("module", "args", "needle"), [
    (kafka_consumer_groups, ["--describe"], "takes one of these options"),
    (kafka_consumer_groups, ["--list", "--describe"], "exactly one action"),
    (kafka_consumer_groups, ["--reset-offsets", "--group", "g", "--topic", "t"],
     "requires one of the following scenarios"),
    (kafka_consumer_groups, ["--reset-offsets", "--group", "g", "--to-earliest"], "One of the reset scopes"),
    (kafka_consumer_groups, ["--reset-offsets", "--group", "g", "--all-topics", "--to-earliest", "--dry-run",
                             "--execute"], "only accepts one of"),
    (kafka_consumer_groups, ["--reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "yesterday"],
     "Error parsing timestamp"),
    (kafka_consumer_groups, ["--describe", "--group", "g", "--timeout", "0"], "out of range"),
    (kafka_console_consumer, ["--topic", "t", "--offset", "5"], "The partition is required when offset is specified."),
    (kafka_console_consumer, ["--topic", "t", "--partition", "0", "--group", "g"], "group and partition cannot"),
    (kafka_console_consumer, ["--partition", "0", "--include", "t"], "The topic is required when partition is"),
    (kafka_console_consumer, ["--topic", "t", "--partition", "0", "--offset", "-3"], "The provided offset value"),
    (kafka_console_consumer, [], "Exactly one of --include/--topic is required."),
    (kafka_console_consumer, ["--include", "("], "is not a valid regular expression"),
    (kafka_get_offsets, ["--time", "yesterday"], "Malformed time argument"),
    (kafka_get_offsets, ["--partitions", "a"], "--partitions expects a comma separated list"),
    (kafka_get_offsets, ["--topic-partitions", "a:b:c"], "Invalid rule specification"),
    (kafka_get_offsets, ["--topic-partitions", "a", "--topic", "a"], "cannot be used with"),
    (kafka_leader_election, ["--election-type", "preferred"], "One and only one of the following options"),
    (kafka_leader_election, ["--election-type", "preferred", "--topic", "t"], "Missing required option(s): --partition"),
    (kafka_leader_election, ["--election-type", "other", "--all-topic-partitions"], "invalid choice"),
    (kafka_delete_records, [], "required"),
    (kafka_console_producer, ["--topic", "t", "--batch-size", "0"], "out of range"),
    (kafka_broker_api_versions, ["--bootstrap-server", "localhost:99999"], "port 99999 is out of range"),
])
def test_bad_arguments(module, args: list[str], needle: str, capsys: pytest.CaptureFixture) -> None:
    """A bad argument: one line on stderr, exit 2, nothing sent (no cluster needed)."""
    argv = args if "--bootstrap-server" in args else ["--bootstrap-server", "127.0.0.1:9", *args]
    with pytest.raises(SystemExit) as e:
        module.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and needle in err, err


def test_scripts_exit_2_on_bad_arguments(bs: str) -> None:
    """The same rule through the installed scripts."""
    fails(CONSUMER, bs, "--topic", "t", "--offset", "5", code=2, needle="The partition is required", real=True)
    fails(GROUPS, bs, code=2, needle="exactly one action", real=True)
    [dead] = free_ports(1)
    fails(API_VERSIONS, f"127.0.0.1:{dead}", needle="cannot connect", real=True)
