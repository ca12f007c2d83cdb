"""kafka-console-producer.sh for Strata: one record per line of standard input, as Kafka's
ConsoleProducer with its LineMessageReader.

  --bootstrap-server B --topic T
  [--property parse.key=true --property key.separator=:]      key<SEP>value
  [--property parse.headers=true]                              h1:v1,h2:v2<TAB>[key<TAB>]value
  (headers.delimiter, headers.separator, headers.key.separator, null.marker, ignore.error)
  [--request-required-acks all|-1|0|1] [--producer-property acks=1 ...] [--producer.config F]
  [--compression-codec none|gzip|snappy|lz4|zstd] [--sync] [--message-send-max-retries N]
  [--request-timeout-ms N] [--retry-backoff-ms N] [--batch-size N] [--reader-config F]

Records with a key go to Kafka's partition (murmur2 of the key modulo the partition count), the
others spread over the partitions, one batch each in turn. acks=all (the default) is idempotent,
as Kafka's producer: a producer id and a sequence per partition, so a retried batch is written
once. Lines are sent as they arrive (each batch waits for its answer before the next; --sync
sends one record a request). The topic must exist (Kafka's producer would have the broker
auto-create it): an unknown topic, an unparsable line or a record the broker refuses ends the
tool with one line on stderr and exit 1, after what was read before it is sent. Bad arguments
exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from client.partitioner import murmur2
from protocol.errors import ERRORS, Errors, error_message
from protocol.generated.init_producer_id import InitProducerIdRequest
from protocol.generated.produce import ProduceRequest
from protocol.records import Header, Record, encode_batch
from protocol.records.compression import Compression
from tools.admin import AdminError, ToolArgumentParser, admin_for, ranged_int, run_tool
from tools.brokers import Brokers, tp_str
from tools.console import int_prop, is_true, key_value, merged, read_properties, unescape

CODECS = {"none": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY,
          "lz4": Compression.LZ4, "zstd": Compression.ZSTD}
ACKS = {"all": -1, "-1": -1, "0": 0, "1": 1}
EOF = object()


class LineError(AdminError):
    """A line the reader cannot parse."""


@dataclass
class LineReader:
    """Kafka's LineMessageReader: [headers<DELIM>][key<SEP>]value."""

    parse_key: bool = False
    key_separator: str = "\t"
    parse_headers: bool = False
    headers_delimiter: str = "\t"
    headers_separator: str = ","
    headers_key_separator: str = ":"
    null_marker: str | None = None
    ignore_error: bool = False

    @classmethod
    def from_props(cls, props: dict[str, str]) -> LineReader:
        r = cls(
            parse_key=is_true(props, "parse.key"),
            key_separator=unescape(props.get("key.separator", "\t")),
            parse_headers=is_true(props, "parse.headers"),
            headers_delimiter=unescape(props.get("headers.delimiter", "\t")),
            headers_separator=unescape(props.get("headers.separator", ",")),
            headers_key_separator=unescape(props.get("headers.key.separator", ":")),
            null_marker=unescape(props["null.marker"]) if "null.marker" in props else None,
            ignore_error=is_true(props, "ignore.error"),
        )
        names = {"headers.delimiter": r.headers_delimiter, "headers.separator": r.headers_separator,
                 "headers.key.separator": r.headers_key_separator}
        pairs = list(names.items())
        for i, (a, va) in enumerate(pairs):
            for b, vb in pairs[i + 1:]:
                if va == vb:
                    raise AdminError(f"{a} and {b} may not be equal")
        if r.null_marker is not None:
            for name, v in [("key.separator", r.key_separator), *pairs]:
                if v == r.null_marker:
                    raise AdminError(f"null.marker and {name} may not be equal")
        for name, v in [("key.separator", r.key_separator), *pairs]:
            if not v:
                raise AdminError(f"{name} may not be empty")
        return r

    def _cut(self, enabled: bool, line: str, start: int, sep: str, what: str, number: int) -> str | None:
        if not enabled:
            return None
        i = line.find(sep, start)
        if i < 0:
            if self.ignore_error:
                return None
            raise LineError(f"No {what} found on line number {number}: '{line[:200]}'")
        return line[start:i]

    def record(self, line: str, number: int) -> Record:
        headers = self._cut(self.parse_headers, line, 0, self.headers_delimiter, "headers delimiter", number)
        at = 0 if headers is None else len(headers) + len(self.headers_delimiter)
        key = self._cut(self.parse_key, line, at, self.key_separator, "key separator", number)
        at += 0 if key is None else len(key) + len(self.key_separator)
        value = line[at:]
        rec = Record(value=self._bytes(value), key=self._bytes(key), timestamp=int(time.time() * 1000))
        if headers is not None and headers != self.null_marker:
            rec.headers = [self._header(pair, number) for pair in headers.split(self.headers_separator)]
        return rec

    def _bytes(self, s: str | None) -> bytes | None:
        return None if s is None or s == self.null_marker else s.encode()

    def _header(self, pair: str, number: int) -> Header:
        i = pair.find(self.headers_key_separator)
        if i < 0:
            if self.ignore_error:
                return Header(pair, None)
            raise LineError(f"No header key separator found in pair '{pair[:100]}' on line number {number}")
        key = pair[:i]
        if key == self.null_marker:
            raise LineError(f"Header keys should not be equal to the null marker '{self.null_marker}' as they "
                            "can't be null")
        return Header(key, self._bytes(pair[i + len(self.headers_key_separator):]))


