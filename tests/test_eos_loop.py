"""Exactly once with a real client: a confluent-kafka consume-transform-produce loop over 100,000
input messages (4 partitions, RF 3) with the transaction coordinator's broker kill -9ed mid-run
(inside an open transaction, records and offsets sent) and restarted. The loop is an application
process of its own (tests/eos_app.py). The output, read with read_committed, holds every input
exactly once.

The same loop with a producer whose send_offsets_to_transaction never returns (librdkafka #5511,
the stall a broker's death can cause, injected): the application's remedy, a new producer that
fences the stuck one, keeps the output exactly once."""

from __future__ import annotations

import asyncio
import json
import select
import subprocess
import sys
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import ClientError, NodeClient
from protocol.generated.find_coordinator import FindCoordinatorRequest
from tests.eos_app import KILL_COORDINATOR, PARTITIONS, STUCK_SEND_OFFSETS, TXN_ID
from tools.cluster import REPO_ROOT, Cluster

pytestmark = pytest.mark.slow

N = 100_000
APP_LIMIT_S = 240.0  # the application gives up on its own after 150 s; this bounds a wedged one

BROKER = {
    "transaction.state.log.num.partitions": 6,
    "offsets.topic.num.partitions": 6,
    "replica.lag.time.max.ms": 5000,
    "broker.heartbeat.interval.ms": 500,
    "group.initial.rebalance.delay.ms": 0,
}
CONTROLLER = {"broker.session.timeout.ms": 3000}


def txn_coordinator(c: Cluster, tid: str) -> int:
    async def ask() -> int:
        for b in c.broker_ids:
            if not c.is_running(b):
                continue
            try:
                async with NodeClient(c.host, c.broker_port(b), timeout=5) as cl:
                    deadline = time.monotonic() + 30
                    while True:
                        r = await cl.request(FindCoordinatorRequest(key=tid, key_type=1), 3)
                        if r.error_code == 0:
                            return r.node_id
                        assert time.monotonic() < deadline, r
                        await asyncio.sleep(0.1)
            except ClientError:
                continue  # a restarted broker not listening yet: ask another
        raise AssertionError("no broker answered")

    return asyncio.run(ask())


def fill_input(c: Cluster, n: int) -> None:
    p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "linger.ms": 20,
                  "batch.num.messages": 5000})
    for i in range(n):
        while True:
            try:
                p.produce("eos-in", str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def run_application(c: Cluster, n: int, scenario: str, victim: int | None = None) -> tuple[dict, float | None]:
    """Run tests/eos_app.py over `n` inputs; kill `victim` when it asks, restart it 3 s later.
    Returns the application's counters and when the kill happened."""
    app = subprocess.Popen([sys.executable, "-m", "tests.eos_app", c.bootstrap, str(n), scenario], cwd=REPO_ROOT,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    killed_at = None
    restarted = False
    deadline = time.monotonic() + APP_LIMIT_S
    try:
        while True:
            assert time.monotonic() < deadline, "the application neither finished nor failed in time"
            if killed_at is not None and not restarted and time.monotonic() - killed_at > 3:
                c.start_node(victim, wait=False)
                restarted = True
            ready, _, _ = select.select([app.stdout], [], [], 0.2)
            if not ready:
                continue
            line = app.stdout.readline()
            assert line, f"the application exited ({app.wait()}) without a result"
            event = json.loads(line)
            if "kill" in event:
                assert victim is not None, f"the application asked for a kill in scenario {scenario}"
                c.kill(victim)
                killed_at = time.monotonic()
                app.stdin.write("killed\n")
                app.stdin.flush()
            elif "done" in event:
                if victim is not None and not restarted:
                    c.start_node(victim, wait=False)
                return event["done"], killed_at
            else:
                raise AssertionError(f"application failed: {event.get('failed', event)}")
    finally:
        if app.poll() is None:
            app.kill()
        app.wait()


def create_topics(c: Cluster) -> None:
    a = AdminClient({"bootstrap.servers": c.bootstrap})
    for t in ("eos-in", "eos-out"):
        a.create_topics([NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[t].result(30)


def read_output(c: Cluster, expect: int) -> list[bytes]:
    con = Consumer({"bootstrap.servers": c.bootstrap, "group.id": "eos-verify", "isolation.level": "read_committed",
                    "enable.auto.commit": False})
    con.assign([TopicPartition("eos-out", p, 0) for p in range(PARTITIONS)])
    out: list[bytes] = []
    deadline = time.monotonic() + 60
    quiet = None
    try:
        while time.monotonic() < deadline:
            got = [m.value() for m in con.consume(5000, 0.5) if m.error() is None]
            out += got
            if got:
                quiet = None
            elif len(out) >= expect:
                quiet = quiet or time.monotonic()
                if time.monotonic() - quiet > 2:
                    break
    finally:
        con.close()
    return out


@pytest.mark.timeout(400)
def test_exactly_once_loop_survives_a_kill_of_the_transaction_coordinator(tmp_path):
    with Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=BROKER,
                 controller_overrides=CONTROLLER) as c:
        create_topics(c)
        started = time.monotonic()
        fill_input(c, N)
        filled = time.monotonic()
        victim = txn_coordinator(c, TXN_ID)
        counts, killed_at = run_application(c, N, KILL_COORDINATOR, victim)
        assert killed_at is not None
        moved_to = txn_coordinator(c, TXN_ID)
        looped = time.monotonic()
        out = read_output(c, N)
        assert len(out) == N, f"{len(out)} output messages, {len(set(out))} distinct"
        assert set(out) == {b"out-%d" % i for i in range(N)}
        print(f"fill {filled - started:.1f}s, loop {looped - filled:.1f}s (coordinator {victim} killed, now "
              f"{moved_to}; {counts}), verify {time.monotonic() - looped:.1f}s")


STUCK_N = 30_000


@pytest.mark.timeout(300)
def test_a_producer_stuck_in_send_offsets_is_replaced_and_the_output_stays_exactly_once(tmp_path):
    with Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=BROKER,
                 controller_overrides=CONTROLLER) as c:
        create_topics(c)
        fill_input(c, STUCK_N)
        counts, _ = run_application(c, STUCK_N, STUCK_SEND_OFFSETS)
        # the stuck producer's transaction held records and offsets; the new one fenced it
        assert counts["stuck_send_offsets"] == 1, counts
        assert counts["new_producers"] == 1, counts
        assert counts["committed_messages"] >= STUCK_N, counts
        out = read_output(c, STUCK_N)
        assert len(out) == STUCK_N, f"{len(out)} output messages, {len(set(out))} distinct"
        assert set(out) == {b"out-%d" % i for i in range(STUCK_N)}
