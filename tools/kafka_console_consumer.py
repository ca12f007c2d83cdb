"""kafka-console-consumer.sh for Strata: print the records of topics, as Kafka's ConsoleConsumer
with its DefaultMessageFormatter.

  --bootstrap-server B (--topic T | --include REGEX)
  [--from-beginning] [--partition N [--offset earliest|latest|N]] [--group G]
  [--max-messages N] [--timeout-ms N] [--isolation-level read_committed|read_uncommitted]
  [--property print.key=true print.timestamp=true print.partition=true print.offset=true
   print.headers=true print.value=false key.separator=, line.separator, headers.separator,
   null.literal] [--consumer-property K=V] [--consumer.config F] [--formatter-config F]

Reads are chunk-aware (docs/concepts/chunks.md), as connector/reader.py: an offset in an inactive chunk
is fetched from an in-sync replica of that chunk (the first of a stable hash order of them, the
others if it fails), the active chunk from its leader, and a `preferred_read_replica` answer is
followed. So old data stays readable while the active chunk's leader is down. Without --group the
tool reads the partitions directly (Kafka's makes up a group "console-consumer-N" and does not
commit; here no group is made); with --group it joins the group with Kafka's range assignor,
starts at the group's committed offsets (else --from-beginning's earliest or the latest), and
commits what it printed every auto.commit.interval.ms (5 s) and on exit. At the end it prints
``Processed a total of N messages`` on stderr, as Kafka. Errors: one line on stderr, exit 1; bad
arguments exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from client.fetch import FETCH_VERSION, fetch_request
from connector.cluster_view import ClusterView, PartitionView, SourceError
from protocol.errors import ERRORS, Errors, ProtocolError, error_message
from protocol.message import Records
from protocol.records import decode_batches
from protocol.records.aborted import AbortedTransactions
from protocol.records.control import CONTROL_ABORT
from tools.admin import AdminError, ToolArgumentParser, admin_for, parse_bootstrap, ranged_int, run_tool
from tools.brokers import EARLIEST, LATEST, Brokers, TopicPartition, tp_str
from tools.console import int_prop, is_true, key_value, merged, read_properties, unescape
from tools.group_member import GroupMember

ISOLATION = {"read_uncommitted": 0, "read_committed": 1}
METADATA_MAX_AGE = 5.0


@dataclass
class Formatter:
    """Kafka's DefaultMessageFormatter."""

    print_timestamp: bool = False
    print_partition: bool = False
    print_offset: bool = False
    print_headers: bool = False
    print_key: bool = False
    print_value: bool = True
    key_separator: bytes = b"\t"
    line_separator: bytes = b"\n"
    headers_separator: bytes = b","
    null_literal: bytes = b"null"

    @classmethod
    def from_props(cls, props: dict[str, str]) -> Formatter:
        def sep(key: str, default: bytes) -> bytes:
            return unescape(props[key]).encode() if key in props else default

        return cls(is_true(props, "print.timestamp"), is_true(props, "print.partition"),
                   is_true(props, "print.offset"), is_true(props, "print.headers"), is_true(props, "print.key"),
                   is_true(props, "print.value", True), sep("key.separator", b"\t"), sep("line.separator", b"\n"),
                   sep("headers.separator", b","), sep("null.literal", b"null"))

    def format(self, tp: TopicPartition, offset: int, ts_type: str, ts: int, key: bytes | None,
               value: bytes | None, headers: list) -> bytes:
        cols: list[bytes] = []
        if self.print_timestamp:
            cols.append(f"{ts_type}:{ts}".encode() if ts >= 0 else b"NO_TIMESTAMP")
        if self.print_partition:
            cols.append(f"Partition:{tp[1]}".encode())
        if self.print_offset:
            cols.append(f"Offset:{offset}".encode())
        if self.print_headers:
            cols.append(self.headers_separator.join(h.key.encode() + b":" + self._bytes(h.value) for h in headers)
                        if headers else b"NO_HEADERS")
        if self.print_key:
            cols.append(self._bytes(key))
        if self.print_value:
            return self.key_separator.join([*cols, self._bytes(value)]) + self.line_separator
        # as Kafka: without the value no line separator ends the record, only the column separator
        return b"".join(c + self.key_separator for c in cols)

    def _bytes(self, b: bytes | None) -> bytes:
        return self.null_literal if b is None else b