class Producer:
    """Sends rounds of records: each round one batch per partition, one request per leader, all
    answered (or retried) before the next round starts, so records keep their order."""

    def __init__(self, brokers: Brokers, topic: str, *, acks: int, compression: int, retries: int,
                 backoff: float, request_timeout_ms: int, idempotent: bool) -> None:
        self.brokers = brokers
        self.topic = topic
        self.acks = acks
        self.compression = compression
        self.retries = retries
        self.backoff = backoff
        self.request_timeout_ms = request_timeout_ms
        self.idempotent = idempotent
        self.partitions: list[int] = []
        self.count = 0
        self.pid, self.epoch = -1, -1
        self.sequence: dict[int, int] = {}
        self._next_keyless = 0

    async def start(self) -> None:
        await self.refresh()
        if self.idempotent:
            resp = await self.brokers.admin.request(InitProducerIdRequest(transactional_id=None,
                                                                          transaction_timeout_ms=-1))
            if resp.error_code:
                raise AdminError(f"cannot get a producer id: {error_message(resp.error_code)}", resp.error_code)
            self.pid, self.epoch = resp.producer_id, resp.producer_epoch

    async def refresh(self) -> None:
        topics = await self.brokers.topics([self.topic])
        t = topics.get(self.topic)
        if t is None:
            raise AdminError(f"topic '{self.topic}' does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
        if t.error_code:
            raise AdminError(f"topic '{self.topic}': {error_message(t.error_code)}", t.error_code)
        self.partitions = sorted(p.partition_index for p in t.partitions if not p.marked_for_deletion)
        n = t.undeleted_partition_count
        self.count = n if n > 0 else len(t.partitions)

    def partition_of(self, rec: Record) -> int:
        if rec.key is not None:
            return (murmur2(rec.key) & 0x7FFFFFFF) % self.count
        return -1

    async def send(self, records: list[Record], max_batch: int) -> None:
        by_partition: dict[int, list[Record]] = {}
        keyless = self.partitions[self._next_keyless % len(self.partitions)]
        self._next_keyless += 1
        for rec in records:
            p = self.partition_of(rec)
            by_partition.setdefault(keyless if p < 0 else p, []).append(rec)
        pending = {p: [recs[i:i + max_batch] for i in range(0, len(recs), max_batch)]
                   for p, recs in by_partition.items()}
        while pending:  # one batch per partition a round
            batch = {p: chunks.pop(0) for p, chunks in pending.items()}
            pending = {p: chunks for p, chunks in pending.items() if chunks}
            await self._send_round(batch)

    async def _send_round(self, batches: dict[int, list[Record]]) -> None:
        encoded = {p: encode_batch(recs, compression=self.compression, producer_id=self.pid,
                                   producer_epoch=self.epoch,
                                   base_sequence=self.sequence.get(p, 0) if self.idempotent else -1)
                   for p, recs in batches.items()}
        todo = dict(encoded)
        last: dict[int, tuple[int, str | None]] = {}
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff)
                await self.refresh()
            by_leader: dict[int, list[int]] = {}
            for p in todo:
                by_leader.setdefault(self.brokers.leaders.get((self.topic, p), -1), []).append(p)
            results = await asyncio.gather(*(self._send_to(leader, {p: todo[p] for p in ps})
                                             for leader, ps in by_leader.items()))
            for res in results:
                for p, (code, msg) in res.items():
                    if code in (0, Errors.DUPLICATE_SEQUENCE_NUMBER):
                        todo.pop(p, None)
                        self.sequence[p] = self.sequence.get(p, 0) + len(batches[p])
                        continue
                    last[p] = (code, msg)
                    err = ERRORS.get(code)
                    if err is None or not err.retriable:
                        raise self._failure(p, len(batches[p]), code, msg)
            if not todo:
                return
        p = min(todo)
        raise self._failure(p, len(batches[p]), *last.get(p, (Errors.REQUEST_TIMED_OUT, None)))

    def _failure(self, p: int, n: int, code: int, msg: str | None) -> AdminError:
        detail = " ".join((msg or error_message(code)).split())
        return AdminError(f"{n} record(s) to {tp_str((self.topic, p))} were not written: {detail}", code)

    async def _send_to(self, leader: int, batches: dict[int, bytes]) -> dict[int, tuple[int, str | None]]:
        if leader < 0:
            return dict.fromkeys(batches, (Errors.LEADER_NOT_AVAILABLE, None))
        P = ProduceRequest
        req = P(acks=self.acks, timeout_ms=self.request_timeout_ms, topic_data=[P.TopicProduceData(
            name=self.topic, partition_data=[P.PartitionProduceData(index=p, records=data)
                                             for p, data in sorted(batches.items())])])
        try:
            if self.acks == 0:
                addr = self.brokers.addresses[leader]
                conn = await self.brokers.connection(*addr)
                await conn.request(req, expect_response=False)
                return dict.fromkeys(batches, (0, None))
            resp = await self.brokers.send(leader, req)
        except (AdminError, KeyError) as e:
            return dict.fromkeys(batches, (Errors.NETWORK_EXCEPTION, str(e)))
        out: dict[int, tuple[int, str | None]] = {}
        for t in resp.responses:
            for pr in t.partition_responses:
                out[pr.index] = (pr.error_code, pr.error_message)
        return out


