"""`docker compose up`, for real: the image built, the 6-node cluster run, checked from the host.

Runs the quickstart's compose block (docs/quickstart.md) line by line (and checks the block is what this file runs),
with checks between the lines: every node up, a topic with RF 3, records produced with acks=all
and all read back through the published ports after a new chunk, after one broker's stop and
start, and after `down` and `up` (the named volumes keep the data). Not in `make test` (it takes
minutes): `make compose-test`, a step of its own in .ci/run. Skips, with the reason, where no
docker engine can be had (tools/docker_base.py installs Debian's packages and starts dockerd as
root); a host port 9092-9094 already taken fails it, naming the port.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.conftest import wait_for, wait_for_kafka
from tests.doc_blocks import run_line, sh_block
from tools.cluster import port_in_use
from tools.docker_base import Dockerd, DockerUnavailable, compose_command, ensure_packages

pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parent.parent
PROJECT = "strata-compose-test"  # its own containers, network and volumes, beside a user's
BOOTSTRAP = "127.0.0.1:9092"
BROKERS = {1: 9092, 2: 9093, 3: 9094}
TOPIC = "orders"
NODES = ("controller", "controller-101", "controller-102", "broker-1", "broker-2", "broker-3")
MARKER = "<!-- tests/test_compose.py runs this block, line by line -->"
# The quickstart's block, in order; run() below pairs each with its check.
STEPS = [
    "export STRATA_BASE_IMAGE=$(python -m tools.docker_base)",
    "docker compose up -d --build",
    f"kafka-topics.sh --bootstrap-server {BOOTSTRAP} --create --topic {TOPIC} --partitions 3 --replication-factor 3",
    f"kafka-chunks.sh create --bootstrap-server {BOOTSTRAP} --create-chunk-json-file "
    f"""<(echo '{{"partitions": [{{"topic": "{TOPIC}", "partition": 0, "replicas": [2, 3, 1]}}]}}')""",
    f"kafka-log-dirs.sh --describe --bootstrap-server {BOOTSTRAP} --topic-list {TOPIC}",
    f"docker compose exec -T broker-1 kafka-console-consumer.sh --bootstrap-server broker-2:29092 --topic {TOPIC} "
    "--from-beginning --max-messages 600 --timeout-ms 30000",
    "docker compose stop broker-2",
    "docker compose start broker-2",
    "docker compose down",
    "docker compose up -d",
    "docker compose --profile metrics up -d --build",
    "docker compose --profile metrics down --volumes",
]


def quickstart_block() -> list[str]:
    return sh_block(ROOT / "docs" / "quickstart.md", MARKER)


class Shell:
    """Runs the block's lines in bash from the repo root with the venv's bin/ first on PATH, carrying
    the environment a line exports to the next ones; `docker compose` becomes the Compose here."""

    def __init__(self, compose: list[str], env_file: Path) -> None:
        self.compose = " ".join(compose)
        self.env_file = env_file
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                    "COMPOSE_PROJECT_NAME": PROJECT}

    def __call__(self, line: str, timeout: float = 900) -> str:
        cmd = line.replace("docker compose", self.compose, 1) if line.startswith("docker compose") else line
        out, self.env = run_line(cmd, line, cwd=ROOT, env=self.env, env_file=self.env_file, timeout=timeout)
        return out


@pytest.fixture(scope="module")
def shell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shell]:
    tmp = tmp_path_factory.mktemp("compose")
    try:
        ensure_packages()
        compose = compose_command()
    except DockerUnavailable as e:
        pytest.skip(f"no docker here: {e}")
    dockerd = Dockerd(tmp)
    try:
        dockerd.start()
    except DockerUnavailable as e:
        pytest.skip(f"no docker engine here: {e}")
    sh = Shell(compose, tmp / "env")
    try:
        sh(STEPS[-1])  # down --volumes: what an interrupted run may have left
        taken = [p for p in BROKERS.values() if port_in_use("127.0.0.1", p)]
        assert not taken, f"host ports {taken} are taken (a `make run` cluster?): the compose brokers publish them"
        yield sh
    finally:
        try:
            sh(STEPS[-1])
        finally:
            dockerd.stop()


def admin() -> AdminClient:
    return AdminClient({"bootstrap.servers": BOOTSTRAP})


def wait_ready(isr: int | None = None, timeout: float = 120) -> None:
    """Every broker registered (seen through the published ports); with `isr`, every partition of
    the topic with that many in-sync replicas."""

    def ready() -> bool:
        md = admin().list_topics(timeout=5)
        assert sorted(md.brokers) == [1, 2, 3], f"brokers {sorted(md.brokers)}"
        assert {(b.host, b.port) for b in md.brokers.values()} == {("127.0.0.1", p) for p in BROKERS.values()}
        if isr is not None:
            parts = md.topics[TOPIC].partitions
            assert len(parts) == 3 and all(len(p.isrs) == isr and p.leader >= 0 for p in parts.values()), \
                {i: (p.leader, p.isrs) for i, p in parts.items()}
        return True

    wait_for_kafka(ready, timeout, "the compose cluster through the published ports")


def produce(tag: str, n: int = 300) -> set[tuple[int, int, bytes]]:
    """n records (acks=all, idempotent) over the 3 partitions; the acknowledged (partition,
    offset, value) triples."""
    acked: set[tuple[int, int, bytes]] = set()
    errors: list[str] = []

    def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
        if err is None:
            acked.add((msg.partition(), msg.offset(), msg.value()))
        else:
            errors.append(str(err))

    p = Producer({"bootstrap.servers": BOOTSTRAP, "acks": "all", "enable.idempotence": True,
                  "message.timeout.ms": 60000})
    for i in range(n):
        p.produce(TOPIC, value=f"{tag}-{i}".encode(), partition=i % 3, on_delivery=on_delivery)
        p.poll(0)
    assert p.flush(90) == 0
    assert not errors and len(acked) == n, (errors[:3], len(acked))
    return acked


def read_all() -> set[tuple[int, int, bytes]]:
    """Every record of the topic, from offset 0 to each partition's high watermark."""
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": f"compose-{uuid.uuid4().hex}",
                  "enable.auto.commit": False})
    try:
        ends = {}
        for part in range(3):
            low, high = c.get_watermark_offsets(TopicPartition(TOPIC, part), timeout=10)
            assert low == 0, (part, low)
            ends[part] = high
        c.assign([TopicPartition(TOPIC, part, 0) for part in range(3)])
        got: set[tuple[int, int, bytes]] = set()
        pos = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + 60
        while any(pos[k] < ends[k] for k in ends) and time.monotonic() < deadline:
            for msg in c.consume(500, 1.0):
                if msg.error():
                    raise KafkaException(msg.error())
                where, offset, value = msg.partition(), msg.offset(), msg.value()
                assert where is not None and offset is not None and value is not None
                got.add((where, offset, value))
                pos[where] = offset + 1
        assert all(pos[k] >= ends[k] for k in ends), (pos, ends)
        return got
    finally:
        c.close()