class ChunkAwareFetcher:
    """Fetches each partition from where its position lies: an inactive chunk's replicas or the
    active chunk's leader (connector/cluster_view.py's view of the chunks)."""

    def __init__(self, brokers: Brokers, bootstrap: list[tuple[str, int]], *, isolation: int, client_id: str,
                 max_wait_ms: int = 500, max_bytes: int = 1 << 20) -> None:
        self.brokers = brokers
        self.bootstrap = bootstrap
        self.isolation = isolation
        self.client_id = client_id
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.view: ClusterView | None = None
        self.view_at = 0.0
        self.positions: dict[TopicPartition, int] = {}
        self.preferred: dict[TopicPartition, int] = {}  # a broker a redirect named, until it fails
        self.failed: dict[TopicPartition, set[int]] = {}  # brokers of the current chunk that failed
        self.aborted: dict[TopicPartition, AbortedTransactions] = {}
        self.reset_to = LATEST

    async def refresh(self, force: bool = False) -> ClusterView:
        if force or self.view is None or time.monotonic() - self.view_at > METADATA_MAX_AGE:
            try:
                self.view = await asyncio.to_thread(ClusterView.load, self.bootstrap, self.brokers.admin.timeout)
            except SourceError as e:
                raise AdminError(str(e)) from None
            self.view_at = time.monotonic()
        return self.view

    def _target(self, view: ClusterView, tp: TopicPartition) -> int:
        pv: PartitionView | None = view.partitions.get(tp)
        if pv is None:
            return -1
        if tp in self.preferred:
            return self.preferred[tp]
        c = pv.chunk_for(self.positions[tp])
        if c.active:  # only its leader
            return c.brokers[0] if c.brokers and c.brokers[0] >= 0 else -1
        order = c.read_order(tp[0], tp[1], self.client_id)
        bad = self.failed.get(tp, set())
        ok = [b for b in order if b not in bad] or order
        return ok[0] if ok else -1

    async def fetch(self) -> list[tuple[TopicPartition, Records]]:
        """One round: a Fetch to each broker serving some position; the batches each partition got."""
        view = await self.refresh()
        by_broker: dict[int, list[TopicPartition]] = {}
        for tp in self.positions:
            by_broker.setdefault(self._target(view, tp), []).append(tp)
        if -1 in by_broker:
            await asyncio.sleep(0.2)
            self.view_at = 0.0  # no leader or unknown: look again
            by_broker.pop(-1)
        results = await asyncio.gather(*(self._fetch_from(b, tps, view) for b, tps in by_broker.items()))
        return [item for r in results for item in r]

    async def _fetch_from(self, broker: int, tps: list[TopicPartition], view: ClusterView) -> list:
        req = fetch_request({tp: self.positions[tp] for tp in tps}, isolation_level=self.isolation,
                            max_bytes=50 << 20, partition_max_bytes=self.max_bytes, max_wait_ms=self.max_wait_ms)
        addr = view.brokers.get(broker)
        try:
            if addr is None:
                raise AdminError(f"broker {broker} is unknown")
            resp = await self.brokers.send_to(addr[0], addr[1], req, FETCH_VERSION)
        except AdminError:
            for tp in tps:
                self._broker_failed(tp, broker)
            await asyncio.sleep(0.1)
            return []
        out = []
        for tr in resp.responses:
            for pd in tr.partitions:
                tp = (tr.topic, pd.partition_index)
                if tp not in self.positions:
                    continue
                if pd.error_code == Errors.OFFSET_OUT_OF_RANGE:
                    # below the log start (retention, DeleteRecords: a chunk replica answers so too)
                    # or past the end: auto.offset.reset, as Kafka's consumer
                    self.positions[tp] = (await self.brokers.offsets([tp], self.reset_to))[tp]
                    self.preferred.pop(tp, None)
                    continue
                if pd.error_code:
                    err = ERRORS.get(pd.error_code)
                    if err is not None and not err.retriable:
                        raise AdminError(f"cannot read {tp_str(tp)}: {error_message(pd.error_code)}", pd.error_code)
                    self._broker_failed(tp, broker)
                    continue
                if not pd.records and pd.preferred_read_replica >= 0 and pd.preferred_read_replica != broker:
                    self.preferred[tp] = pd.preferred_read_replica  # the chunk holding the offset is there
                    continue
                ab = self.aborted.setdefault(tp, AbortedTransactions())
                ab.add((a.producer_id, a.first_offset) for a in pd.aborted_transactions or ())
                out.append((tp, pd.records or b""))
        return out

    def _broker_failed(self, tp: TopicPartition, broker: int) -> None:
        if self.preferred.pop(tp, None) is None:
            self.failed.setdefault(tp, set()).add(broker)
        self.view_at = 0.0

    def records(self, tp: TopicPartition, data: Records) -> list[tuple]:
        """The records of a fetched blob from the position on, control batches and (under
        read_committed) aborted transactions left out; moves the position past them."""
        try:
            batches = decode_batches(data)
        except ProtocolError as e:
            raise AdminError(f"cannot read {tp_str(tp)}: {e}") from None
        out = []
        ab = self.aborted.get(tp) or AbortedTransactions()
        pos = self.positions[tp]
        for b in batches:
            h = b.header
            if h.last_offset < pos:
                continue
            if h.is_control:
                if b.records and b.records[0].key is not None and len(b.records[0].key) >= 4:
                    ab.marker(h.producer_id, int.from_bytes(b.records[0].key[2:4], "big") == CONTROL_ABORT)
            elif not (self.isolation and ab.skips(h.producer_id, h.last_offset, h.is_transactional)):
                ts_type = "LogAppendTime" if h.log_append_time else "CreateTime"
                for r in b.records:
                    if r.offset >= pos:
                        ts = h.max_timestamp if h.log_append_time else r.timestamp
                        out.append((r.offset, ts_type, ts, r.key, r.value, r.headers))
            pos = h.last_offset + 1
        if pos > self.positions[tp]:
            self.positions[tp] = pos
            self.failed.pop(tp, None)
            if tp in self.preferred:
                # past the chunk a redirect pointed at? metadata decides the next one
                view = self.view
                pv = view.partitions.get(tp) if view is not None else None
                if pv is not None and pv.chunk_for(pos) is not pv.chunk_for(pos - 1):
                    self.preferred.pop(tp, None)
        return out