def stdin_lines(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    """Reads standard input on its own thread (a blocking read must not hold the event loop)."""
    stream, prompt = sys.stdin.buffer, sys.stdin.isatty()

    def put(item: object) -> bool:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
            return True
        except RuntimeError:  # the loop is closed: the tool ended (a bad line, a failed send)
            return False

    while True:
        if prompt:
            print(">", end="", flush=True)
        try:
            raw = stream.readline()
        except (OSError, ValueError):  # stdin closed under us (the tool is ending): nothing more to read
            raw = b""
        if not raw:
            put(EOF)
            return
        if not put(raw.decode("utf-8", "replace").removesuffix("\n").removesuffix("\r")):
            return


async def run(a: argparse.Namespace) -> None:
    reader_props = merged(read_properties(a.reader_config) if a.reader_config else {}, a.property)
    reader = LineReader.from_props(reader_props)
    props = merged(read_properties(a.producer_config) if a.producer_config else {}, a.producer_property)
    acks_text = a.request_required_acks or props.get("acks", "-1")
    if acks_text.strip().lower() not in ACKS:
        raise AdminError(f"acks={acks_text!r} is not one of all, -1, 0, 1")
    acks = ACKS[acks_text.strip().lower()]
    codec = a.compression_codec or props.get("compression.type", "none")
    if codec not in CODECS:
        raise AdminError(f"compression {codec!r} is not one of {', '.join(CODECS)}")
    idempotent = acks == -1 and is_true(props, "enable.idempotence", True)
    timeout_ms = int_prop(props, "request.timeout.ms", a.request_timeout_ms)
    max_batch = 1 if a.sync else a.batch_size
    async with (admin_for(a, max(timeout_ms / 1000, 5.0)) as admin,
                Brokers(admin, props.get("client.id", "console-producer")) as brokers):
        producer = Producer(brokers, a.topic, acks=acks, compression=CODECS[codec],
                            retries=int_prop(props, "retries", a.message_send_max_retries),
                            backoff=int_prop(props, "retry.backoff.ms", a.retry_backoff_ms) / 1000,
                            request_timeout_ms=timeout_ms, idempotent=idempotent)
        await producer.start()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        threading.Thread(target=stdin_lines, args=(loop, queue), daemon=True).start()
        number, done = 0, False
        while not done:
            records: list[Record] = []
            item = await queue.get()
            while True:
                if item is EOF:
                    done = True
                    break
                number += 1
                try:
                    records.append(reader.record(item, number))
                except LineError:
                    if records:
                        await producer.send(records, max_batch)
                    raise
                if queue.empty() or len(records) >= 10 * max_batch:
                    break
                item = queue.get_nowait()
            if records:
                await producer.send(records, max_batch)


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-console-producer.sh",
                            description="Read lines from standard input and write each as a record to a topic.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--topic", required=True, help="the topic to write to")
    ap.add_argument("--property", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                    help="line reader properties: parse.key, key.separator, parse.headers, headers.delimiter, "
                         "headers.separator, headers.key.separator, null.marker, ignore.error")
    ap.add_argument("--reader-config", metavar="FILE", help="line reader properties file (--property wins)")
    ap.add_argument("--producer-property", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                    help="producer properties: acks, compression.type, retries, retry.backoff.ms, "
                         "request.timeout.ms, enable.idempotence")
    ap.add_argument("--producer.config", dest="producer_config", metavar="FILE",
                    help="producer properties file (--producer-property wins)")
    ap.add_argument("--request-required-acks", metavar="ACKS", help="all, -1 (the default), 0 or 1")
    ap.add_argument("--compression-codec", nargs="?", const="gzip", choices=sorted(CODECS),
                    help="none (the default), gzip, snappy, lz4 or zstd")
    ap.add_argument("--sync", action="store_true", help="send each record on its own, waiting for its answer")
    ap.add_argument("--batch-size", type=ranged_int(1, 1_000_000), default=200,
                    help="records a batch at most (default 200)")
    ap.add_argument("--message-send-max-retries", type=ranged_int(0, 1_000_000), default=3,
                    help="retries of a batch refused with a retriable error (default 3)")
    ap.add_argument("--retry-backoff-ms", type=ranged_int(0, 3_600_000), default=100, help="wait before a retry")
    ap.add_argument("--request-timeout-ms", type=ranged_int(1, 2**31 - 1), default=1500,
                    help="how long a broker may take to answer (default 1500)")
    ap.add_argument("--timeout", type=ranged_int(0, 2**31 - 1), default=1000, help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
