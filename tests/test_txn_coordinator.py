"""The transaction coordinator: __transaction_state record formats, the state rules of one
transactional id, the coordinator driven in-process over real __transaction_state logs (its
producer ids, markers and group coordinator faked), and the transaction APIs over the wire
against a real 3-broker cluster
(FindCoordinator for transactional ids, InitProducerId new/bump/fence, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, the error codes clients act on, timeouts that abort and fence, idle
transactional ids expiring)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from broker.coordinator.group.records import OFFSETS_TOPIC, partition_for
from broker.coordinator.transaction import TransactionCoordinator, TransactionCoordinatorConfig
from broker.coordinator.transaction.metadata import TransactionError, TransactionMetadata
from broker.coordinator.transaction.records import (
    TransactionLogValue,
    TransactionState,
    TxnRecordFormatError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from broker.replication.partition import Partition
from broker.storage.config import LogConfig
from broker.storage.log import Log
from metadata import PartitionInfo
from node.client import NodeClient
from protocol.errors import Errors as E
from protocol.generated.add_offsets_to_txn import AddOffsetsToTxnRequest
from protocol.generated.add_partitions_to_txn import AddPartitionsToTxnRequest
from protocol.generated.create_topics import CreateTopicsRequest
from protocol.generated.end_txn import EndTxnRequest
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.init_producer_id import InitProducerIdRequest
from tests.conftest import eventually_async
from tests.fakes import FakeMetadata, FakeReplicas
from tools.cluster import Cluster

S = TransactionState


# ======================================================================= records
def test_transaction_log_records_round_trip():
    k = encode_key("my-txn")
    assert k[:2] == b"\x00\x00" and decode_key(k) == "my-txn"
    v = TransactionLogValue(4000, 3999, -1, 7, 6, 60000, S.ONGOING, frozenset({("a", 0), ("a", 2), ("b", 1)}),
                            1700000000123, 1700000000000)
    assert decode_value(encode_value(v)) == v
    empty = TransactionLogValue(5, -1, -1, 0, -1, 1000, S.COMPLETE_ABORT)
    assert decode_value(encode_value(empty)) == empty
    for bad in (encode_value(v)[:-3], b"\x00\x01" + encode_value(v)[2:], b""):
        with pytest.raises(TxnRecordFormatError):
            decode_value(bad)
    with pytest.raises(TxnRecordFormatError):
        decode_key(b"\x00\x05\x00\x01a")


def test_state_rules_follow_kafka():
    m = TransactionMetadata("t", 10, -1, -1, -1, -1, 60000, S.EMPTY)
    # a new id: epoch 0
    target = m.prepare_increment_epoch(60000, None, 1)
    assert (target.producer_epoch, target.last_producer_epoch) == (0, -1)
    with pytest.raises(TransactionError) as e:  # one change at a time
        m.prepare_add_partitions({("a", 0)}, 1)
    assert e.value.error_code == E.CONCURRENT_TRANSACTIONS
    m.complete(target)
    # KIP-360: the producer's own epoch bumps, a retry of that bump answers the same epoch, an
    # older epoch is fenced
    m.complete(m.prepare_increment_epoch(60000, 0, 2))
    assert (m.producer_epoch, m.last_producer_epoch) == (1, 0)
    retry = m.prepare_increment_epoch(60000, 0, 3)
    assert retry.producer_epoch == 1
    m.abandon()
    m.complete(m.prepare_increment_epoch(60000, 1, 4))
    with pytest.raises(TransactionError) as e:
        m.prepare_increment_epoch(60000, 0, 5)
    assert e.value.error_code == E.PRODUCER_FENCED
    # Empty -> Ongoing (start time set) -> PrepareCommit -> CompleteCommit (partitions cleared)
    m.complete(m.prepare_add_partitions({("a", 0)}, 100))
    m.complete(m.prepare_add_partitions({("b", 1)}, 150))
    assert m.state is S.ONGOING and m.partitions == {("a", 0), ("b", 1)} and m.start_ms == 100
    with pytest.raises(TransactionError) as e:
        m.prepare_complete(160)
    assert e.value.error_code == E.INVALID_TXN_STATE
    m.complete(m.prepare_end(True, 200))
    assert m.state is S.PREPARE_COMMIT
    m.complete(m.prepare_complete(300))
    assert m.state is S.COMPLETE_COMMIT and not m.partitions
    # a fence bumps the epoch while aborting
    m.complete(m.prepare_add_partitions({("a", 0)}, 400))
    assert m.start_ms == 400
    m.complete(m.prepare_end(False, 500, fence_epoch=m.producer_epoch + 1))
    assert m.state is S.PREPARE_ABORT and m.producer_epoch == 3 and m.last_producer_epoch == -1


# ======================================================================= in-process coordinator
TOPIC_ID = uuid.UUID(int=78)
TXN_STATE = "__transaction_state"
UNIT_CONFIG = TransactionCoordinatorConfig(state_log_num_partitions=2, abort_timed_out_interval_ms=3_600_000,
                                           remove_expired_interval_ms=3_600_000, write_timeout_ms=2000)


class FakeProducerIds:
    def __init__(self) -> None:
        self.next = 1000

    async def generate(self) -> int:
        self.next += 1
        return self.next - 1


class FakeMarkers:
    """Records each transaction's markers; `blocked` holds them (as an unreachable leader does)
    until released."""

    def __init__(self) -> None:
        self.written: list[tuple[int, int, bool, frozenset, int]] = []
        self.blocked = False

    async def write(self, producer_id: int, producer_epoch: int, commit: bool, partitions: set, coordinator_epoch: int,
                    still_coordinator) -> bool:
        while self.blocked:
            if not still_coordinator():
                return False
            await asyncio.sleep(0.01)
        self.written.append((producer_id, producer_epoch, commit, frozenset(partitions), coordinator_epoch))
        return True

    async def close(self) -> None:
        pass


class FakeGroupCoordinator:
    def num_partitions(self) -> int:
        return 7


class TxnHarness:
    """The coordinator's ports faked around real __transaction_state logs led by node 1."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.replicas = FakeReplicas()
        self.markers = FakeMarkers()
        self.coordinator = TransactionCoordinator(UNIT_CONFIG, self.replicas, FakeMetadata(), self.forward,
                                                  FakeProducerIds(), self.markers, FakeGroupCoordinator())
        self.epochs: dict[int, int] = {}

    async def forward(self, body: Any, version: int | None = None, *, read_only: bool = False) -> Any:
        raise ConnectionError("no controller in this test")

    def set_leader(self, index: int, leader: int) -> None:
        p = self.replicas.get(TXN_STATE, index)
        if p is None:
            lg = Log.open(self.tmp / f"{TXN_STATE}-{index}-0", LogConfig(), topic_id=TOPIC_ID)
            p = self.replicas.partitions[(TXN_STATE, index)] = Partition(TXN_STATE, index, TOPIC_ID, lg, 1)
        epoch = self.epochs[index] = self.epochs.get(index, -1) + 1
        p.update(PartitionInfo(TOPIC_ID, index, (1, 2), (1, 2) if leader == 2 else (1,), leader, epoch, epoch))
        for listener in self.replicas.leadership_listeners:
            listener(p, p.is_leader)

    async def lead(self, index: int) -> None:
        """Lead partition `index` (again, under a new epoch) and wait until it is loaded."""
        self.set_leader(index, 1)
        probe = next(t for t in (f"probe-{i}" for i in range(1000)) if self.coordinator.partition_for(t) == index)
        assert await eventually_async(lambda: self.coordinator.is_coordinator_for(probe)), "partition did not load"

    def close(self) -> None:
        self.coordinator.shutdown()
        for p in self.replicas.partitions.values():
            p.log.close()