class ConsoleConsumer:
    def __init__(self, a: argparse.Namespace, brokers: Brokers, props: dict[str, str], fmt: Formatter) -> None:
        self.a = a
        self.brokers = brokers
        self.props = props
        self.fmt = fmt
        self.count = 0
        self.stop = asyncio.Event()
        self.out = sys.stdout.buffer
        self.fetcher = ChunkAwareFetcher(brokers, parse_bootstrap(a.bootstrap_server),
                                         isolation=ISOLATION[a.isolation_level],
                                         client_id=brokers.client_id)
        self.fetcher.reset_to = EARLIEST if self._reset() == "earliest" else LATEST
        self.member: GroupMember | None = None
        self.auto_commit = is_true(props, "enable.auto.commit", True)
        self.commit_every = int_prop(props, "auto.commit.interval.ms", 5000) / 1000
        self.started = False

    def _reset(self) -> str:
        configured = self.props.get("auto.offset.reset")
        if configured is not None and self.a.from_beginning and configured != "earliest":
            raise AdminError(f"Can't simultaneously specify --from-beginning and 'auto.offset.reset={configured}', "
                             "please remove one option")
        value = configured or ("earliest" if self.a.from_beginning else "latest")
        if value not in ("earliest", "latest"):
            raise AdminError(f"auto.offset.reset={value!r} is not earliest or latest")
        return value

    async def topics(self) -> list[str]:
        if self.a.topic is not None:
            await self.brokers.partitions_of([self.a.topic])
            return [self.a.topic]
        rx = re.compile(self.a.include)
        names = sorted(n for n, t in (await self.brokers.topics(None)).items() if rx.fullmatch(n) and not t.is_internal)
        if not names:
            raise AdminError(f"no topic matches --include {self.a.include!r}", Errors.UNKNOWN_TOPIC_OR_PARTITION)
        return names

    async def start_positions(self, tps: list[TopicPartition]) -> None:
        a, f = self.a, self.fetcher
        f.positions = {}
        if a.partition is not None:
            tp = (a.topic, a.partition)
            if tp not in set(await self.brokers.partitions_of([a.topic])):
                raise AdminError(f"partition {tp_str(tp)} does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
            if a.offset in ("earliest", "latest") or a.offset is None:
                which = EARLIEST if a.offset == "earliest" or (a.offset is None and a.from_beginning) else LATEST
                f.positions[tp] = (await self.brokers.offsets([tp], which))[tp]
            else:
                f.positions[tp] = int(a.offset)
            return
        committed = await self.member.committed(tps) if self.member is not None else {}
        rest = [tp for tp in tps if tp not in committed]
        start = await self.brokers.offsets(rest, f.reset_to) if rest else {}
        f.positions = {tp: committed.get(tp, start.get(tp, 0)) for tp in tps}

    async def assign(self) -> None:
        topics = await self.topics()
        self.started = True  # the input is good: from here on the count is printed at the end, as Kafka
        if self.a.group is None:
            tps = [(self.a.topic, self.a.partition)] if self.a.partition is not None else \
                await self.brokers.partitions_of(topics)
        else:
            self.member = self.member or GroupMember(self.brokers, self.a.group, topics)
            tps = await self.member.join()
        await self.start_positions(tps)

    async def commit(self) -> None:
        if self.member is not None and self.auto_commit and not self.member.rejoin:
            await self.member.commit(dict(self.fetcher.positions))

    async def run(self) -> None:
        await self.assign()
        last_record = time.monotonic()
        last_commit = time.monotonic()
        timeout = self.a.timeout_ms / 1000 if self.a.timeout_ms is not None else None
        while not self.stop.is_set():
            if self.member is not None and self.member.rejoin:
                # what was printed is committed under the generation it was given in (the
                # coordinator takes it while the rebalance prepares), then the group deals again
                if self.auto_commit:
                    try:
                        await self.member.commit(dict(self.fetcher.positions))
                    except AdminError:
                        pass  # the generation is gone: another member may print some records again
                await self.assign()
            if timeout is not None and time.monotonic() - last_record > timeout:
                break
            if not self.fetcher.positions:
                await asyncio.sleep(0.2)
                continue
            got = False
            for tp, data in await self.fetcher.fetch():
                for offset, ts_type, ts, key, value, headers in self.fetcher.records(tp, data):
                    if self.a.max_messages is not None and self.count >= self.a.max_messages:
                        self.fetcher.positions[tp] = offset  # commit only what was printed
                        break
                    self.out.write(self.fmt.format(tp, offset, ts_type, ts, key, value, headers))
                    self.count += 1
                    got = True
                self.out.flush()
            if got:
                last_record = time.monotonic()
            if self.a.max_messages is not None and self.count >= self.a.max_messages:
                break
            if time.monotonic() - last_commit > self.commit_every:
                await self.commit()
                last_commit = time.monotonic()

    async def close(self) -> None:
        if self.member is not None:
            try:
                await self.commit()
            finally:
                await self.member.leave()


async def run(a: argparse.Namespace) -> None:
    props = merged(read_properties(a.consumer_config) if a.consumer_config else {}, a.consumer_property)
    if a.group and props.get("group.id", a.group) != a.group:
        raise AdminError(f"The group ids provided in different places (directly using '--group', via "
                         f"'--consumer-property', or via '--consumer.config') do not match. Detected group ids: "
                         f"'{a.group}', '{props['group.id']}'")
    a.group = a.group or props.get("group.id")
    if a.group and a.partition is not None:
        raise AdminError("Options group and partition cannot be specified together.")
    if "isolation.level" in props and a.isolation_level is None:
        a.isolation_level = props["isolation.level"]
    a.isolation_level = a.isolation_level or "read_uncommitted"
    if a.isolation_level not in ISOLATION:
        raise AdminError(f"isolation level {a.isolation_level!r} is not read_committed or read_uncommitted")
    fmt = Formatter.from_props(merged(read_properties(a.formatter_config) if a.formatter_config else {}, a.property))
    loop = asyncio.get_running_loop()
    client_id = props.get("client.id", "console-consumer")
    async with admin_for(a, 10.0) as admin, Brokers(admin, client_id) as brokers:
        consumer = ConsoleConsumer(a, brokers, props, fmt)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, consumer.stop.set)
        task = loop.create_task(consumer.run())
        stopper = loop.create_task(consumer.stop.wait())
        try:
            await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except BrokenPipeError:
                print("Unable to write to standard out, closing consumer.", file=sys.stderr)
        finally:
            stopper.cancel()
            try:
                await consumer.close()
            finally:
                if consumer.started:  # as Kafka; an error before the first fetch is one line alone
                    print(f"Processed a total of {consumer.count} messages", file=sys.stderr)


