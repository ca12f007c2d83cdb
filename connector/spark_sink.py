"""The `strata` sink: `df.write.format("strata")` and `df.writeStream.format("strata")`.

Tasks get Arrow batches (pyspark's Arrow writers: no Row object per record) and hand each row to
a librdkafka producer. Batch writes are at least once (an idempotent producer, acks=all; a
retried task writes its rows again), or exactly once with `exactlyOnce=true`. Streaming writes are
exactly once: see docs/spark.md, "Writing topics from Spark", for the protocol and its crash windows, and
connector/sink_txn.py for its two halves (ending transactions from the driver, the commit log).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage

from connector.sink_options import SinkError, SinkOptions, check_schema
from connector.sink_txn import (
    CommitLog,
    Decision,
    Txn,
    end_transactions,
    fence_transactions,
    open_transactions,
    shared_config,
)

_RECORD_OVERHEAD = 61 + 21  # a batch header and one record's framing, at most (Kafka's v2 format)
# Producers whose transaction a driver is yet to end: never closed or collected here (closing a
# transactional producer aborts its transaction), released once a newer producer of the same
# transactional.id has fenced them.
_HANDED_OFF: dict[str, Producer] = {}
# A test's crash point, "task:<batch>" or "task:<batch>:<task>" (a task's rows written, its transaction open) or
# "decided:<batch>" (the commit log written, no transaction ended): SIGKILL to the driver's process
# group (STRATA_SINK_TEST_PGID: the driver and its JVM) and to this one (pyspark's daemon puts its
# Python workers in a group of their own), the way a lost driver machine ends.
_CRASH = os.environ.get("STRATA_SINK_TEST_CRASH", "")


def _crash_point(where: str, batch: int | str | None) -> None:
    if _CRASH and _CRASH == f"{where}:{batch}":
        driver = os.environ.get("STRATA_SINK_TEST_PGID")
        if driver:
            os.killpg(int(driver), signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)


@dataclass
class SinkMessage(WriterCommitMessage):
    rows: int
    txn: Txn | None = None  # the task's open transaction, for the driver to end
    query: str | None = None
    skipped: bool = False  # a replayed micro-batch whose commit was already decided


# ---------------------------------------------------------------- rows -> producer
class _Topics:
    """Partition counts and max.message.bytes of the topics a task writes to, asked once each."""

    def __init__(self, opts: SinkOptions, producer: _Producer) -> None:
        self.opts = opts
        self.producer = producer
        self.counts: dict[str, int] = {}
        self.limits: dict[str, int] = {}

    def partitions(self, topic: str) -> int:
        n = self.counts.get(topic)
        if n is None:
            md = self.producer.metadata(topic, 30, f"topic: no metadata for topic {topic!r}")
            t = md.topics.get(topic)
            if t is None or t.error is not None or not t.partitions:
                raise SinkError(f"topic: topic {topic!r} does not exist")
            n = self.counts[topic] = len(t.partitions)
        return n

    def max_bytes(self, topic: str) -> int:
        n = self.limits.get(topic)
        if n is None:
            admin = AdminClient(shared_config(self.opts))
            res = ConfigResource(ConfigResource.Type.TOPIC, topic)
            try:
                cfg = admin.describe_configs([res])[res].result(30)
                n = int(cfg["max.message.bytes"].value)
            except (KafkaException, KeyError, ValueError):
                n = 1048588  # Kafka's default
            self.limits[topic] = n
        return n


def _bytes(col: pa.Array) -> pa.Array:
    return col.cast(pa.binary()) if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) else col


def _row_of(mask: pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


class _Sender:
    def __init__(self, opts: SinkOptions, producer: _Producer) -> None:
        self.opts = opts
        self.producer = producer
        self.topics = _Topics(opts, producer)
        self.errors: list[str] = []
        self.rows = 0

    def delivered(self, err: KafkaError | None, msg) -> None:
        if err is not None and len(self.errors) < 5:
            self.errors.append(self._describe(err, msg.topic(), len(msg.value() or b"")))

    @staticmethod
    def _describe(err: KafkaError, topic: str | None, size: int) -> str:
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            return f"value: a record of {size} bytes is over max.message.bytes of topic {topic!r}"
        return f"topic {topic!r}: {err.str()}"

    def send(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if not n:
            return
        cols = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
        value = _bytes(cols["value"])
        key = _bytes(cols["key"]) if "key" in cols else None
        if self.opts.topic is not None:
            topics = [self.opts.topic]
            topic_col = None
        else:
            topic_col = cols["topic"]
            if topic_col.null_count:
                raise SinkError(f"topic: row {_row_of(pc.is_null(topic_col))} of the batch has a null topic "
                                "and no topic option is set")
            topics = pc.unique(topic_col).to_pylist()
        size = pc.fill_null(pc.binary_length(value), 0)
        if key is not None:
            size = pc.add(size, pc.fill_null(pc.binary_length(key), 0))
        headers = cols.get("headers")
        part = cols.get("partition")
        for t in topics:
            in_topic = None if topic_col is None else pc.equal(topic_col, t)
            count = self.topics.partitions(t)  # first: an unknown topic is named as such
            limit = self.topics.max_bytes(t) - _RECORD_OVERHEAD
            big = pc.greater(size, limit)
            if in_topic is not None:
                big = pc.and_(big, in_topic)
            if pc.any(big).as_py():
                i = _row_of(big)
                raise SinkError(f"value: row {i} of the batch is a record of {size[i].as_py() + _RECORD_OVERHEAD} "
                                f"bytes, over max.message.bytes ({limit + _RECORD_OVERHEAD}) of topic {t!r}")
            if part is not None and part.null_count < n:
                bad = pc.or_(pc.less(part, 0), pc.greater_equal(part, count))
                if in_topic is not None:
                    bad = pc.and_(bad, in_topic)
                if pc.any(bad).as_py():
                    i = _row_of(pc.fill_null(bad, False))
                    raise SinkError(f"partition: row {i} of the batch has partition {part[i].as_py()}, out of range: "
                                    f"topic {t!r} has partitions 0..{count - 1}")
        self._produce(n, topics[0] if topic_col is None else topic_col.to_pylist(), value.to_pylist(),
                      None if key is None else key.to_pylist(),
                      None if part is None or part.null_count == n else part.to_pylist(),
                      None if headers is None or headers.null_count == n else headers.to_pylist(),
                      size.to_pylist())

    def _produce(self, n: int, topic, values: list, keys: list | None, parts: list | None,
                 headers: list | None, sizes: list[int]) -> None:
        produce = self.producer.produce
        one_topic = isinstance(topic, str)
        if one_topic and parts is None and headers is None:  # the common case, without per-row branches
            self._produce_simple(topic, values, keys or [None] * n)
            return
        for i in range(n):
            kw: dict = {}
            t = topic if one_topic else topic[i]
            if parts is not None and parts[i] is not None:
                kw["partition"] = parts[i]
            if headers is not None and headers[i]:
                hs = kw["headers"] = [(h["key"], h["value"]) for h in headers[i]]
                total = sizes[i] + sum(len(k.encode()) + len(v or b"") + 8 for k, v in hs) + _RECORD_OVERHEAD
                if total > self.topics.max_bytes(t):
                    raise SinkError(f"headers: row {i} of the batch is a record of {total} bytes with its headers, "
                                    f"over max.message.bytes ({self.topics.max_bytes(t)}) of topic {t!r}")
            k = None if keys is None else keys[i]
            while True:
                try:
                    produce(t, values[i], k, **kw)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self.producer.poll(0.05)
                except KafkaException as e:
                    raise SinkError(self._describe(e.args[0], t, len(values[i] or b""))) from None
            if self.errors:
                raise SinkError(self.errors[0])
        self.rows += n
        self.producer.poll(0)

    def _produce_simple(self, topic: str, values: list, keys: list) -> None:
        produce = self.producer.produce
        for v, k in zip(values, keys):
            try:
                produce(topic, v, k)
            except BufferError:  # the local queue is full: let deliveries drain it, then again
                while True:
                    self.producer.poll(0.05)
                    try:
                        produce(topic, v, k)
                        break
                    except BufferError:
                        continue
            except KafkaException as e:
                raise SinkError(self._describe(e.args[0], topic, len(v or b""))) from None
        if self.errors:
            raise SinkError(self.errors[0])
        self.rows += len(values)
        self.producer.poll(0)

    def finish(self) -> None:
        deadline = time.monotonic() + int(self.opts.producer.get("message.timeout.ms", "300000")) / 1000 + 30
        while self.producer.flush(1.0):
            if self.errors or time.monotonic() > deadline:
                break
        if self.errors:
            raise SinkError(self.errors[0])
        if len(self.producer):
            raise SinkError("records not acknowledged within message.timeout.ms")


class _Producer(Producer):
    """librdkafka's producer, keeping its last client-level error (a failed SASL handshake, a TLS
    error): a task that cannot reach the cluster says why, not only "transport failure"."""

    def __init__(self, conf: dict) -> None:
        self.last_error = ""
        self.refused = False  # the cluster refused our credentials (SASL) or TLS handshake
        super().__init__({**conf, "error_cb": self._error})

    def _error(self, err: KafkaError) -> None:
        self.last_error = err.str()
        if err.code() in _REFUSED:
            self.refused = True

    def metadata(self, topic: str | None, timeout: float, what: str) -> ClusterMetadata:
        """Metadata (all topics, or `topic`), asked in slices of a second so that a refused
        login ends the wait at once instead of after `timeout`; failing, a SinkError that starts
        with `what` and names the client's error."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.list_topics(topic=topic, timeout=1.0)
            except KafkaException as e:
                self.poll(0)  # runs error_cb: why no broker answered (authentication, TLS)
                if self.refused or time.monotonic() >= deadline:
                    why = f" ({self.last_error})" if self.last_error else ""
                    raise SinkError(f"{what}: {e.args[0].str()}{why}") from None