def assert_all_read(acked: set[tuple[int, int, bytes]]) -> None:
    got = wait_for_kafka(read_all, 60, "a full read of the topic")
    missing = acked - got
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:3]}"


def prometheus_targets_up() -> set[str] | None:
    """The targets Prometheus scrapes (its API through the published 127.0.0.1:9090), once all
    of them answered their last scrape."""
    with urllib.request.urlopen("http://127.0.0.1:9090/api/v1/targets", timeout=5) as r:
        active = json.load(r)["data"]["activeTargets"]
    assert len(active) == len(NODES) and all(t["health"] == "up" for t in active), \
        [(t["labels"]["instance"], t["health"], t.get("lastError")) for t in active]
    return {t["labels"]["instance"] for t in active}


def test_quickstart_block_is_what_this_test_runs() -> None:
    assert quickstart_block() == STEPS


def test_compose_cluster(shell: Shell) -> None:
    assert quickstart_block() == STEPS
    steps = iter(STEPS)
    started = time.monotonic()

    base = shell(next(steps))  # the base image: the registry's, or built from Debian's archive
    assert base == ""  # the export prints nothing; the chosen base is in the environment
    assert shell.env["STRATA_BASE_IMAGE"] in ("python:3.11-slim", "strata-base:bookworm")

    shell(next(steps))  # up -d --build
    wait_ready()

    shell(next(steps))  # kafka-topics.sh --create, RF 3
    wait_ready(isr=3)
    acked = produce("before-chunk")
    assert_all_read(acked)

    out = shell(next(steps))  # kafka-chunks.sh create: partition 0's next chunk led by broker 2
    assert f"Created a new chunk of {TOPIC}-0 on brokers 2,3,1" in out, out

    def led_by_2() -> bool:
        return admin().list_topics(TOPIC, timeout=5).topics[TOPIC].partitions[0].leader == 2

    wait_for_kafka(led_by_2, 60, "broker 2 leading the new chunk")
    acked |= produce("after-chunk")
    assert_all_read(acked)  # the closed chunk read from its replicas, through their published ports

    out = shell(next(steps))  # kafka-log-dirs.sh --describe
    dirs = json.loads(out.strip().splitlines()[-1])["log_dirs"]
    by_broker: dict[int, list[dict]] = {}
    for d in dirs:
        by_broker.setdefault(d["broker"], []).append(d)
    assert sorted(by_broker) == [1, 2, 3]
    for broker, ds in by_broker.items():
        assert sorted(d["path"] for d in ds) == ["/var/lib/strata/logs-0", "/var/lib/strata/logs-1"], ds
        assert all(d["is_live"] for d in ds)
        held = {(p["partition"], p["chunk_start_offset"]) for d in ds for p in d["partitions"] if p["topic"] == TOPIC}
        assert {part for part, _ in held} == {0, 1, 2}, (broker, held)
        assert sum(p["size"] for d in ds for p in d["partitions"]) > 0, (broker, ds)
    # partition 0's closed chunk and its new one (starting at the records before it)
    starts = {p["chunk_start_offset"] for d in dirs for p in d["partitions"] if p["partition"] == 0}
    assert len(starts) == 2 and 0 in starts, starts

    # inside the compose network: a client in broker-1's container, bootstrapped from broker-2's
    # PLAINTEXT listener, is sent the service names (broker-N:29092) and reads every record
    out = shell(next(steps))
    assert sorted(out.split()) == sorted(value.decode() for _, _, value in acked), out[-500:]

    shell(next(steps))  # stop broker-2 (SIGTERM: it deregisters, the ISRs shrink)

    def broker_2_gone() -> bool:
        md = admin().list_topics(TOPIC, timeout=5)
        return sorted(md.brokers) == [1, 3] and all(2 not in p.isrs for p in md.topics[TOPIC].partitions.values())

    wait_for_kafka(broker_2_gone, 60, "broker 2 out of the cluster and the ISRs")
    acked |= produce("broker-2-down")
    shell(next(steps))  # start broker-2: the same container and volumes
    wait_ready(isr=3, timeout=180)
    acked |= produce("broker-2-back")
    assert_all_read(acked)

    shell(next(steps))  # down: the containers and the network go, the named volumes stay
    shell(next(steps))  # up -d: new containers on the same volumes
    wait_ready(isr=3, timeout=180)
    assert_all_read(acked)
    acked |= produce("after-down-up")
    assert_all_read(acked)

    shell(next(steps))  # the metrics profile: Prometheus (Debian's package) scraping all six nodes
    targets = wait_for(prometheus_targets_up, 120, "Prometheus scraping every node")
    assert targets == {f"{name}:9404" for name in NODES}, targets

    shell(next(steps))  # down --volumes, the profile's container with the others
    assert next(steps, None) is None
    print(f"compose run: {time.monotonic() - started:.0f} s", flush=True)