def parse_offset(value: str) -> str:
    v = value.lower()
    if v in ("earliest", "latest"):
        return v
    if v.isdigit() and int(v) <= 2**63 - 1:
        return str(int(v))
    raise argparse.ArgumentTypeError(f"The provided offset value '{value[:40]}' is incorrect. Valid values are "
                                     "'earliest', 'latest', or a non-negative long.")


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-console-consumer.sh", description="Print the records of topics.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--topic", help="the topic to read")
    ap.add_argument("--include", help="a regular expression of the topics to read")
    ap.add_argument("--partition", type=ranged_int(0, 2**31 - 1), help="read only this partition (with --topic)")
    ap.add_argument("--offset", type=parse_offset, help="with --partition: earliest, latest (default) or an offset")
    ap.add_argument("--from-beginning", action="store_true", help="start at the earliest offset when there is no "
                    "committed one")
    ap.add_argument("--group", help="the consumer group to join")
    ap.add_argument("--max-messages", type=ranged_int(0, 2**31 - 1), help="stop after this many records")
    ap.add_argument("--timeout-ms", type=ranged_int(0, 2**63 - 1), help="stop when no record came for this long")
    ap.add_argument("--isolation-level", help="read_uncommitted (default) or read_committed")
    ap.add_argument("--property", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                    help="formatter properties: print.timestamp, print.key, print.partition, print.offset, "
                         "print.headers, print.value, key.separator, line.separator, headers.separator, null.literal")
    ap.add_argument("--formatter-config", metavar="FILE", help="formatter properties file (--property wins)")
    ap.add_argument("--consumer-property", type=key_value, action="append", default=[], metavar="KEY=VALUE",
                    help="consumer properties: group.id, client.id, auto.offset.reset, enable.auto.commit, "
                         "auto.commit.interval.ms, isolation.level")
    ap.add_argument("--consumer.config", dest="consumer_config", metavar="FILE",
                    help="consumer properties file (--consumer-property wins)")
    ap.add_argument("--skip-message-on-error", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    if (a.topic is None) == (a.include is None):
        ap.error("Exactly one of --include/--topic is required.")
    if a.include is not None:
        try:
            re.compile(a.include)
        except re.error as e:
            ap.error(f"--include {a.include[:60]!r} is not a valid regular expression: {e}")
    if a.partition is not None:
        if a.topic is None:
            ap.error("The topic is required when partition is specified.")
        if a.from_beginning and a.offset is not None:
            ap.error("Options from-beginning and offset cannot be specified together.")
        if a.group is not None:
            ap.error("Options group and partition cannot be specified together.")
    elif a.offset is not None:
        ap.error("The partition is required when offset is specified.")
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
