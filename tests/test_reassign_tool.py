"""kafka-reassign-partitions.sh (tools/kafka_reassign_partitions.py), run as the script pip installs.

First the checks that need no cluster (files, arguments, the placement and throttle arithmetic),
then against a real 4-broker cluster: --generate, --execute with --throttle, --verify until done
(and the throttles gone), the data read back from the new replicas alone, --list, --cancel, and
bad input refused with one line and nothing changed.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import eventually, installed_script, wait_for
from tools.admin import Admin
from tools.cluster import Cluster, free_ports
from tools.kafka_reassign_partitions import (
    Move,
    assign_replicas,
    format_reassignment_json,
    proposed_moves,
    rack_alternated,
    throttled_replicas,
)

LEADER_RATE = "leader.replication.throttled.rate"
FOLLOWER_RATE = "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
LOG_DIRS_RATE = "replica.alter.log.dirs.io.max.bytes.per.second"


SCRIPT = installed_script("kafka-reassign-partitions.sh")


def run(bootstrap: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SCRIPT, "--bootstrap-server", bootstrap, *args], capture_output=True, text=True, timeout=timeout
    )


def ok(bootstrap: str, *args: str) -> str:
    r = run(bootstrap, *args)
    assert r.returncode == 0, f"kafka-reassign-partitions.sh {' '.join(args)} exited {r.returncode}: {r.stderr}"
    assert r.stderr == ""
    return r.stdout


def fails(bootstrap: str, *args: str, code: int = 1) -> str:
    """A command that must fail: exit 1 with exactly one `Error: ` line on stderr (or exit 2 from
    argparse, whose usage text comes before its one error line)."""
    r = run(bootstrap, *args)
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    if code == 1:
        assert len(lines) == 1, f"expected one error line, got: {r.stderr!r}"
        assert lines[0].startswith("Error: "), lines[0]
    else:
        assert lines and "error:" in lines[-1], r.stderr
    return lines[-1]


def write(tmp_path: Path, name: str, content: Any) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def reassignment(*parts: tuple[str, int, list[int]]) -> dict:
    return {"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": r} for t, p, r in parts]}



# ================================================================ no cluster needed
@pytest.fixture(scope="module")
def nowhere() -> str:
    """A bootstrap address nobody listens on: file checks must fail before any connection."""
    return f"127.0.0.1:{free_ports(1)[0]}"


@pytest.mark.parametrize("action", ["--execute", "--verify", "--cancel"])
def test_bad_reassignment_files_fail_with_one_line(tmp_path: Path, nowhere: str, action: str) -> None:
    cases = {
        "missing": (None, "cannot read"),
        "malformed": ('{"version":1,"partitions":[{"topic":"t",', "is not valid JSON"),
        "not-an-object": ("[1, 2]", "must hold a JSON object"),
        "version-2": ({"version": 2, "partitions": []}, '"version" 2'),
        "version-string": ({"version": "1", "partitions": []}, '"version" "1"'),
        "dup-replicas": (reassignment(("orders", 0, [1, 2, 2])), "orders-0 contains multiple entries for 2"),
        "empty-replicas": (reassignment(("orders", 3, [])), "orders-3 cannot be empty"),
        "dup-partitions": (
            reassignment(("orders", 0, [1]), ("orders", 0, [2])),
            "duplicate topic partitions: orders-0",
        ),
        "no-topic": ({"version": 1, "partitions": [{"partition": 0, "replicas": [1]}]}, '"topic"'),
        "bad-partition": (
            {"version": 1, "partitions": [{"topic": "t", "partition": "0", "replicas": [1]}]},
            '"partition"',
        ),
        "bad-replicas": (reassignment(("orders", 1, ["1", 2])), "orders-1"),
        "log-dirs-size": (
            {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2], "log_dirs": ["any"]}]},
            "size of log dirs list",
        ),
        "log-dir-path": (  # "any" or an absolute path (KIP-113)
            {"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1], "log_dirs": ["data/a"]}]},
            '"data/a" must be "any" or an absolute path',
        ),
    }
    for name, (content, expected) in cases.items():
        path = str(tmp_path / f"{name}.json") if content is None else write(tmp_path, f"{name}.json", content)
        line = fails(nowhere, action, "--reassignment-json-file", path)
        assert expected in line, (name, line)
        assert "cannot connect" not in line, (name, line)


def test_execute_needs_at_least_one_partition(tmp_path: Path, nowhere: str) -> None:
    path = write(tmp_path, "empty.json", {"version": 1, "partitions": []})
    assert "cannot be empty" in fails(nowhere, "--execute", "--reassignment-json-file", path)


def test_bad_topics_files_fail_with_one_line(tmp_path: Path, nowhere: str) -> None:
    cases = {
        "malformed": ("{", "is not valid JSON"),
        "version": ({"version": 3, "topics": [{"topic": "a"}]}, '"version" 3'),
        "empty": ({"version": 1, "topics": []}, "lists no topics"),
        "dup": ({"version": 1, "topics": [{"topic": "a"}, {"topic": "a"}]}, "duplicate entries: a"),
        "shape": ({"version": 1, "topics": ["a"]}, "topics[0]"),
    }
    for name, (content, expected) in cases.items():
        path = write(tmp_path, f"{name}.json", content)
        line = fails(nowhere, "--generate", "--topics-to-move-json-file", path, "--broker-list", "1,2")
        assert expected in line, (name, line)


def test_bad_arguments_exit_2(tmp_path: Path, nowhere: str) -> None:
    f = write(tmp_path, "r.json", reassignment(("t", 0, [1])))
    fails(nowhere, code=2)  # no action
    fails(nowhere, "--execute", "--verify", "--reassignment-json-file", f, code=2)
    fails(nowhere, "--execute", code=2)
    fails(nowhere, "--generate", "--topics-to-move-json-file", f, code=2)  # no --broker-list
    fails(nowhere, "--generate", "--topics-to-move-json-file", f, "--broker-list", "1,x", code=2)
    fails(nowhere, "--generate", "--topics-to-move-json-file", f, "--broker-list", "1,2,1", code=2)
    fails(nowhere, "--verify", "--reassignment-json-file", f, "--throttle", "100", code=2)
    fails(nowhere, "--list", "--reassignment-json-file", f, code=2)
    fails(nowhere, "--execute", "--reassignment-json-file", f, "--throttle", "fast", code=2)
    fails("no-port", "--list", code=2)
    r = subprocess.run([SCRIPT, "--list"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--bootstrap-server" in r.stderr


def test_reassignment_json_is_kafkas_format() -> None:
    out = format_reassignment_json({("b", 1): [3, 1], ("a", 10): [2], ("a", 2): [1, 2]})
    assert out == (
        '{"version":1,"partitions":['
        '{"topic":"a","partition":2,"replicas":[1,2],"log_dirs":["any","any"]},'
        '{"topic":"a","partition":10,"replicas":[2],"log_dirs":["any"]},'
        '{"topic":"b","partition":1,"replicas":[3,1],"log_dirs":["any","any"]}]}'
    )


def test_round_robin_placement_spreads_leaders_and_replicas() -> None:
    brokers = {1: None, 2: None, 3: None, 4: None}
    got = assign_replicas(brokers, 8, 3, start=0, shift=0)
    assert got[0] == [1, 2, 3] and got[1] == [2, 3, 4] and got[3] == [4, 1, 2]
    assert got[4] == [1, 3, 4]  # a full round later the followers shift
    for replicas in got.values():
        assert len(set(replicas)) == 3
    assert Counter(r[0] for r in got.values()) == {1: 2, 2: 2, 3: 2, 4: 2}
    assert Counter(b for r in got.values() for b in r) == {1: 6, 2: 6, 3: 6, 4: 6}
    # random start: still a valid and even layout
    for _ in range(20):
        got = assign_replicas({5: None, 9: None}, 4, 2)
        assert all(sorted(r) == [5, 9] for r in got.values())
        assert Counter(r[0] for r in got.values()) == {5: 2, 9: 2}


def test_rack_aware_placement_uses_every_rack() -> None:
    racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: "c", 6: "c"}
    assert rack_alternated(racks) == [1, 3, 5, 2, 4, 6]
    for start in range(6):
        for shift in range(6):
            got = assign_replicas(racks, 12, 3, start=start, shift=shift)
            for replicas in got.values():
                assert len(set(replicas)) == 3
                assert {racks[b] for b in replicas} == {"a", "b", "c"}, replicas
    with pytest.raises(Exception, match="rack"):
        assign_replicas({1: "a", 2: None}, 1, 1)
    with pytest.raises(Exception, match="replication factor"):
        assign_replicas({1: None, 2: None}, 1, 3)


def test_throttled_replicas_are_the_sources_and_the_destinations() -> None:
    current = {("t", 0): [1, 2], ("t", 1): [2, 3]}
    proposed = {("t", 0): [3, 4], ("t", 1): [2, 4]}
    ongoing = {("u", 5): SimpleNamespace(replicas=[4, 1, 2], adding_replicas=[4], removing_replicas=[2])}
    moves = proposed_moves(ongoing, proposed, current)
    assert moves[("t", 0)].sources == {1, 2} and moves[("t", 0)].destinations == {3, 4}
    assert moves[("t", 1)].sources == {2, 3} and moves[("t", 1)].destinations == {4}
    assert moves[("u", 5)].sources == {1, 2} and moves[("u", 5)].destinations == {4}
    leader, follower = throttled_replicas(moves)
    assert leader == {"t": "0:1,0:2,1:2,1:3", "u": "5:1,5:2"}
    assert follower == {"t": "0:3,0:4,1:4", "u": "5:4"}
    assert throttled_replicas({("x", 0): Move([1, 2], [1, 2])}) == ({"x": "0:1,0:2"}, {"x": ""})


# ================================================================ against a real cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # One 4-broker cluster for the module; each test uses its own topics and leaves no
    # reassignment running.
    c = Cluster(tmp_path_factory.mktemp("reassign"), brokers=4)
    try:
        c.start()
        yield c
    finally:
        c.stop()


@pytest.fixture
def bs(cluster: Cluster) -> str:
    return cluster.bootstrap


def admin(bs: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bs})


def create_topic(bs: str, name: str, assignment: list[list[int]]) -> None:
    async def create() -> None:
        async with Admin(bs) as a:
            [r] = await a.create_topics([(name, -1, -1, dict(enumerate(assignment)), None)])
            assert r.error_code == 0, (r.error_code, r.error_message)

    asyncio.run(create())
    eventually(lambda: replicas_of(bs, name) == {p: r for p, r in enumerate(assignment)})


def replicas_of(bs: str, topic: str) -> dict[int, list[int]]:
    a = admin(bs)
    md = a.list_topics(topic, timeout=10).topics[topic]
    assert md.error is None, md.error
    return {p: list(pm.replicas) for p, pm in md.partitions.items()}


def configs(bs: str, kind: str, name: str) -> dict[str, str]:
    from confluent_kafka.admin import ConfigResource, ResourceType

    res = ConfigResource(ResourceType.BROKER if kind == "broker" else ResourceType.TOPIC, name)
    a = admin(bs)  # the client must outlive the future
    entries = a.describe_configs([res])[res].result(30)
    return {k: e.value for k, e in entries.items()}


def produce(bs: str, topic: str, values: list[bytes], partition: int = 0, batch_size: int = 1000000) -> None:
    from confluent_kafka import Producer

    # a follower fetches at least one whole batch: small batches let a throttle show
    p = Producer({"bootstrap.servers": bs, "acks": "all", "linger.ms": 5, "message.timeout.ms": 60000,
                  "batch.size": batch_size})
    errors: list[Any] = []
    for v in values:
        while True:
            try:
                p.produce(topic, value=v, partition=partition, on_delivery=lambda e, m: e and errors.append(e))
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(90) == 0
    assert not errors, errors[:3]


def consume(bs: str, topic: str, n: int, partition: int = 0, timeout: float = 60) -> list[tuple[int, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": f"check-{topic}", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, 0)])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < n and time.monotonic() < deadline:
            for m in c.consume(10000, 0.5):
                if m.error() is None:
                    got.append((m.offset(), m.value()))
    finally:
        c.close()
    return got


def no_reassignments(bs: str) -> None:
    assert ok(bs, "--list") == "No partition reassignments found.\n"


def test_bad_input_changes_nothing(bs: str, tmp_path: Path) -> None:
    create_topic(bs, "orders", [[1, 2], [2, 3]])
    before = replicas_of(bs, "orders")
    bad = {
        "unknown-partition": (
            reassignment(("orders", 0, [3, 4]), ("orders", 7, [3, 4])),
            "partition orders-7 does not exist",
        ),
        "unknown-topic": (reassignment(("nosuch", 0, [3, 4])), "topic 'nosuch' does not exist"),
        "unknown-broker": (reassignment(("orders", 0, [3, 9])), "unknown broker id 9"),
        "dup-replicas": (reassignment(("orders", 1, [4, 4])), "orders-1 contains multiple entries for 4"),
    }
    for name, (content, expected) in bad.items():
        f = write(tmp_path, f"{name}.json", content)
        line = fails(bs, "--execute", "--reassignment-json-file", f, "--throttle", "1000000")
        assert expected in line, (name, line)
        if name.startswith("unknown-t") or name.startswith("unknown-p"):
            assert expected in fails(bs, "--verify", "--reassignment-json-file", f)
            assert expected in fails(bs, "--cancel", "--reassignment-json-file", f)
    no_reassignments(bs)
    assert replicas_of(bs, "orders") == before
    for b in (1, 2, 3, 4):
        cfg = configs(bs, "broker", str(b))
        assert LEADER_RATE not in cfg and FOLLOWER_RATE not in cfg, (b, cfg)
    cfg = configs(bs, "topic", "orders")
    assert not cfg.get(LEADER_REPLICAS) and not cfg.get(FOLLOWER_REPLICAS), cfg
    # --generate checks the cluster too
    topics = write(tmp_path, "topics.json", {"version": 1, "topics": [{"topic": "orders"}]})
    assert "unknown broker id 9" in fails(
        bs, "--generate", "--topics-to-move-json-file", topics, "--broker-list", "3,9"
    )
    missing = write(tmp_path, "missing.json", {"version": 1, "topics": [{"topic": "nosuch"}]})
    assert "topic 'nosuch' does not exist" in fails(
        bs, "--generate", "--topics-to-move-json-file", missing, "--broker-list", "3,4"
    )
    assert "replication factor" in fails(bs, "--generate", "--topics-to-move-json-file", topics, "--broker-list", "4")


def test_generate_prints_current_and_proposed(bs: str, tmp_path: Path) -> None:
    create_topic(bs, "gen", [[1, 2], [2, 3], [3, 4]])
    create_topic(bs, "gen2", [[4]])
    f = write(tmp_path, "topics.json", {"version": 1, "topics": [{"topic": "gen"}, {"topic": "gen2"}]})
    out = ok(bs, "--generate", "--topics-to-move-json-file", f, "--broker-list", "3,4")
    lines = out.splitlines()
    assert len(lines) == 5, out
    assert lines[0] == "Current partition replica assignment"
    assert lines[2] == ""
    assert lines[3] == "Proposed partition reassignment configuration"
    assert lines[1] == format_reassignment_json(
        {("gen", 0): [1, 2], ("gen", 1): [2, 3], ("gen", 2): [3, 4], ("gen2", 0): [4]}
    )
    proposed = json.loads(lines[4])
    assert proposed["version"] == 1
    parts = proposed["partitions"]
    assert [(p["topic"], p["partition"]) for p in parts] == [("gen", 0), ("gen", 1), ("gen", 2), ("gen2", 0)]
    for p in parts:
        assert list(p) == ["topic", "partition", "replicas", "log_dirs"]
        rf = 1 if p["topic"] == "gen2" else 2
        assert len(p["replicas"]) == rf and len(set(p["replicas"])) == rf and set(p["replicas"]) <= {3, 4}
        assert p["log_dirs"] == ["any"] * rf
    leaders = Counter(p["replicas"][0] for p in parts if p["topic"] == "gen")
    assert sorted(leaders.values()) == [1, 2]  # round-robin: the two brokers lead in turn
    # the proposal is a valid --execute file; generating changed nothing
    no_reassignments(bs)
    assert replicas_of(bs, "gen") == {0: [1, 2], 1: [2, 3], 2: [3, 4]}


@pytest.mark.slow
def test_cancel_in_progress_and_list(bs: str, tmp_path: Path) -> None:
    create_topic(bs, "slow", [[1, 2]])
    produce(bs, "slow", [b"%06d" % i + b"s" * 994 for i in range(4000)])  # ~4 MB
    f = write(tmp_path, "slow.json", reassignment(("slow", 0, [3, 4])))
    try:
        # 20 KB/s: the move would take minutes, so it is still running for everything below
        out = ok(bs, "--execute", "--reassignment-json-file", f, "--throttle", "20000")
        assert "Successfully started partition reassignment for slow-0" in out

        def listed() -> str:
            out = ok(bs, "--list")
            assert out.startswith("Current partition reassignments:\nslow-0: replicas: "), out
            return out

        line = eventually(listed).splitlines()[1]
        replicas = [int(x) for x in line.split("replicas: ")[1].split(".")[0].split(",")]
        assert sorted(replicas) == [1, 2, 3, 4], line
        assert "adding: 3,4." in line and "removing: 1,2." in line, line

        out = ok(bs, "--verify", "--reassignment-json-file", f)
        assert out.splitlines()[:2] == [
            "Status of partition reassignment:",
            "Reassignment of partition slow-0 is still in progress.",
        ]
        assert "Clearing" not in out  # throttles stay while it runs
        assert configs(bs, "topic", "slow").get(FOLLOWER_REPLICAS) == "0:3,0:4"

        # the throttle holds the moving replicas only: a partition from the same leader to the
        # same follower, outside the throttle, keeps replicating (acks=all waits for broker 3)
        create_topic(bs, "beside-slow", [[1, 3]])
        started = time.monotonic()
        produce(bs, "beside-slow", [b"beside"] * 100)
        assert time.monotonic() - started < 10, f"acks=all took {time.monotonic() - started:.1f}s beside a throttled move"

        # a second --execute needs --additional
        assert "--additional" in fails(bs, "--execute", "--reassignment-json-file", f)

        out = ok(bs, "--cancel", "--reassignment-json-file", f)
        assert "Successfully cancelled partition reassignment for: slow-0" in out
        assert "Clearing broker-level throttles on brokers 1,2,3,4" in out
        assert "Clearing topic-level throttles on topic slow" in out
    finally:
        run(bs, "--cancel", "--reassignment-json-file", f)
    eventually(lambda: no_reassignments(bs))
    eventually(lambda: replicas_of(bs, "slow") == {0: [1, 2]})
    assert ok(bs, "--cancel", "--reassignment-json-file", f).startswith(
        "None of the specified partition reassignments are active.\n"
    )
    cfg = configs(bs, "topic", "slow")
    assert not cfg.get(LEADER_REPLICAS) and not cfg.get(FOLLOWER_REPLICAS), cfg
    got = consume(bs, "slow", 4000)
    assert [o for o, _ in got] == list(range(4000))


@pytest.mark.slow
def test_execute_verify_moves_all_data(cluster: Cluster, bs: str, tmp_path: Path) -> None:
    n = 20000
    create_topic(bs, "moving", [[1, 2]])
    values = [b"moving-%08d-" % i + b"x" * 80 for i in range(n)]
    produce(bs, "moving", values)
    f = write(tmp_path, "move.json", reassignment(("moving", 0, [3, 4])))
    out = ok(bs, "--execute", "--reassignment-json-file", f, "--throttle", "50000000")
    lines = out.splitlines()
    assert lines[:3] == ["Current partition replica assignment", "", format_reassignment_json({("moving", 0): [1, 2]})]
    assert lines[4] == "Save this to use as the --reassignment-json-file option during rollback"
    assert "The inter-broker throttle limit was set to 50000000 B/s" in lines
    assert lines[-1] == "Successfully started partition reassignment for moving-0"

    # --throttle set the brokers' rates (every broker involved) and the topic's replica lists
    def throttles_set() -> None:
        for b in (1, 2, 3, 4):
            cfg = configs(bs, "broker", str(b))
            assert cfg.get(LEADER_RATE) == "50000000" and cfg.get(FOLLOWER_RATE) == "50000000", (b, cfg)
        cfg = configs(bs, "topic", "moving")
        assert cfg.get(LEADER_REPLICAS) == "0:1,0:2" and cfg.get(FOLLOWER_REPLICAS) == "0:3,0:4", cfg

    eventually(throttles_set)

    deadline = time.monotonic() + 60
    while True:
        out = ok(bs, "--verify", "--reassignment-json-file", f)  # exit 0 in progress or not
        if "Reassignment of partition moving-0 is completed." in out:
            break
        assert "Reassignment of partition moving-0 is still in progress." in out, out
        assert time.monotonic() < deadline, "the reassignment did not complete within 60 s"
        time.sleep(1)
    assert out.splitlines() == [
        "Status of partition reassignment:",
        "Reassignment of partition moving-0 is completed.",
        "Clearing broker-level throttles on brokers 1,2,3,4",
        "Clearing topic-level throttles on topic moving",
    ]

    def throttles_gone() -> None:
        for b in (1, 2, 3, 4):
            cfg = configs(bs, "broker", str(b))
            assert LEADER_RATE not in cfg and FOLLOWER_RATE not in cfg, (b, cfg)
        cfg = configs(bs, "topic", "moving")
        assert not cfg.get(LEADER_REPLICAS) and not cfg.get(FOLLOWER_REPLICAS), cfg

    eventually(throttles_gone)
    assert replicas_of(bs, "moving") == {0: [3, 4]}
    no_reassignments(bs)

    # every message is on the new replicas: read it back with the old ones stopped
    new_only = ",".join(f"{cluster.host}:{cluster.broker_port(b)}" for b in (3, 4))
    try:
        cluster.terminate(1)
        cluster.terminate(2)
        got = consume(new_only, "moving", n)
        assert len(got) == n, f"read {len(got)} of {n} messages from brokers 3 and 4"
        assert [o for o, _ in got] == list(range(n))
        assert [v for _, v in got] == values
    finally:
        for b in (1, 2):
            if not cluster.is_running(b):
                cluster.start_node(b)


def alter_broker_config(bs: str, broker: str, key: str, value: str | None) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    res = ConfigResource(ResourceType.BROKER, broker,
                         incremental_configs=[ConfigEntry(key, value, incremental_operation=op)])
    a = admin(bs)  # the client must outlive the futures
    for f in a.incremental_alter_configs([res]).values():
        f.result(30)


PROGRESS = re.compile(r"Progress of (.+): (\d+) / (\d+) bytes copied \((\d+)%\), (ETA unknown|ETA 0s|[\d.]+ MB/s, ETA \w+)$")


def progress_lines(out: str, name: str) -> list[tuple[int, int]]:
    """(copied, total) of each progress line about `name`; every progress line has the format."""
    got = []
    for line in out.splitlines():
        if line.startswith("Progress of "):
            m = PROGRESS.fullmatch(line)
            assert m, line
            if m.group(1) == name:
                got.append((int(m.group(2)), int(m.group(3))))
    return got


def test_verify_wait_shows_progress_and_times_out_with_one_line(bs: str, tmp_path: Path) -> None:
    """A throttled reassignment takes a few seconds: --verify --wait prints bytes copied / total and
    an ETA for each new replica until it completes (exit 0); with a --timeout too short it stops
    with one line and exit 1, leaving the reassignment running."""
    create_topic(bs, "waiting", [[1, 2]])
    produce(bs, "waiting", [b"%06d" % i + b"w" * 994 for i in range(800)], batch_size=16384)  # ~800 KB
    f = write(tmp_path, "wait.json", reassignment(("waiting", 0, [3, 4])))
    try:
        ok(bs, "--execute", "--reassignment-json-file", f, "--throttle", "100000")  # ~7 s (after a 1 s burst)
        r = run(bs, "--verify", "--wait", "--timeout", "1200", "--reassignment-json-file", f)
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert r.stderr.splitlines() == [
            "Error: timed out after 1200 ms waiting for the reassignment to complete; still in progress: waiting-0 "
            "(REQUEST_TIMED_OUT)"
        ], r.stderr
        assert progress_lines(r.stdout, "partition waiting-0 to broker 3"), r.stdout
        assert "Status of partition reassignment:" not in r.stdout

        out = ok(bs, "--verify", "--wait", "--reassignment-json-file", f)
        for b in (3, 4):
            seen = progress_lines(out, f"partition waiting-0 to broker {b}")
            assert seen, out
            assert [c for c, _ in seen] == sorted(c for c, _ in seen), seen  # bytes only grow
            assert all(0 <= c <= t and t >= 800_000 for c, t in seen), seen
        assert re.search(r"MB/s, ETA \d", out), out  # a rate seen, an ETA given
        assert out.splitlines()[-4:] == [
            "Status of partition reassignment:",
            "Reassignment of partition waiting-0 is completed.",
            "Clearing broker-level throttles on brokers 1,2,3,4",
            "Clearing topic-level throttles on topic waiting",
        ]
    finally:
        run(bs, "--cancel", "--reassignment-json-file", f)
    no_reassignments(bs)
    assert replicas_of(bs, "waiting") == {0: [3, 4]}
    # once done, --wait returns at once with the status
    assert ok(bs, "--verify", "--wait", "--reassignment-json-file", f).startswith("Status of partition reassignment:")


def test_log_dirs_throttle_holds_a_dir_move_until_verify_clears_it(cluster: Cluster, bs: str, tmp_path: Path) -> None:
    """--execute --replica-alter-log-dirs-throttle sets replica.alter.log.dirs.io.max.bytes.per.second
    on the broker moving a replica between its log dirs (only there), and the move keeps to it:
    ~5 MB at 1 MB/s take about 5 s (unthrottled, a fraction of one). While it runs --verify leaves
    the throttle alone; --verify --wait prints its progress until the replica is in the file's
    dir, then removes the throttle."""
    create_topic(bs, "dirmove", [[1]])
    produce(bs, "dirmove", [b"%06d" % i + b"d" * 994 for i in range(5000)])  # ~5 MB
    dirs = sorted(str(p) for p in cluster.node_dir(1).glob("logs-*"))
    [src] = [d for d in dirs if (Path(d) / "dirmove-0-0").is_dir()]
    [dest] = [d for d in dirs if d != src]
    plan = {"version": 1, "partitions": [{"topic": "dirmove", "partition": 0, "replicas": [1], "log_dirs": [dest]}]}
    f = write(tmp_path, "dirs.json", plan)
    try:
        out = ok(bs, "--execute", "--reassignment-json-file", f, "--replica-alter-log-dirs-throttle", "1000000")
        sent = time.monotonic()  # the move started before this
        lines = out.splitlines()
        assert "The replica-alter-dir throttle limit was set to 1000000 B/s" in lines, out
        assert lines[-1] == "Successfully started log directory move for: dirmove-0-1", out
        eventually(lambda: configs(bs, "broker", "1").get(LOG_DIRS_RATE) == "1000000")
        assert LOG_DIRS_RATE not in configs(bs, "broker", "2")  # no move there
        out = ok(bs, "--verify", "--reassignment-json-file", f)
        assert "Reassignment of replica dirmove-0-1 is still in progress: " in out, out
        assert "Clearing" not in out, out
        assert configs(bs, "broker", "1").get(LOG_DIRS_RATE) == "1000000"
        waiting = subprocess.Popen([SCRIPT, "--bootstrap-server", bs, "--verify", "--wait", "--reassignment-json-file", f],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: (Path(dest) / "dirmove-0-0").is_dir(), 30, "the move to finish", interval=0.05)
            took = time.monotonic() - sent
            out, err = waiting.communicate(timeout=60)
        finally:
            waiting.kill()
        assert waiting.returncode == 0 and err == "", (out, err)
        assert took >= 3.5, f"a 5 MB move at 1 MB/s took {took:.1f} s"
        seen = progress_lines(out, f"replica dirmove-0-1 to {dest}")
        assert seen and all(0 < c <= t for c, t in seen), out
        assert out.splitlines()[-4:] == [
            "Status of log directory reassignment:",
            "Reassignment of replica dirmove-0-1 is completed.",
            "Clearing broker-level throttles on brokers 1,2,3,4",
            "Clearing topic-level throttles on topic dirmove",
        ], out
        eventually(lambda: LOG_DIRS_RATE not in configs(bs, "broker", "1"))
    finally:
        alter_broker_config(bs, "1", LOG_DIRS_RATE, None)
    assert len(consume(bs, "dirmove", 5000)) == 5000


def test_wait_is_a_verify_option(tmp_path: Path, nowhere: str) -> None:
    f = write(tmp_path, "f.json", reassignment(("t", 0, [1])))
    assert "--wait" in fails(nowhere, "--execute", "--wait", "--reassignment-json-file", f, code=2)
    assert "--timeout" in fails(nowhere, "--verify", "--timeout", "10", "--reassignment-json-file", f, code=2)
    assert "cannot connect to" in fails(nowhere, "--verify", "--wait", "--reassignment-json-file", f)
