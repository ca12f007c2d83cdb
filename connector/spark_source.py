"""`strata`: a PySpark data source (batch and streaming) reading Strata topics, with the schema
and options of Spark's Kafka source so that a job only changes the format name.

Planning (on the driver) takes the cluster's metadata, resolves the offsets asked for, and cuts
each partition's range at chunk boundaries (and further for minPartitions). Every piece names the
brokers that can serve it: the replicas of its inactive chunk, taken in turn from one chosen by
a stable hash of (topic, partition, chunk) so that the pieces of one chunk spread over all its
replicas, or the leader of the active chunk. Reading (on the executors) fetches the piece's bytes and decodes
them straight into Arrow batches (connector/arrow_records.py).

Options: kafka.bootstrap.servers; one of subscribe, subscribePattern, assign; startingOffsets,
endingOffsets (batch), startingOffsetsByTimestamp, maxOffsetsPerTrigger, minPartitions,
failOnDataLoss, includeHeaders, isolation.level (read_committed by default, as Spark's source);
kafka.* passes Kafka client settings (kafka.client.id, kafka.request.timeout.ms,
kafka.fetch.max.bytes, kafka.isolation.level are used).

Streaming offsets are {"topic": {"partition": next offset}} with keys in sorted order, so the same
position always serializes to the same text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from connector.arrow_records import SPARK_SCHEMA, SPARK_SCHEMA_WITH_HEADERS
from connector.cluster_view import (
    EARLIEST,
    LATEST,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    ClusterView,
    PartitionView,
    SourceError,
    parse_bootstrap,
)
from connector.diskless_read import FileShare, StoreOptions, diskless_topics, plan_files, read_files
from connector.range_reader import RangeReader
from metadata.read_replicas import hash_order

TopicPartition = tuple[str, int]


# ---------------------------------------------------------------- options
@dataclass(frozen=True)
class SourceOptions:
    bootstrap: list[tuple[str, int]]
    subscribe: str | None
    pattern: str | None
    assign: dict[str, list[int]] | None
    starting: str
    ending: str
    starting_by_timestamp: str | None
    max_offsets_per_trigger: int | None
    min_partitions: int
    fail_on_data_loss: bool
    include_headers: bool
    isolation_level: int
    client_id: str
    request_timeout: float
    fetch_max_bytes: int
    store: StoreOptions | None = None  # diskless topics read straight from here (None: broker Fetch)

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
        o = {k.lower(): v for k, v in options.items()}
        bootstrap = o.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise SourceError("option kafka.bootstrap.servers is required")
        chosen = [k for k in ("subscribe", "subscribepattern", "assign") if o.get(k)]
        if len(chosen) != 1:
            raise SourceError("exactly one of subscribe, subscribePattern, assign must be given")
        assign = None
        if "assign" in chosen:
            try:
                raw = json.loads(o["assign"])
                assign = {str(t): [int(p) for p in ps] for t, ps in raw.items()}
            except (ValueError, TypeError, AttributeError):
                raise SourceError(f'assign: expected JSON like {{"topic": [0, 1]}}, got {o["assign"]!r}') from None
        iso = (o.get("isolation.level") or o.get("kafka.isolation.level") or "read_committed").lower()
        if iso not in ("read_committed", "read_uncommitted"):
            raise SourceError(f"isolation.level: {iso!r} is neither read_committed nor read_uncommitted")
        if not streaming and "endingoffsets" in o and o["endingoffsets"].strip().lower() == "earliest":
            raise SourceError("endingOffsets may not be earliest")
        max_per_trigger = o.get("maxoffsetspertrigger")
        direct = o.get("disklessdirectread", "true").lower()
        if direct not in ("true", "false"):
            raise SourceError(f"disklessDirectRead: expected true or false, got {o['disklessdirectread']!r}")
        store = None
        if direct == "true" and o.get("diskless.storage.url"):
            store = StoreOptions(o["diskless.storage.url"], o.get("diskless.storage.s3.endpoint"),
                                 o.get("diskless.storage.s3.region"), o.get("diskless.storage.s3.access.key.id"),
                                 o.get("diskless.storage.s3.secret.access.key"))
        return cls(
            bootstrap=parse_bootstrap(bootstrap),
            subscribe=o.get("subscribe"),
            pattern=o.get("subscribepattern"),
            assign=assign,
            starting=o.get("startingoffsets", "latest" if streaming else "earliest"),
            ending=o.get("endingoffsets", "latest"),
            starting_by_timestamp=o.get("startingoffsetsbytimestamp"),
            max_offsets_per_trigger=_positive(max_per_trigger, "maxOffsetsPerTrigger") if max_per_trigger else None,
            min_partitions=_positive(o.get("minpartitions", "1"), "minPartitions"),
            fail_on_data_loss=o.get("failondataloss", "true").lower() != "false",
            include_headers=o.get("includeheaders", "false").lower() == "true",
            isolation_level=READ_COMMITTED if iso == "read_committed" else READ_UNCOMMITTED,
            client_id=o.get("kafka.client.id", "strata-spark"),
            request_timeout=int(o.get("kafka.request.timeout.ms", "30000")) / 1000,
            fetch_max_bytes=int(o.get("kafka.fetch.max.bytes", str(8 << 20))),
            store=store,
        )


def _positive(value: str, name: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise SourceError(f"{name}: {value!r} is not a number") from None
    if n < 1:
        raise SourceError(f"{name}: must be at least 1, got {n}")
    return n


def _offsets_json(text: str, name: str) -> dict[TopicPartition, int]:
    try:
        raw = json.loads(text)
        return {(str(t), int(p)): int(o) for t, ps in raw.items() for p, o in ps.items()}
    except (ValueError, TypeError, AttributeError):
        raise SourceError(f'{name}: expected "earliest", "latest" or JSON like {{"topic": {{"0": 42}}}}') from None


# ---------------------------------------------------------------- planning
@dataclass(frozen=True)
class Piece:
    """One input partition: [start, end) of one partition inside one chunk, and who serves it."""

    topic: str
    partition: int
    start: int
    end: int
    brokers: tuple[int, ...]  # who serves it, first choice first
    chunk: int  # start offset of the chunk holding it
    active: bool  # of the active chunk: its leader first


class _Plan:
    """Everything the driver knows after one metadata load."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.view = ClusterView.load(opts.bootstrap, opts.request_timeout)
        self.parts = {(pv.topic, pv.partition): pv for pv in self.view.select(opts.subscribe, opts.pattern, opts.assign)}
        if not self.parts:
            raise SourceError("no partitions match the subscription")

    def offsets(self, spec: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        return self.view.list_offsets([self.parts[tp] for tp in spec], spec, self.opts.isolation_level,
                                      self.opts.request_timeout)

    def resolve(self, text: str, default: int, name: str) -> dict[TopicPartition, int]:
        """earliest / latest / per-partition JSON (-2 earliest, -1 latest) into real offsets."""
        word = text.strip().lower()
        if word in ("earliest", "latest"):
            spec = {tp: EARLIEST if word == "earliest" else LATEST for tp in self.parts}
        else:
            given = _offsets_json(text, name)
            unknown = [f"{t}-{p}" for t, p in given if (t, p) not in self.parts]
            if unknown:
                raise SourceError(f"{name} names partitions outside the subscription: {', '.join(unknown)}")
            spec = {tp: given.get(tp, default) for tp in self.parts}
        special = {tp: s for tp, s in spec.items() if s < 0}
        out = {tp: s for tp, s in spec.items() if s >= 0}
        out.update(self.offsets(special) if special else {})
        return out

    def starting(self) -> dict[TopicPartition, int]:
        if self.opts.starting_by_timestamp:
            stamps = _offsets_json(self.opts.starting_by_timestamp, "startingOffsetsByTimestamp")
            missing = [f"{t}-{p}" for t, p in self.parts if (t, p) not in stamps]
            if missing:
                raise SourceError(f"startingOffsetsByTimestamp has no timestamp for {', '.join(missing)}")
            return self.offsets({tp: stamps[tp] for tp in self.parts})
        return self.resolve(self.opts.starting, EARLIEST, "startingOffsets")

    def check_data_loss(self, start: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Offsets below what the cluster still holds: an error, or (failOnDataLoss=false) moved up."""
        earliest = self.offsets({tp: EARLIEST for tp in start})
        lost = {tp: (o, earliest[tp]) for tp, o in start.items() if o < earliest[tp]}
        if lost and self.opts.fail_on_data_loss:
            what = ", ".join(f"{t}-{p} from {o} (earliest now {e})" for (t, p), (o, e) in sorted(lost.items()))
            raise SourceError(f"data lost: cannot read {what}; set failOnDataLoss=false to skip ahead")
        return {tp: max(o, earliest[tp]) for tp, o in start.items()}

    def pieces(self, start: dict[TopicPartition, int], end: dict[TopicPartition, int]) -> list[Piece]:
        out: list[Piece] = []
        for tp in sorted(self.parts):
            s, e = start.get(tp), end.get(tp)
            if s is None or e is None or s >= e:
                continue
            out.extend(self._split(self.parts[tp], s, e))
        want = self.opts.min_partitions
        while len(out) < want:
            big = max(out, key=lambda p: p.end - p.start, default=None)
            if big is None or big.end - big.start < 2:
                break
            mid = big.start + (big.end - big.start) // 2
            i = out.index(big)
            out[i:i + 1] = [replace(big, end=mid), replace(big, start=mid)]
        return _spread(out)

    @staticmethod
    def _split(pv: PartitionView, start: int, end: int) -> list[Piece]:
        out = []
        for c in pv.chunks:
            lo = max(start, c.start)
            hi = end if c.active else min(end, c.stop + 1)  # type: ignore[operator]
            if lo < hi:
                out.append(Piece(pv.topic, pv.partition, lo, hi, c.brokers, c.start, c.active))
        return out


def _spread(pieces: list[Piece]) -> list[Piece]:
    """Give the pieces of each inactive chunk its replicas in turn, from one chosen by a stable hash
    of (topic, partition, chunk): n pieces of a chunk with n replicas go to n different brokers,
    and each piece can fall back on the others. The active chunk's pieces keep its leader first."""
    turn: dict[tuple[str, int, int], int] = {}
    out = []
    for p in pieces:
        if p.active or len(p.brokers) < 2:
            out.append(p)
            continue
        key = (p.topic, p.partition, p.chunk)
        i = turn[key] = turn.get(key, -1) + 1
        base = hash_order(sorted(p.brokers), *key)
        k = i % len(base)
        out.append(replace(p, brokers=tuple(base[k:] + base[:k])))
    return out


class _PieceInput(InputPartition):
    def __init__(self, piece: Piece, addresses: dict[int, tuple[str, int]]) -> None:
        super().__init__(piece)
        self.piece = piece
        self.addresses = addresses


def _inputs(opts: SourceOptions, plan: _Plan, pieces: list[Piece]) -> list[InputPartition]:
    """The pieces as Spark's input partitions; with a store to read from, those of diskless topics
    carry the WAL byte ranges the coordinator names (connector/diskless_read.py)."""
    diskless = set()
    if opts.store is not None and pieces:
        diskless = diskless_topics(plan.view, {p.topic for p in pieces}, opts.request_timeout)
    out: list[InputPartition] = [_PieceInput(p, plan.view.brokers) for p in pieces if p.topic not in diskless]
    ranges: dict[TopicPartition, tuple[int, int]] = {}
    count = 0
    for p in pieces:
        if p.topic in diskless:
            count += 1
            s, e = ranges.get((p.topic, p.partition), (p.start, p.end))
            ranges[(p.topic, p.partition)] = (min(s, p.start), max(e, p.end))
    if ranges:  # diskless pieces are cut by WAL file, so that each file is fetched once
        shares, through_brokers = plan_files(plan.view, ranges, count, opts.request_timeout,
                                             opts.isolation_level == READ_COMMITTED)
        out.extend(_FilesInput(share) for share in shares)
        # aborted transactions in their range: the brokers' Fetch drops them (as Kafka's consumer)
        out.extend(_PieceInput(p, plan.view.brokers) for p in pieces if (p.topic, p.partition) in through_brokers)
    return out


class _FilesInput(InputPartition):
    def __init__(self, share: FileShare) -> None:
        super().__init__(len(share.rows))
        self.share = share


def _read_piece(opts: SourceOptions, part: InputPartition) -> Iterator[pa.RecordBatch]:
    if isinstance(part, _FilesInput) and opts.store is not None:
        yield from read_files(opts.store, part.share, opts.include_headers)
        return
    assert isinstance(part, _PieceInput)
    p = part.piece
    reader = RangeReader(part.addresses, isolation_level=opts.isolation_level, include_headers=opts.include_headers,
                         max_bytes=opts.fetch_max_bytes, request_timeout=opts.request_timeout, client_id=opts.client_id)
    yield from reader.read(p.topic, p.partition, p.start, p.end, p.brokers)


# ---------------------------------------------------------------- the source
class StrataDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "strata"

    def schema(self) -> str:
        headers = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return SPARK_SCHEMA_WITH_HEADERS if headers else SPARK_SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return StrataBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return StrataStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema, overwrite: bool) -> DataSourceWriter:
        from connector.spark_sink import make_writer  # the sink's modules load only where it writes

        return make_writer(self.options, schema, overwrite, streaming=False)

    def streamWriter(self, schema, overwrite: bool) -> DataSourceStreamWriter:
        from connector.spark_sink import make_writer

        return make_writer(self.options, schema, overwrite, streaming=True)


class StrataBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[InputPartition]:
        plan = _Plan(self.opts)
        start = plan.check_data_loss(plan.starting())
        end = plan.resolve(self.opts.ending, LATEST, "endingOffsets")
        return _inputs(self.opts, plan, plan.pieces(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_piece(self.opts, partition)


def _to_json(offsets: dict[TopicPartition, int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = o
    return out


def _from_json(offsets: dict) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(o) for t, ps in offsets.items() for p, o in ps.items()}


class StrataStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow's end
        self._addresses: dict[int, tuple[str, int]] = {}

    def initialOffset(self) -> dict:
        plan = _Plan(self.opts)
        return _to_json(plan.starting())

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        plan = _Plan(self.opts)
        self._target = plan.resolve("latest", LATEST, "latest")

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        plan = _Plan(self.opts)
        self._addresses = plan.view.brokers
        begin = _from_json(start)
        latest = self._target if self._target is not None else plan.resolve("latest", LATEST, "latest")
        # partitions that appeared since the query started are read from their beginning
        new = [tp for tp in latest if tp not in begin]
        if new:
            begin.update(plan.offsets({tp: EARLIEST for tp in new}))
        end = {tp: max(latest.get(tp, o), o) for tp, o in begin.items()}
        if isinstance(limit, ReadMaxRows):
            end = _rate_limit(begin, end, limit.max_rows)
        return _to_json(end)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        plan = _Plan(self.opts)
        begin, stop = _from_json(start), _from_json(end)
        begin = plan.check_data_loss({tp: begin.get(tp, 0) for tp in stop if tp in plan.parts})
        return _inputs(self.opts, plan, plan.pieces(begin, stop))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_piece(self.opts, partition)

    def commit(self, end: dict) -> None:
        pass  # nothing to release: progress lives in Spark's checkpoint

    def stop(self) -> None:
        pass


def _rate_limit(begin: dict[TopicPartition, int], end: dict[TopicPartition, int], max_rows: int) -> dict[TopicPartition, int]:
    """At most max_rows offsets in all, shared out in proportion to each partition's lag (as
    Spark's Kafka source does), every lagging partition moving at least one offset."""
    lag = {tp: end[tp] - begin[tp] for tp in end}
    total = sum(lag.values())
    if total <= max_rows:
        return end
    out = {}
    for tp, n in lag.items():
        share = int(n * max_rows / total) if n else 0
        out[tp] = begin[tp] + min(n, max(share, 1 if n else 0))
    return out