def test_transactions_commit_abort_and_reload_in_process(tmp_path):
    async def scenario():
        h = TxnHarness(tmp_path)
        c = h.coordinator
        try:
            tid = "tx-in-process"
            idx = c.partition_for(tid)
            assert (await c.init_producer_id(tid, 60000, None))[0] == E.NOT_COORDINATOR
            await h.lead(idx)
            err, pid, epoch = await c.init_producer_id(tid, 60000, None)
            assert (err, pid, epoch) == (0, 1000, 0)
            assert await c.add_partitions(tid, pid, epoch, {("data", 0), ("data", 1)}) == 0
            # AddOffsetsToTxn: before the image has __consumer_offsets, the group coordinator's count
            assert await c.add_offsets(tid, pid, epoch, "grp") == 0
            group_partition = (OFFSETS_TOPIC, partition_for("grp", FakeGroupCoordinator().num_partitions()))
            assert c.describe(tid)[1].partitions == {("data", 0), ("data", 1), group_partition}
            assert await c.add_partitions(tid, pid, epoch + 1, {("data", 2)}) == E.PRODUCER_FENCED
            assert await c.end_transaction(tid, pid, epoch, True) == 0
            assert await eventually_async(lambda: c.describe(tid)[1].state is S.COMPLETE_COMMIT)
            assert h.markers.written == [(pid, epoch, True, frozenset({("data", 0), ("data", 1), group_partition}),
                                          h.epochs[idx])]
            # a second transaction is prepared to abort, its markers held; the coordinator moves
            assert await c.add_partitions(tid, pid, epoch, {("data", 2)}) == 0
            h.markers.blocked = True
            assert await c.end_transaction(tid, pid, epoch, False) == 0
            assert c.describe(tid)[1].state is S.PREPARE_ABORT
            h.set_leader(idx, 2)
            assert c.describe(tid)[0] == E.NOT_COORDINATOR
            # back here under a new epoch: reloaded from the log, the abort is finished
            h.markers.blocked = False
            await h.lead(idx)
            assert await eventually_async(lambda: c.describe(tid)[1] is not None
                                     and c.describe(tid)[1].state is S.COMPLETE_ABORT)
            assert h.markers.written[-1] == (pid, epoch, False, frozenset({("data", 2)}), h.epochs[idx])
            meta = c.describe(tid)[1]
            assert (meta.producer_id, meta.producer_epoch) == (pid, epoch)
            err, pid2, epoch2 = await c.init_producer_id(tid, 60000, (pid, epoch))
            assert (err, pid2, epoch2) == (0, pid, epoch + 1)
        finally:
            h.close()

    asyncio.run(scenario())