# librdkafka retries these until the request's timeout; Kafka's own clients fail at once
# (AuthenticationException, SslAuthenticationException), and so does a task here
_REFUSED = (KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError.SASL_AUTHENTICATION_FAILED)


def _producer(opts: SinkOptions, sender_box: list, extra: dict | None = None) -> _Producer:
    def delivered(err, msg) -> None:
        if sender_box:
            sender_box[0].delivered(err, msg)

    conf: dict = dict(opts.producer)
    conf.update(extra or {})
    conf["on_delivery"] = delivered
    conf.setdefault("delivery.report.only.error", True)
    try:
        return _Producer(conf)
    except KafkaException as e:
        raise SinkError(f"kafka.* producer settings: {e.args[0].str()}") from None
    except (TypeError, ValueError) as e:
        raise SinkError(f"kafka.* producer settings: {e}") from None


def write_plain(opts: SinkOptions, batches: Iterator[pa.RecordBatch]) -> SinkMessage:
    """At least once: an idempotent producer; Spark's retry of a failed task writes its rows again."""
    box: list = []
    p = _producer(opts, box)
    s = _Sender(opts, p)
    box.append(s)
    for b in batches:
        s.send(b)
    s.finish()
    return SinkMessage(rows=s.rows)


class _Stats:
    """The producer id and epoch, which librdkafka shows only in its statistics (`eos`)."""

    def __init__(self) -> None:
        self.seen = threading.Event()
        self.after = 0.0
        self.pid_epoch: tuple[int, int] | None = None

    def __call__(self, text: str) -> None:
        if self.seen.is_set() or time.monotonic() < self.after:
            return  # known already (a long write keeps the statistics coming), or from before init
        eos = json.loads(text).get("eos") or {}
        if eos.get("producer_id", -1) >= 0:
            self.pid_epoch = (int(eos["producer_id"]), int(eos["producer_epoch"]))
            self.seen.set()


