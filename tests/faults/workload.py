"""The workload of a fault run: idempotent acks=all producers writing `<producer>:<sequence>`
values round robin over a topic's partitions; a transactional producer writing a few values to
random partitions per transaction and committing most (aborting the rest), or, with
`read_process_write`, two that read, process and write (each transaction polls what its
read_committed consumer has, writes a few values to partitions of its own, sends its consumer's
offsets and commits most); a read_committed consumer reading as they come; and a final
read_committed read of every partition from its start; all of it recorded into a
checker.History (with what each transaction read, for the checker's dependency cycles)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.faults.checker import History, Read


def _silent_logger() -> logging.Logger:
    """confluent-kafka calls `logger.log(...)` from whichever call polls (commit_transaction
    too), so the sink must be a Logger: a plain function made that call raise AttributeError."""
    log = logging.getLogger("tests.faults.librdkafka")
    log.propagate = False
    log.addHandler(logging.NullHandler())
    log.setLevel(logging.CRITICAL + 1)
    return log


QUIET: dict = {"log_level": 0, "logger": _silent_logger()}


def _newest(reads: list[Read]) -> dict[int, int]:
    """The newest offset read in each partition."""
    out: dict[int, int] = {}
    for p, off, _ in reads:
        out[p] = max(off, out.get(p, -1))
    return out


def _read(m) -> Read:
    value = m.value()
    return m.partition(), m.offset(), value.decode() if value is not None else ""


class Workload:
    TXN_VALUES = 3  # values per transaction
    ABORT_SHARE = 0.2
    CALL_S = 30.0  # a transaction call's timeout

    def __init__(self, bootstrap: str, topic: str, partitions: int, producers: int = 2, rate: float = 100.0,
                 txn_producers: int = 1, seed: int = 0, read_process_write: bool = False) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.producers = producers
        self.read_process_write = read_process_write
        self.txn_producers = max(txn_producers, 2) if read_process_write else txn_producers
        self.rate = rate  # values per second, per producer
        self.seed = seed
        self.history = History()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.delivery_errors: Counter[str] = Counter()  # error name -> how many

    def start(self) -> None:
        for i in range(self.producers):
            self._threads.append(threading.Thread(target=self._produce, args=(f"p{i}",), daemon=True))
        for i in range(self.txn_producers):
            self._threads.append(threading.Thread(target=self._transact, args=(f"t{i}", i), daemon=True))
        self._threads.append(threading.Thread(target=self._consume, daemon=True))
        for t in self._threads:
            t.start()

    def stop(self, drain_s: float = 120.0) -> None:
        """Stop sending; wait for every outstanding send's outcome (at most `drain_s`)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=drain_s + 30)

    def _produce(self, name: str) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all",
                      "linger.ms": 5, "message.timeout.ms": 120000, **QUIET})
        h = self.history

        def done(err, msg) -> None:
            if err is None:
                with self._lock:
                    h.acked[msg.value().decode()] = (msg.partition(), msg.offset())
            else:
                with self._lock:
                    self.delivery_errors[err.name()] += 1

        seq = 0
        gap = 1.0 / self.rate
        nxt = time.monotonic()
        while not self._stop.is_set():
            value = f"{name}:{seq}"
            with self._lock:
                h.attempted.add(value)
            while True:
                try:
                    p.produce(self.topic, value.encode(), partition=seq % self.partitions, on_delivery=done)
                    break
                except BufferError:
                    p.poll(0.05)
            seq += 1
            nxt += gap
            p.poll(max(0.0, nxt - time.monotonic()))
        p.flush(120)

    def _transactional(self, name: str) -> Producer:
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": f"fault-{self.topic}-{name}",
                      "transaction.timeout.ms": 60000, "message.timeout.ms": 60000, **QUIET})
        p.init_transactions(self.CALL_S)
        return p

    def _owned(self, i: int) -> list[int]:
        """The partitions transactional producer i writes: with read_process_write disjoint
        between producers, as Kafka orders no two concurrent transactions writing one partition
        (see checker, G0); else any."""
        mine = [p for p in range(self.partitions) if p % self.txn_producers == i]
        return mine if self.read_process_write and mine else list(range(self.partitions))

    def _transact(self, name: str, i: int) -> None:
        """Transactions one after the other: (with read_process_write: poll what the
        read_committed consumer has,) write TXN_VALUES values, (send the consumer's offsets,)
        commit (or abort). A
        failed call leaves the outcome unknown (the checker then asks only that it be all or
        nothing); an abortable error is aborted, anything else starts a new producer (fencing the
        old)."""
        rng = random.Random(f"{self.seed}-{name}")
        h = self.history
        seq = 0
        p: Producer | None = None
        c: Consumer | None = None
        reads: list[Read] = []
        if self.read_process_write:
            c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"fault-rw-{self.topic}-{name}",
                          "enable.auto.commit": False, "isolation.level": "read_committed", **QUIET})
            # from the end: what other transactions commit from now on (the live reader reads it all)
            c.assign([TopicPartition(self.topic, q, OFFSET_END) for q in range(self.partitions)])
            with self._lock:
                h.reads.append(reads)
        owned = self._owned(i)
        while not self._stop.is_set():
            try:
                if p is None:
                    p = self._transactional(name)
                p.begin_transaction()
            except KafkaException:
                p = None
                self._stop.wait(0.5)
                continue
            values = [f"{name}:{seq + k}" for k in range(self.TXN_VALUES)]
            seq += self.TXN_VALUES
            read = [_read(m) for m in c.consume(50, 0.02) if m.error() is None] if c is not None else []
            reads.extend(read)
            with self._lock:
                h.attempted.update(values)
            with self._lock:  # its index taken under the lock: other transactional producers append too
                h.txns.append((values, "unknown"))
                at = len(h.txns) - 1
                h.txn_reads[at] = [v for _, _, v in read]
            try:
                for v in values:
                    p.produce(self.topic, v.encode(), partition=rng.choice(owned))
                if c is not None and read:
                    p.send_offsets_to_transaction(
                        [TopicPartition(self.topic, q, off + 1) for q, off in _newest(read).items()],
                        c.consumer_group_metadata(), self.CALL_S)
                if rng.random() < self.ABORT_SHARE:
                    p.abort_transaction(self.CALL_S)
                    outcome = "aborted"
                else:
                    p.commit_transaction(self.CALL_S)
                    outcome = "committed"
                with self._lock:
                    h.txns[at] = (values, outcome)
            except KafkaException as e:
                err = e.args[0] if e.args else None
                with self._lock:
                    self.delivery_errors[f"txn:{err.name() if err else e}"] += 1
                try:
                    if err is not None and err.txn_requires_abort():
                        p.abort_transaction(self.CALL_S)
                        with self._lock:
                            h.txns[at] = (values, "aborted")
                    else:
                        p = None
                except KafkaException:
                    p = None
            self._stop.wait(self.txn_producers / self.rate * self.TXN_VALUES)  # `rate` values/s in all
        if c is not None:
            c.close()
        if p is None:
            # A producer dropped after a failed call may have left its transaction open, holding
            # the last stable offset (and the final read) back until transaction.timeout.ms: a
            # new one with the same transactional.id fences it, and its transaction ends (KIP-98).
            try:
                self._transactional(name)
            except KafkaException as e:
                with self._lock:
                    self.delivery_errors[f"txn:final init: {e}"] += 1

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "fault-reader", "enable.auto.commit": False,
                      "isolation.level": "read_committed", **QUIET})
        c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
        reads: list[Read] = []
        self.history.reads.append(reads)
        while not self._stop.is_set():
            for m in c.consume(500, 0.2):
                if m.error() is None:
                    reads.append(_read(m))
        c.close()

    def final_read(self, timeout: float = 120.0) -> None:
        """Every partition from its start up to its high watermark, into history.final."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "fault-final", "enable.auto.commit": False,
                      "enable.partition.eof": True, "isolation.level": "read_committed", **QUIET})
        ends = {}
        deadline = time.monotonic() + timeout
        for p in range(self.partitions):
            while True:
                try:
                    ends[p] = c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)])
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < self.partitions and time.monotonic() < deadline:
            for m in c.consume(1000, 1.0):
                p, off, value = _read(m)
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF and off >= ends[p]:
                        done.add(p)
                    continue
                self.history.final.append((p, off, value))
                if off + 1 >= ends[p]:
                    done.add(p)
        c.close()
        if len(done) < self.partitions:
            raise TimeoutError(f"final read of {self.topic} incomplete: partitions {sorted(set(ends) - done)} not read "
                               f"to their ends {ends} (read {len(self.history.final)} records)")