# ======================================================================= over the wire
BROKER = {
    "transaction.state.log.num.partitions": 4,
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 300,
    "transaction.max.timeout.ms": 120000,
    "offsets.topic.num.partitions": 4,
    "broker.heartbeat.interval.ms": 500,
}


EXPIRATION_MS = 4000  # transactional.id.expiration.ms of the module's cluster (Kafka: 7 days)


@pytest.fixture(scope="module")
def txn_cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("txn"), brokers=3, verbose=False, broker_overrides={
        **BROKER, "transactional.id.expiration.ms": EXPIRATION_MS,
        "transaction.remove.expired.transaction.cleanup.interval.ms": 300})
    try:
        c.start()
        asyncio.run(_setup(c))
        yield c
    finally:
        c.stop()


async def _setup(c: Cluster) -> None:
    async with NodeClient(c.host, c.broker_port(1)) as cl:
        C = CreateTopicsRequest
        await cl.request(C(topics=[C.CreatableTopic(name="data", num_partitions=3, replication_factor=3)],
                           timeout_ms=30000))


async def find_txn_coordinator(cl: NodeClient, tid: str) -> int:
    deadline = time.monotonic() + 30
    while True:
        r = await cl.request(FindCoordinatorRequest(key=tid, key_type=1), 3)
        if r.error_code == 0:
            return r.node_id
        assert r.error_code == E.COORDINATOR_NOT_AVAILABLE, r
        assert time.monotonic() < deadline, "no transaction coordinator"
        await asyncio.sleep(0.1)


async def retrying(fn, *retriable: int, timeout: float = 20.0):
    """Call until the error code is not one of `retriable` (COORDINATOR_LOAD_IN_PROGRESS always is)."""
    deadline = time.monotonic() + timeout
    while True:
        r = await fn()
        code = r if isinstance(r, int) else r.error_code
        if code not in (E.COORDINATOR_LOAD_IN_PROGRESS, *retriable) or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.05)