def write_transactional(opts: SinkOptions, batches: Iterator[pa.RecordBatch], txn_id: str,
                        query: str | None = None) -> SinkMessage:
    """Write every row inside one transaction that is left open for the driver to end. Taking the
    transactional.id first fences and aborts whatever an earlier attempt of this task left open."""
    box: list = []
    stats = _Stats()
    # the statistics are how the producer id is learnt (below): every 100 ms, so a task hands its
    # transaction off within about that of its last row, not up to a second later
    p = _producer(opts, box, {"transactional.id": txn_id, "stats_cb": stats, "statistics.interval.ms": 100})
    # librdkafka looks for the transaction coordinator only through a broker it is connected
    # to, and with none yet it retries 500 ms later: a Metadata request first makes that
    # connection, and a micro-batch's task starts writing about half a second sooner
    p.metadata(None, 30, f"transactional.id {txn_id}: no broker answered")
    try:
        p.init_transactions(60)
    except KafkaException as e:
        raise SinkError(f"transactional.id {txn_id}: init_transactions failed: {e.args[0].str()}") from None
    stats.after = time.monotonic()
    old = _HANDED_OFF.pop(txn_id, None)  # fenced by the init above: its transaction is over
    del old
    p.begin_transaction()
    s = _Sender(opts, p)
    box.append(s)
    try:
        for b in batches:
            s.send(b)
        s.finish()
    except BaseException:
        try:
            p.abort_transaction(30)
        except KafkaException:
            pass  # the next attempt's init_transactions fences it anyway
        raise
    if not s.rows:
        p.commit_transaction(30)  # nothing was added: no transaction on the brokers to hand off
        return SinkMessage(rows=0, query=query)
    deadline = time.monotonic() + 10
    while not stats.seen.is_set() and time.monotonic() < deadline:
        p.poll(0.1)
    if stats.pid_epoch is None:
        p.abort_transaction(30)
        raise SinkError(f"transactional.id {txn_id}: librdkafka reported no producer id")
    _HANDED_OFF[txn_id] = p
    return SinkMessage(rows=s.rows, txn=Txn(txn_id, *stats.pid_epoch), query=query)


