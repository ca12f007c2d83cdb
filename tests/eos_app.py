"""The exactly-once application of tests/test_eos_loop.py, run as its own process (the way an EOS
application runs, and so that a librdkafka handle stuck in C dies with the process, not with the
test run): `python -m tests.eos_app BOOTSTRAP TOTAL [SCENARIO]`.

It consumes eos-in with read_committed, produces each transformed message to eos-out and commits
its input offsets in the same transaction (send_offsets_to_transaction); on an abortable error it
aborts and rewinds to the committed offsets, on a fatal one it starts a new producer (which
fences the old). It talks to the test over stdin/stdout, one JSON object a line: once a third of
the input is committed it writes {"kill": ...} from inside an open transaction (records and
offsets sent, not committed) and waits for a line back, the test having killed the coordinator's
broker; at the end it writes {"done": {...counters}}.

librdkafka (2.10 and later, upstream issue #5511) can leave send_offsets_to_transaction waiting
forever, past its timeout, when the group coordinator's broker dropped out of the metadata while
fenced: the request waits on a broker handle that no longer exists. The application does what an
EOS application does with a producer it cannot use: it starts a new one with the same
transactional.id, which fences the stuck one and aborts its transaction, and goes on from the
committed offsets. The count of such restarts is reported; any other call that hangs fails.

Scenarios (the fault comes once a third of the input is committed):
- `kill-coordinator` (default): the test kill -9s the coordinator's broker, as above.
- `stuck-send-offsets`: no broker dies; send_offsets_to_transaction does its work and then never
  returns, as librdkafka's does in that stall, so the remedy runs every time and its output can
  be checked (the stall itself cannot be provoked at will).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

PARTITIONS = 4
TXN_ID = "eos-loop"
GROUP = "eos-loop-group"
BATCH = 2000
KILL_COORDINATOR = "kill-coordinator"
STUCK_SEND_OFFSETS = "stuck-send-offsets"
SCENARIOS = (KILL_COORDINATOR, STUCK_SEND_OFFSETS)
SEND_OFFSETS_STALL_S = 20.0  # send_offsets_to_transaction takes milliseconds when it works
CALL_LIMIT_S = 90.0  # any other transaction call still blocked after this has hung
RUN_LIMIT_S = 150.0
# The steps of one transaction may each take up to their own limit past RUN_LIMIT_S; past this the
# application reports the step it is in and exits, inside the tests' own limit (240 s).
WATCHDOG_S = 200.0
# what OffsetFetch answers while the group's coordinator moves (Kafka's retriable errors)
COORDINATOR_MOVED = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                     KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT)


class ClientCallHung(Exception):
    """A librdkafka call did not return in time (it stays blocked in its thread)."""


def bounded(limit: float, fn: Any, *args: Any) -> Any:
    """Run one blocking librdkafka call in a daemon thread and give up on it after `limit` s."""
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # handed to the caller
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        raise ClientCallHung(f"{getattr(fn, '__name__', fn)} still blocked after {limit:.0f}s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


def stalls_after(call: Any) -> Any:
    """`call`, made to block forever once it has done its work (librdkafka's stall)."""

    def stalled(*args: Any) -> None:
        call(*args)
        threading.Event().wait()

    stalled.__name__ = getattr(call, "__name__", "call")
    return stalled


def say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


STARTED = time.monotonic()


def note(what: str) -> None:
    """One line to stderr (the test's captured output) for each fault-handling step."""
    sys.stderr.write(f"eos_app +{time.monotonic() - STARTED:.1f}s {what}\n")
    sys.stderr.flush()


class Loop:
    def __init__(self, bootstrap: str, total: int, scenario: str = KILL_COORDINATOR) -> None:
        self.bootstrap = bootstrap
        self.total = total
        self.scenario = scenario
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP,
                                  "isolation.level": "read_committed", "enable.auto.commit": False,
                                  "auto.offset.reset": "earliest"})
        self.parts = [TopicPartition("eos-in", p) for p in range(PARTITIONS)]
        self.consumer.assign([TopicPartition("eos-in", p, 0) for p in range(PARTITIONS)])
        self.stuck: list[Producer] = []  # never destroyed: their calls are still blocked
        self.counts = {"committed_messages": 0, "aborts": 0, "new_producers": 0, "commit_retries": 0,
                       "stuck_send_offsets": 0}
        self.producer = self._new_producer()
        self.faulted = False  # the scenario's fault has happened
        self.deadline = time.monotonic() + RUN_LIMIT_S
        self.step = "starting"  # what the loop is doing, for the watchdog's report

    def _new_producer(self) -> Producer:
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": TXN_ID, "linger.ms": 5,
                      "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
        bounded(CALL_LIMIT_S, p.init_transactions, 60)
        return p

    def _replace_producer(self) -> None:
        self.counts["new_producers"] += 1
        self.step = "init_transactions of a new producer"
        note(self.step)
        self.producer = self._new_producer()

    def rewind(self) -> None:
        """Back to the committed input offsets (what the output already holds)."""
        self.step = "rewind to the committed offsets"
        for tp in self._committed():
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    def committed_input(self) -> int:
        return sum(max(tp.offset, 0) for tp in self._committed())

    def _committed(self) -> list[TopicPartition]:
        # Right after the coordinator's broker died, OffsetFetch may answer NOT_COORDINATOR (a
        # retriable error in Kafka; librdkafka's committed() hands it back unflagged): ask again.
        while True:
            try:
                return self.consumer.committed(self.parts, timeout=30)
            except KafkaException as e:
                err: KafkaError = e.args[0]
                if not (err.retriable() or err.code() in COORDINATOR_MOVED) or time.monotonic() > self.deadline:
                    raise
                note(f"committed(): {err}, asking again")
                time.sleep(0.2)

    def one_transaction(self) -> int:
        """Consume a batch, produce its transform, commit both; returns how many were consumed."""
        self.step = "consume"
        msgs = [m for m in self.consumer.consume(BATCH, 1.0) if m.error() is None]
        if not msgs:
            return 0
        p = self.producer
        try:
            self.step = "begin_transaction and produce"
            p.begin_transaction()
            for m in msgs:
                while True:
                    try:
                        p.produce("eos-out", b"out-" + m.value(), partition=m.partition())
                        break
                    except BufferError:
                        p.poll(0.05)
            positions = self.consumer.position(self.parts)
            send_offsets = p.send_offsets_to_transaction
            if self._fault_due(STUCK_SEND_OFFSETS):
                send_offsets = stalls_after(send_offsets)
                self.faulted = True
            self.step = "send_offsets_to_transaction"
            try:
                bounded(SEND_OFFSETS_STALL_S, send_offsets, positions, self.consumer.consumer_group_metadata(), 60)
            except ClientCallHung:
                if not self.faulted:
                    raise  # the known stall follows a fault; anything else is a failure
                self.counts["stuck_send_offsets"] += 1
                note(f"send_offsets_to_transaction stuck for {SEND_OFFSETS_STALL_S:.0f}s: replacing the producer")
                self.stuck.append(p)
                self._replace_producer()
                self.rewind()
                return len(msgs)
            if self._fault_due(KILL_COORDINATOR):
                say(kill=self.counts["committed_messages"])
                sys.stdin.readline()  # the test has killed the coordinator's broker
                self.faulted = True
            self._commit(p)
            self.counts["committed_messages"] += len(msgs)
        except KafkaException as e:
            err: KafkaError = e.args[0]
            note(f"{self.step}: {err}")
            if err.fatal():
                self._replace_producer()
            else:
                self.counts["aborts"] += 1
                self._abort(p)
            self.rewind()
        return len(msgs)

    def _fault_due(self, scenario: str) -> bool:
        return (self.scenario == scenario and not self.faulted
                and self.counts["committed_messages"] >= self.total // 3)

    def _commit(self, p: Producer) -> None:
        self.step = "commit_transaction"
        while True:
            try:
                bounded(CALL_LIMIT_S, p.commit_transaction, 60)
                return
            except KafkaException as e:
                if not e.args[0].retriable() or time.monotonic() > self.deadline:
                    raise
                self.counts["commit_retries"] += 1
                note(f"commit_transaction: {e.args[0]}, again")
                time.sleep(0.2)

    def _abort(self, p: Producer) -> None:
        self.step = "abort_transaction"
        while True:
            try:
                bounded(CALL_LIMIT_S, p.abort_transaction, 60)
                return
            except KafkaException as e:
                if e.args[0].fatal():
                    self._replace_producer()
                    return
                if not e.args[0].retriable() or time.monotonic() > self.deadline:
                    raise
                time.sleep(0.2)

    def run(self) -> None:
        while True:
            if time.monotonic() > self.deadline:
                raise SystemExit(f"only {self.counts['committed_messages']} of {self.total} committed: {self.counts}")
            if self.one_transaction() == 0 and self.committed_input() >= self.total:
                return


def watchdog(loop: Loop) -> None:
    """Report the step a wedged loop is in (a call without a limit of its own) and leave."""
    time.sleep(max(0.0, WATCHDOG_S - (time.monotonic() - STARTED)))
    say(failed=f"still in {loop.step} after {WATCHDOG_S:.0f}s: {loop.counts}")
    os._exit(0)


def main() -> None:
    bootstrap, total = sys.argv[1], int(sys.argv[2])
    scenario = sys.argv[3] if len(sys.argv) > 3 else KILL_COORDINATOR
    try:
        if scenario not in SCENARIOS:
            raise SystemExit(f"unknown scenario {scenario!r} (one of {', '.join(SCENARIOS)})")
        loop = Loop(bootstrap, total, scenario)
        threading.Thread(target=watchdog, args=(loop,), daemon=True).start()
        loop.run()
        say(done=loop.counts)
    except BaseException as e:
        say(failed=f"{type(e).__name__}: {e}")
    # A producer stuck in C cannot be destroyed: leave without running destructors.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
