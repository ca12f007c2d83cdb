"""Issue 5 acceptance, exactly once: a confluent-kafka consume-transform-produce loop over 100,000
input messages (4 partitions, RF 3) with the transaction coordinator's broker kill -9ed mid-run
and restarted. The loop reads with read_committed, produces each transformed message and commits
its input offsets in the same transaction (send_offsets_to_transaction); on an abortable error it
aborts and rewinds to the committed offsets, on a fatal one it starts a new producer (which
fences the old). The output, read with read_committed, holds every input exactly once."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import NodeClient
from protocol.generated.find_coordinator import FindCoordinatorRequest
from tools.cluster import Cluster

pytestmark = pytest.mark.slow

N = 100_000
PARTITIONS = 4
TXN_ID = "eos-loop"
GROUP = "eos-loop-group"
BATCH = 2000
CALL_LIMIT_S = 90.0  # a librdkafka transaction call still blocked after this counts as hung


class ClientCallHung(AssertionError):
    """A librdkafka transaction call never returned (its own timeout did not end it)."""


def bounded(fn, *args):
    """Run one blocking librdkafka call in a daemon thread: a call that hangs fails the test
    (leaving the thread behind) instead of hanging the whole test run."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(CALL_LIMIT_S)
    if t.is_alive():
        raise ClientCallHung(f"{getattr(fn, '__name__', fn)} still blocked after {CALL_LIMIT_S:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


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
            async with NodeClient(c.host, c.broker_port(b), timeout=5) as cl:
                deadline = time.monotonic() + 30
                while True:
                    r = await cl.request(FindCoordinatorRequest(key=tid, key_type=1), 3)
                    if r.error_code == 0:
                        return r.node_id
                    assert time.monotonic() < deadline, r
                    await asyncio.sleep(0.1)
        raise AssertionError("no broker running")

    return asyncio.run(ask())


def fill_input(c: Cluster) -> None:
    p = Producer({"bootstrap.servers": c.bootstrap, "enable.idempotence": True, "linger.ms": 20,
                  "batch.num.messages": 5000})
    for i in range(N):
        while True:
            try:
                p.produce("eos-in", str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


class Loop:
    """The consume-transform-produce loop (one process, the way an EOS application runs)."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.consumer = Consumer({"bootstrap.servers": c.bootstrap, "group.id": GROUP,
                                  "isolation.level": "read_committed", "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest"})
        self.parts = [TopicPartition("eos-in", p) for p in range(PARTITIONS)]
        self.consumer.assign([TopicPartition("eos-in", p, 0) for p in range(PARTITIONS)])
        self.producer = self._new_producer()
        self.committed_messages = 0
        self.aborts = 0
        self.new_producers = 0
        self.commit_retries = 0
        self.before_commit = lambda: None  # the test's hook: runs inside an open transaction
        self.deadline = time.monotonic() + 150  # retries of commit/abort give up with the test

    def _new_producer(self) -> Producer:
        p = Producer({"bootstrap.servers": self.c.bootstrap, "transactional.id": TXN_ID, "linger.ms": 5,
                      "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
        p.init_transactions(60)
        return p

    def rewind(self) -> None:
        """Back to the committed input offsets (what the output already holds)."""
        committed = self.consumer.committed(self.parts, timeout=30)
        for tp in committed:
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    def committed_input(self) -> int:
        return sum(max(tp.offset, 0) for tp in self.consumer.committed(self.parts, timeout=30))

    def one_transaction(self) -> int:
        """Consume a batch, produce its transform, commit both; returns how many were consumed."""
        msgs = [m for m in self.consumer.consume(BATCH, 1.0) if m.error() is None]
        if not msgs:
            return 0
        p = self.producer
        try:
            p.begin_transaction()
            for m in msgs:
                while True:
                    try:
                        p.produce("eos-out", b"out-" + m.value(), partition=m.partition())
                        break
                    except BufferError:
                        p.poll(0.05)
            positions = self.consumer.position(self.parts)
            bounded(p.send_offsets_to_transaction, positions, self.consumer.consumer_group_metadata(), 60)
            self.before_commit()
            self._commit(p)
            self.committed_messages += len(msgs)
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.fatal():
                self.new_producers += 1
                self.producer = self._new_producer()
            else:
                self.aborts += 1
                self._abort(p)
            self.rewind()
        return len(msgs)

    def _commit(self, p: Producer) -> None:
        while True:
            try:
                bounded(p.commit_transaction, 60)
                return
            except KafkaException as e:
                if not e.args[0].retriable() or time.monotonic() > self.deadline:
                    raise
                self.commit_retries += 1
                time.sleep(0.2)

    def _abort(self, p: Producer) -> None:
        while True:
            try:
                bounded(p.abort_transaction, 60)
                return
            except KafkaException as e:
                if e.args[0].fatal():
                    self.new_producers += 1
                    self.producer = self._new_producer()
                    return
                if not e.args[0].retriable() or time.monotonic() > self.deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        self.consumer.close()


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


# A librdkafka call stuck in C never returns to Python, so the signal method could not end it:
# the thread method fails the run (stacks dumped) instead of hanging it.
@pytest.mark.xfail(
    raises=ClientCallHung, strict=False,
    reason="open in issue #5: after the coordinator moves, librdkafka's send_offsets_to_transaction "
           "sometimes never returns (seen in 2 of ~16 runs); any other failure still fails the test",
)
@pytest.mark.timeout(400, method="thread")
def test_exactly_once_loop_survives_a_kill_of_the_transaction_coordinator(tmp_path):
    c = Cluster(tmp_path / "c", brokers=3, verbose=False, broker_overrides=BROKER, controller_overrides=CONTROLLER)
    c.start()
    try:
        a = AdminClient({"bootstrap.servers": c.bootstrap})
        for t in ("eos-in", "eos-out"):
            a.create_topics([NewTopic(t, PARTITIONS, 3, config={"min.insync.replicas": "2"})])[t].result(30)
        started = time.monotonic()
        fill_input(c)
        filled = time.monotonic()
        loop = Loop(c)
        victim = txn_coordinator(c, TXN_ID)
        killed_at = None

        def kill_mid_transaction() -> None:
            # a third of the way through, with this transaction's records and offsets sent but
            # not committed: the coordinator's broker dies
            nonlocal killed_at
            if killed_at is None and loop.committed_messages >= N // 3:
                c.kill(victim)
                killed_at = time.monotonic()

        loop.before_commit = kill_mid_transaction
        restarted = False
        deadline = loop.deadline = time.monotonic() + 150
        try:
            while True:
                assert time.monotonic() < deadline, (
                    f"only {loop.committed_messages} of {N} committed (aborts {loop.aborts}, "
                    f"new producers {loop.new_producers})")
                if loop.one_transaction() == 0 and loop.committed_input() >= N:
                    break
                if killed_at is not None and not restarted and time.monotonic() - killed_at > 3:
                    c.start_node(victim, wait=False)
                    restarted = True
        finally:
            loop.close()
        assert killed_at is not None and restarted
        moved_to = txn_coordinator(c, TXN_ID)
        looped = time.monotonic()
        out = read_output(c, N)
        assert len(out) == N, f"{len(out)} output messages, {len(set(out))} distinct"
        assert set(out) == {b"out-%d" % i for i in range(N)}
        print(f"fill {filled - started:.1f}s, loop {looped - filled:.1f}s (coordinator {victim} killed, now "
              f"{moved_to}; commit retries {loop.commit_retries}, aborts {loop.aborts}, new producers "
              f"{loop.new_producers}), verify {time.monotonic() - looped:.1f}s")
    finally:
        c.stop()
