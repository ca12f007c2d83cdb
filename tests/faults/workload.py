"""The workload of a fault run: idempotent acks=all producers writing `<producer>:<sequence>`
values round robin over a topic's partitions, a consumer reading them as they come, and a final
read of every partition from its start; all of it recorded into a checker.History."""

from __future__ import annotations

import threading
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.faults.checker import History, Read

QUIET: dict = {"log_level": 0, "logger": lambda *a: None}


def _read(m) -> Read:
    value = m.value()
    return m.partition(), m.offset(), value.decode() if value is not None else ""


class Workload:
    def __init__(self, bootstrap: str, topic: str, partitions: int, producers: int = 2, rate: float = 100.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.producers = producers
        self.rate = rate  # values per second, per producer
        self.history = History()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.delivery_errors: dict[str, int] = {}

    def start(self) -> None:
        for i in range(self.producers):
            self._threads.append(threading.Thread(target=self._produce, args=(f"p{i}",), daemon=True))
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
                    self.delivery_errors[err.name()] = self.delivery_errors.get(err.name(), 0) + 1

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

    def _consume(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "fault-reader", "enable.auto.commit": False,
                      "isolation.level": "read_uncommitted", **QUIET})
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
                      "enable.partition.eof": True, **QUIET})
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
            raise TimeoutError(f"final read incomplete: partitions {sorted(set(ends) - done)} not read to their end")