# ---------------------------------------------------------------- the writers
def _task_context() -> tuple[int, str | None, str | None]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, None, None
    return ctx.partitionId(), ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty(
        "streaming.sql.batchId")


class StrataBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkMessage:  # type: ignore[override]
        if not self.opts.exactly_once:
            return write_plain(self.opts, iterator)
        partition, _, _ = _task_context()
        prefix = self.opts.txn_prefix or "strata-spark"
        return write_transactional(self.opts, iterator, f"{prefix}-{self.opts.run_id}-{partition}")

    def commit(self, messages) -> None:  # type: ignore[override]
        end_transactions(self.opts, [m.txn for m in messages if m is not None and m.txn], commit=True)

    def abort(self, messages) -> None:  # type: ignore[override]
        _abort_quietly(self.opts, messages)


def _abort_quietly(opts: SinkOptions, messages) -> None:
    try:
        end_transactions(opts, [m.txn for m in messages if m is not None and m.txn], commit=False, timeout=30)
    except SinkError:
        pass  # left open, the next attempt of the same transactional.id fences it (or its timeout ends it)


def _txn_prefix(query: str) -> str:
    """A streaming task's transactional.id is this and its task (Spark partition) number."""
    return f"strata-spark-{query}-"


class StrataStreamWriter(DataSourceStreamArrowWriter):
    """Exactly once per micro-batch; see the module docstring."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkMessage:  # type: ignore[override]
        partition, query_id, batch = _task_context()
        if not self.opts.exactly_once:
            return write_plain(self.opts, iterator)
        query = self.opts.txn_prefix or query_id
        if query is None or batch is None:
            raise SinkError("exactly-once streaming writes need Spark's query id and batch id (task properties)")
        first = next((b for b in iterator if b.num_rows), None)
        if first is None:  # nothing to write: no commit log read, no transaction (a replay plans the same rows)
            return SinkMessage(rows=0, query=query)
        iterator = itertools.chain([first], iterator)
        decided = CommitLog(self.opts).read(query)
        if decided is not None and decided.batch >= int(batch):
            return SinkMessage(rows=0, query=query, skipped=True)  # written and decided before a restart
        msg = write_transactional(self.opts, iterator, f"{_txn_prefix(query)}{partition}", query)
        _crash_point("task", batch)
        _crash_point("task", f"{batch}:{partition}")
        return msg

    def commit(self, messages, batchId: int) -> None:  # type: ignore[override]
        if not self.opts.exactly_once:
            return
        msgs = [m for m in messages if m is not None]
        query = next((m.query for m in msgs if m.query), None)
        if query is None:
            return  # no task ran: nothing was written
        log = CommitLog(self.opts)
        txns = tuple(m.txn for m in msgs if m.txn is not None)
        if any(m.skipped for m in msgs):
            if txns:
                raise SinkError(f"batch {batchId}: tasks disagree on whether it was already committed")
            decided = log.read(query)
            if decided is not None and decided.batch == batchId:
                end_transactions(self.opts, list(decided.txns), commit=True)  # roll the decision forward
            self._abort_leftovers(query)
            return
        if not txns:
            # every task was empty; no sweep either: a decision not yet rolled forward could be open
            return
        log.write(query, Decision(batchId, txns))  # the commit point
        _crash_point("decided", batchId)
        end_transactions(self.opts, list(txns), commit=True)
        self._abort_leftovers(query)

    def _abort_leftovers(self, query: str) -> None:
        """Abort the query's transactions that an earlier attempt of a batch left open under ids
        this attempt did not take (it ran fewer tasks): this batch's decision is written and its
        transactions ended, and Spark started this batch only once the one before was ended, so
        any of the query's ids still open is such a leftover (sink_txn's module docstring)."""
        fence_transactions(self.opts, open_transactions(self.opts, _txn_prefix(query)))

    def abort(self, messages, batchId: int) -> None:  # type: ignore[override]
        if self.opts.exactly_once:
            _abort_quietly(self.opts, messages)


def make_writer(options, schema, overwrite: bool, *, streaming: bool):
    if overwrite and not streaming:
        raise SinkError("save mode Overwrite is not supported: a topic is not overwritten; use mode('append')")
    opts = SinkOptions.parse(options, streaming=streaming)
    check_schema(schema, opts.topic)
    if streaming and opts.exactly_once:
        CommitLog(opts).ensure()
    return StrataStreamWriter(opts) if streaming else StrataBatchWriter(opts)


__all__ = ["StrataBatchWriter", "StrataStreamWriter", "SinkMessage", "make_writer"]
