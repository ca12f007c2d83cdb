"""The transactional half of the `strata` sink: ending a task's transaction from the driver, and
the commit log that makes a micro-batch's commit decision durable.

A task writes its rows inside a transaction it does not end; the driver ends them all once every
task has succeeded. Kafka's protocol lets any client end a transaction that knows its
(transactional.id, producer id, epoch): EndTxn carries exactly these, as Flink's Kafka sink relies
on when it resumes a transaction after a restart. KIP-939's PREPARED state would let the
coordinator keep a transaction past its timeout; without it, a task's transaction lives at most
transaction.timeout.ms (15 minutes by default) before the coordinator aborts it.

The commit log (a compacted topic, one partition) holds, per query, the last micro-batch whose
commit the driver decided and the transactions that make it up. It is written before the first
EndTxn, so a driver that dies between the two is followed by one that rolls the decision forward.

A task's transactional.id is the query's prefix and the task's number; a replay of a micro-batch
takes the ids of its own tasks (fencing what the earlier attempt left open under them), but an
attempt that ran more tasks than the replay left transactions under ids the replay does not
reuse. Open, they would hold read_committed readers at the last stable offset until their
timeout; so after each commit the driver lists the query's open transactions (ListTransactions)
and aborts the ones that are not the batch's by fencing their ids.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from connector.sink_options import SinkError, SinkOptions
from node.client import ClientError, NodeClient
from node.security import ClientSecurity, client_security
from protocol.errors import Errors, error_name
from protocol.generated.end_txn import EndTxnRequest
from protocol.generated.find_coordinator import FindCoordinatorRequest
from protocol.generated.list_transactions import ListTransactionsRequest

_RETRIABLE = {Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
              Errors.CONCURRENT_TRANSACTIONS, Errors.REQUEST_TIMED_OUT}
# what a consumer or admin client may be given of the producer's settings
_SHARED_PREFIXES = ("bootstrap.servers", "security.", "ssl.", "sasl.", "client.id", "socket.", "broker.address.")


@dataclass(frozen=True)
class Txn:
    transactional_id: str
    producer_id: int
    epoch: int

    def to_json(self) -> list:
        return [self.transactional_id, self.producer_id, self.epoch]


def shared_config(opts: SinkOptions) -> dict[str, str | int | float | bool]:
    return {k: v for k, v in opts.producer.items() if k.startswith(_SHARED_PREFIXES)}


def _security(opts: SinkOptions) -> ClientSecurity:
    p = opts.producer
    return client_security(p.get("security.protocol", "PLAINTEXT").upper(), p.get, "strata sink",
                           p.get("sasl.mechanism") or p.get("sasl.mechanisms"), {})


# ---------------------------------------------------------------- EndTxn from the driver
def end_transactions(opts: SinkOptions, txns: list[Txn], commit: bool, timeout: float = 120.0) -> None:
    """End each transaction (commit or abort) as its own producer would. Idempotent: ending an
    already committed transaction again answers success (Kafka's coordinator does the same for a
    retried EndTxn). A commit that meets a fenced producer means the coordinator aborted the
    transaction (its timeout passed): the rows are gone, and that fails loudly."""
    if txns:
        asyncio.run(_end_all(opts, txns, commit, timeout))


async def _end_all(opts: SinkOptions, txns: list[Txn], commit: bool, timeout: float) -> None:
    from connector.cluster_view import parse_bootstrap

    sec = _security(opts)
    bootstrap = parse_bootstrap(opts.bootstrap)
    clients: dict[tuple[str, int], NodeClient] = {}

    async def client(addr: tuple[str, int]) -> NodeClient:
        c = clients.get(addr)
        if c is None or not c.connected:
            c = clients[addr] = await NodeClient(*addr, client_id="strata-spark-sink", timeout=10.0,
                                                 security=sec).connect()
        return c

    async def end(t: Txn) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        ended = False
        while time.monotonic() < deadline:
            try:
                coord = None
                for addr in bootstrap:
                    try:
                        r = await (await client(addr)).request(FindCoordinatorRequest(
                            key=t.transactional_id, key_type=1), 3)
                    except ClientError as e:
                        last = str(e)
                        continue
                    if r.error_code == 0:
                        coord = (r.host, r.port)
                        break
                    last = error_name(r.error_code)
                if coord is not None:
                    resp = await (await client(coord)).request(EndTxnRequest(
                        transactional_id=t.transactional_id, producer_id=t.producer_id,
                        producer_epoch=t.epoch, committed=commit))
                    if resp.error_code == 0:
                        if ended:
                            return
                        # The first answer comes once the coordinator has prepared; asking again
                        # answers CONCURRENT_TRANSACTIONS until every marker is written, then success
                        # (CompleteCommit): only then are the rows visible to read_committed readers.
                        ended = True
                        continue
                    last = error_name(resp.error_code)
                    if resp.error_code not in _RETRIABLE:
                        what = "commit" if commit else "abort"
                        raise SinkError(f"cannot {what} transaction {t.transactional_id} (producer {t.producer_id}, "
                                        f"epoch {t.epoch}): {last}"
                                        + (" (it was aborted: transaction.timeout.ms passed?)" if commit else ""))
            except ClientError as e:
                last = str(e)
            await asyncio.sleep(0.05 if ended else 0.2)
        raise SinkError(f"transaction {t.transactional_id}: no answer to EndTxn within {timeout:.0f}s ({last})")

    try:
        await asyncio.gather(*(end(t) for t in txns))
    finally:
        for c in clients.values():
            await c.close()


# ---------------------------------------------------------------- transactions left by an earlier attempt
def open_transactions(opts: SinkOptions, prefix: str) -> set[str]:
    """The transactional ids `prefix` + a task number whose transaction is open (Ongoing), from
    every broker's transaction coordinator: ListTransactions with a state filter (KIP-664) and an
    id pattern (v2, KIP-1152). A broker that does not answer is skipped (the next batch asks again)."""
    return asyncio.run(_open_transactions(opts, prefix))


async def _open_transactions(opts: SinkOptions, prefix: str) -> set[str]:
    sec = _security(opts)
    brokers = AdminClient(shared_config(opts)).list_topics(timeout=30).brokers.values()
    req = ListTransactionsRequest(state_filters=["Ongoing"], producer_id_filters=[], duration_filter=-1,
                                  transactional_id_pattern=re.escape(prefix) + r"\d+")

    async def ask(host: str, port: int) -> list[str]:
        try:
            async with NodeClient(host, port, client_id="strata-spark-sink", timeout=10.0, security=sec) as c:
                r = await c.request(req, 2)
        except ClientError:
            return []
        return [] if r.error_code else [t.transactional_id for t in r.transaction_states]

    found = await asyncio.gather(*(ask(str(b.host), int(b.port)) for b in brokers))
    return {tid for ids in found for tid in ids if tid.startswith(prefix)}


def fence_transactions(opts: SinkOptions, ids: set[str]) -> None:
    """Abort the open transaction of each id as a new producer of the id does: InitProducerId
    bumps the epoch, aborts what the old epoch left open and fences its producer (KIP-98)."""
    for tid in sorted(ids):
        p = Producer(shared_config(opts) | {"transactional.id": tid})
        try:
            p.init_transactions(60)
        except KafkaException as e:
            raise SinkError(f"transactional.id {tid}: cannot abort its open transaction: {e.args[0].str()}") from None


# ---------------------------------------------------------------- the commit log
@dataclass(frozen=True)
class Decision:
    batch: int
    txns: tuple[Txn, ...]


class CommitLog:
    """Per query, the last micro-batch whose commit was decided, keyed by the query's id."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.topic = opts.commit_log_topic

    def ensure(self) -> None:
        admin = AdminClient(shared_config(self.opts))
        md = admin.list_topics(timeout=30)
        if self.topic in md.topics and not md.topics[self.topic].error:
            return
        rf = min(3, len(md.brokers))
        try:
            admin.create_topics([NewTopic(self.topic, 1, rf, config={"cleanup.policy": "compact",
                                                                  "min.insync.replicas": str(min(2, rf))})
                                 ])[self.topic].result(30)
        except KafkaException as e:
            if "TOPIC_ALREADY_EXISTS" not in str(e) and "already exists" not in str(e):
                raise SinkError(f"commitLogTopic: cannot create {self.topic}: {e}") from None

    def read(self, query: str) -> Decision | None:
        cfg = shared_config(self.opts) | {"group.id": "strata-spark-sink", "enable.auto.commit": "false",
                                          "isolation.level": "read_committed", "enable.partition.eof": "true",
                                          # the end is what is asked for: a Fetch there returns at
                                          # once instead of being held for new records
                                          "fetch.wait.max.ms": 10}
        c = Consumer(cfg)
        # its partition's leader known and connected before the assign: otherwise librdkafka
        # starts the fetcher half a second later (a failure here is left to the loop below)
        try:
            c.list_topics(self.topic, timeout=10)
        except KafkaException:
            pass
        # To the partition's end (the EOF event), not to a high watermark asked first: a leader
        # that has just died makes that question time out, while the fetcher follows the new one.
        c.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        found = None
        deadline = time.monotonic() + 90
        try:
            while True:
                if time.monotonic() > deadline:
                    raise SinkError(f"commitLogTopic {self.topic}: not read to its end within 90s")
                m = c.poll(1.0)
                if m is None:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        break
                    if err.retriable() or not err.fatal():
                        continue  # a leader moving: the consumer goes on by itself
                    raise SinkError(f"commitLogTopic {self.topic}: {err}")
                if m.key() == query.encode():
                    found = m.value()
        finally:
            c.close()
        if found is None:
            return None
        d = json.loads(found)
        return Decision(int(d["batch"]), tuple(Txn(str(t), int(p), int(e)) for t, p, e in d["txns"]))

    def write(self, query: str, decision: Decision) -> None:
        # One record, so no idempotence: a retry can at worst write the same decision twice, which
        # reads the same (the last record of the key wins). An idempotent producer first waits for
        # its producer id, which librdkafka asks for up to 500 ms after it starts.
        p = Producer(shared_config(self.opts) | {"acks": "all", "enable.idempotence": "false"})
        body = json.dumps({"batch": decision.batch, "txns": [t.to_json() for t in decision.txns]})
        errors: list[str] = []
        p.produce(self.topic, key=query.encode(), value=body.encode(), partition=0,
                  on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
        if p.flush(60) or errors:
            raise SinkError(f"commitLogTopic {self.topic}: the decision for batch {decision.batch} was not "
                            f"written: {errors or 'not acknowledged within 60s'}")