class Txn:
    """Raw transaction requests to the coordinator of one transactional id."""

    def __init__(self, c: Cluster, tid: str, avoid: int | None = None) -> None:
        self.c = c
        self.tid = tid
        self.avoid = avoid  # a broker that is down: neither asked nor accepted as the coordinator

    async def __aenter__(self) -> Txn:
        boot = next(b for b in self.c.broker_ids if b != self.avoid)
        self.boot = await NodeClient(self.c.host, self.c.broker_port(boot)).connect()
        deadline = time.monotonic() + 30
        while (node := await find_txn_coordinator(self.boot, self.tid)) == self.avoid:
            assert time.monotonic() < deadline, "the coordinator did not move"
            await asyncio.sleep(0.1)
        self.node = node
        self.cl = await NodeClient(self.c.host, self.c.broker_port(self.node)).connect()
        other = next(b for b in self.c.broker_ids if b not in (self.node, self.avoid))
        self.other = await NodeClient(self.c.host, self.c.broker_port(other)).connect()
        return self

    async def __aexit__(self, *exc) -> None:
        for cl in (self.boot, self.cl, self.other):
            await cl.close()

    async def init(self, timeout_ms: int = 60000, pid: int = -1, epoch: int = -1, version: int = 4,
                   retriable=(E.CONCURRENT_TRANSACTIONS,), timeout: float = 20.0):
        return await retrying(lambda: self.cl.request(InitProducerIdRequest(
            transactional_id=self.tid, transaction_timeout_ms=timeout_ms, producer_id=pid, producer_epoch=epoch),
            version), *retriable, timeout=timeout)

    async def add(self, pid: int, epoch: int, parts, version: int = 3, retriable=()) -> dict:
        topics: dict[str, list[int]] = {}
        for t, p in parts:
            topics.setdefault(t, []).append(p)
        A = AddPartitionsToTxnRequest

        async def once():
            r = await self.cl.request(A(v3_and_below_transactional_id=self.tid, v3_and_below_producer_id=pid,
                                        v3_and_below_producer_epoch=epoch, v3_and_below_topics=[
                                            A.AddPartitionsToTxnTopic(name=t, partitions=ps)
                                            for t, ps in topics.items()]), version)
            out = {(t.name, p.partition_index): p.partition_error_code
                   for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}
            codes = set(out.values())
            return out, (codes.pop() if len(codes) == 1 else -999)

        deadline = time.monotonic() + 20
        while True:
            out, code = await once()
            if code not in (E.COORDINATOR_LOAD_IN_PROGRESS, *retriable) or time.monotonic() > deadline:
                return out
            await asyncio.sleep(0.05)

    async def end(self, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
        r = await retrying(lambda: self.cl.request(EndTxnRequest(
            transactional_id=self.tid, producer_id=pid, producer_epoch=epoch, committed=commit), version))
        return r.error_code


def run(coro):
    return asyncio.run(coro)


def test_find_coordinator_and_init_producer_id(txn_cluster):
    async def go():
        async with Txn(txn_cluster, "init-1") as t:
            # only the coordinator answers; bad timeouts are refused
            r = await t.other.request(InitProducerIdRequest(transactional_id=t.tid, transaction_timeout_ms=1000), 1)
            assert r.error_code == E.NOT_COORDINATOR
            assert (await t.init(timeout_ms=120001)).error_code == E.INVALID_TRANSACTION_TIMEOUT
            assert (await t.init(timeout_ms=0)).error_code == E.INVALID_TRANSACTION_TIMEOUT
            r0 = await t.init(version=0)
            assert r0.error_code == 0 and r0.producer_epoch == 0 and r0.producer_id >= 0
            r1 = await t.init(version=1)
            assert (r1.error_code, r1.producer_id, r1.producer_epoch) == (0, r0.producer_id, 1)
            # KIP-360 (v3+): the current producer bumps its own epoch; a stale one is fenced
            r2 = await t.init(pid=r1.producer_id, epoch=1)
            assert (r2.error_code, r2.producer_id, r2.producer_epoch) == (0, r0.producer_id, 2)
            assert (await t.init(pid=r1.producer_id, epoch=0)).error_code == E.PRODUCER_FENCED
            assert (await t.init(pid=r1.producer_id, epoch=0, version=3)).error_code == E.INVALID_PRODUCER_EPOCH
            # a producer id the transactional id never had
            assert (await t.init(pid=r1.producer_id + 12345, epoch=0)).error_code == E.PRODUCER_FENCED
            # an empty transactional id is a bad request, on any broker
            r = await t.cl.request(InitProducerIdRequest(transactional_id="", transaction_timeout_ms=1000), 4)
            assert r.error_code == E.INVALID_REQUEST

    run(go())


def test_add_partitions_end_txn_and_fencing(txn_cluster):
    async def go():
        async with Txn(txn_cluster, "add-1") as t:
            r = await t.init()
            pid, epoch = r.producer_id, r.producer_epoch
            # EndTxn before anything was added: nothing to end
            assert await t.end(pid, epoch, True) == E.INVALID_TXN_STATE
            out = await t.add(pid, epoch, [("data", 0), ("nope", 0)])
            assert out == {("data", 0): E.OPERATION_NOT_ATTEMPTED, ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
            assert await t.add(pid, epoch, [("data", 0), ("data", 1)]) == {("data", 0): 0, ("data", 1): 0}
            assert await t.add(pid, epoch, [("data", 1)]) == {("data", 1): 0}  # already in: no write
            assert await t.add(pid + 1, epoch, [("data", 2)]) == {("data", 2): E.INVALID_PRODUCER_ID_MAPPING}
            assert await t.add(pid, epoch - 1 if epoch else 5, [("data", 2)]) == {("data", 2): E.PRODUCER_FENCED}
            assert await t.add(pid, 5, [("data", 2)], version=1) == {("data", 2): E.INVALID_PRODUCER_EPOCH}
            r = await retrying(lambda: t.cl.request(AddOffsetsToTxnRequest(
                transactional_id=t.tid, producer_id=pid, producer_epoch=epoch, group_id="g1"), 0))
            assert r.error_code == 0
            assert await t.end(pid, epoch + 1, True) == E.PRODUCER_FENCED
            assert await t.end(pid, epoch + 1, True, version=0) == E.INVALID_PRODUCER_EPOCH
            assert await t.end(pid + 1, epoch, True) == E.INVALID_PRODUCER_ID_MAPPING
            assert await t.end(pid, epoch, True) == 0
            # a retry of the commit while (or after) it completes; an abort is the wrong end
            assert await t.end(pid, epoch, True) in (0, E.CONCURRENT_TRANSACTIONS)
            assert await t.end(pid, epoch, False) == E.INVALID_TXN_STATE
            # a new producer for the id fences the old one
            r2 = await t.init()
            assert r2.error_code == 0 and r2.producer_id == pid and r2.producer_epoch == epoch + 1
            out = await t.add(pid, epoch, [("data", 0)])
            assert out == {("data", 0): E.PRODUCER_FENCED}

    run(go())


def test_ongoing_transaction_is_aborted_by_a_new_producer(txn_cluster):
    async def go():
        async with Txn(txn_cluster, "fence-1") as t:
            r = await t.init()
            pid, epoch = r.producer_id, r.producer_epoch
            assert await t.add(pid, epoch, [("data", 0)]) == {("data", 0): 0}
            # InitProducerId while a transaction is open: CONCURRENT_TRANSACTIONS until it is
            # aborted (with a bumped epoch), then another bump
            r = await t.init(retriable=())
            assert r.error_code == E.CONCURRENT_TRANSACTIONS
            assert await t.end(pid, epoch, True) in (E.PRODUCER_FENCED, E.CONCURRENT_TRANSACTIONS)
            r = await t.init()
            assert (r.error_code, r.producer_id, r.producer_epoch) == (0, pid, epoch + 2)
            assert await t.end(pid, epoch, False) == E.PRODUCER_FENCED

    run(go())


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(txn_cluster):
    async def go():
        async with Txn(txn_cluster, "timeout-1") as t:
            r = await t.init(timeout_ms=1000)
            pid, epoch = r.producer_id, r.producer_epoch
            assert await t.add(pid, epoch, [("data", 1)]) == {("data", 1): 0}
            await asyncio.sleep(2.0)  # past the timeout: the cleanup aborts it with a bumped epoch
            assert await t.end(pid, epoch, True) == E.PRODUCER_FENCED
            assert await t.add(pid, epoch, [("data", 1)]) == {("data", 1): E.PRODUCER_FENCED}
            r = await t.init(timeout_ms=1000)
            assert (r.error_code, r.producer_id, r.producer_epoch) == (0, pid, epoch + 2)

    run(go())


def test_idle_transactional_ids_expire_open_transactions_do_not(txn_cluster):
    async def go():
        async with Txn(txn_cluster, "expire-idle") as idle, Txn(txn_cluster, "expire-open") as busy:
            r = await idle.init()
            idle_pid, idle_epoch = r.producer_id, r.producer_epoch
            r = await busy.init()
            busy_pid, busy_epoch = r.producer_id, r.producer_epoch
            assert await busy.add(busy_pid, busy_epoch, [("data", 2)]) == {("data", 2): 0}
            await asyncio.sleep(EXPIRATION_MS / 1000 + 1)
            # the open transaction is still there (it times out only after its own 60 s)
            assert await busy.end(busy_pid, busy_epoch, True) == 0
            # the idle id was forgotten (a tombstone in __transaction_state): its old producer id
            # is unknown and its next InitProducerId starts over with a new producer id
            assert await idle.add(idle_pid, idle_epoch, [("data", 0)]) == {("data", 0): E.INVALID_PRODUCER_ID_MAPPING}
            r = await idle.init()
            assert r.error_code == 0 and r.producer_id not in (idle_pid, busy_pid) and r.producer_epoch == 0

    run(go())


@pytest.mark.slow
def test_a_new_coordinator_finishes_a_prepared_commit(tmp_path):
    """EndTxn(commit) answered with PrepareCommit durable, its markers blocked (the only replica of
    a partition is down), then the coordinator's broker is kill -9ed: the broker that takes over
    __transaction_state loads PrepareCommit, writes the markers once the partition is back, and
    completes the transaction (the id is usable again)."""
    c = Cluster(tmp_path / "c", brokers=3, verbose=False,
                broker_overrides={**BROKER, "replica.lag.time.max.ms": 3000},
                controller_overrides={"broker.session.timeout.ms": 3000})
    c.start()
    try:
        async def go():
            async with Txn(c, "prepared-1") as t:
                solo_on = next(b for b in c.broker_ids if b != t.node)
                C = CreateTopicsRequest
                r = await t.boot.request(C(topics=[C.CreatableTopic(
                    name="solo", num_partitions=-1, replication_factor=-1,
                    assignments=[C.CreatableReplicaAssignment(partition_index=0, broker_ids=[solo_on])])],
                    timeout_ms=30000))
                assert r.topics[0].error_code == 0, r
                init = await t.init()
                pid, epoch = init.producer_id, init.producer_epoch
                assert await t.add(pid, epoch, [("solo", 0)]) == {("solo", 0): 0}
                c.kill(solo_on)
                assert await t.end(pid, epoch, True) == 0  # PrepareCommit replicated; the marker cannot be
                assert (await t.init(retriable=())).error_code == E.CONCURRENT_TRANSACTIONS
                victim = t.node
            c.kill(victim)
            c.start_node(solo_on)
            async with Txn(c, "prepared-1", avoid=victim) as t:
                r = await t.init(retriable=(E.CONCURRENT_TRANSACTIONS, E.NOT_COORDINATOR), timeout=60)
                assert (r.error_code, r.producer_id, r.producer_epoch) == (0, pid, epoch + 1)
            c.start_node(victim)

        run(go())
    finally:
        c.stop()


def test_a_fenced_producers_late_offset_commit_is_refused(txn_cluster):
    """A producer fenced while its transaction holds offsets (a new producer with its
    transactional id aborted it) cannot commit offsets afterwards: the group's __consumer_offsets
    partition saw the abort marker at the bumped epoch and refuses the old one (what makes the
    exactly-once application's remedy for a stuck librdkafka producer safe)."""
    from protocol.generated.offset_fetch import OffsetFetchRequest
    from protocol.generated.txn_offset_commit import TxnOffsetCommitRequest

    group = "fenced-offsets"

    async def go():
        async with Txn(txn_cluster, "fence-offsets") as t:
            # the group's coordinator first (this creates __consumer_offsets, as a consumer would)
            r = await retrying(lambda: t.boot.request(FindCoordinatorRequest(key=group, key_type=0), 3),
                               E.COORDINATOR_NOT_AVAILABLE)
            group_node = r.node_id
            r = await t.init()
            pid, epoch = r.producer_id, r.producer_epoch
            r = await retrying(lambda: t.cl.request(AddOffsetsToTxnRequest(
                transactional_id=t.tid, producer_id=pid, producer_epoch=epoch, group_id=group), 1))
            assert r.error_code == 0
            assert (await t.init(retriable=())).error_code == E.CONCURRENT_TRANSACTIONS  # fences, aborts
            assert (await t.init()).producer_epoch == epoch + 2
            async with NodeClient(txn_cluster.host, txn_cluster.broker_port(group_node)) as gc:
                T = TxnOffsetCommitRequest
                deadline = time.monotonic() + 20
                while True:
                    r = await gc.request(T(
                        transactional_id=t.tid, group_id=group, producer_id=pid, producer_epoch=epoch,
                        generation_id=-1, member_id="", topics=[T.TxnOffsetCommitRequestTopic(
                            name="data", partitions=[T.TxnOffsetCommitRequestPartition(
                                partition_index=0, committed_offset=5)])]), 3)
                    code = r.topics[0].partitions[0].error_code
                    if code != E.COORDINATOR_LOAD_IN_PROGRESS or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.05)
                assert code in (E.INVALID_PRODUCER_EPOCH, E.PRODUCER_FENCED), code
                F = OffsetFetchRequest
                r = await gc.request(F(group_id=group, topics=[F.OffsetFetchRequestTopic(
                    name="data", partition_indexes=[0])], require_stable=True), 7)
                assert r.topics[0].partitions[0].committed_offset == -1

    run(go())
