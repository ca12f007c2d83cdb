"""Diskless topics (KIP-1164) read straight from object storage: no broker carries the data.

The driver asks each partition's diskless coordinator (any replica of its `__diskless_metadata`
partition answers DisklessFindBatches from its SQLite) which WAL files and byte ranges hold the
batches of the offsets to read, and deals the files out to Spark partitions (a WAL file
interleaves many partitions' batches: cut by file, each file is fetched once); executors read
each file's span from the store (a local directory or S3, the brokers' `diskless.storage.url`) on
a thread of their own, a few spans ahead, and decode a span's batches of every partition into
Arrow in one pass where they lie, with the base offsets the coordinator assigned.
Under read_committed the plan asks the coordinator for the aborted transactions too (the range
already ends at the last stable offset): a partition with aborted data in its range is read
through the brokers' Fetch instead, which drops it as Kafka's consumer does; the rest are read
straight from the store (control batches are never rows).
"""

from __future__ import annotations

import asyncio
import os
import threading
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from uuid import UUID

import pyarrow as pa

from broker.diskless.batches import BatchRow
from broker.diskless.object_store import LocalObjectStore, ObjectStore, S3ObjectStore
from connector.arrow_records import wal_to_arrow
from connector.cluster_view import ClusterView, SourceError
from node.client import ClientError, NodeClient
from protocol.generated.describe_configs import DescribeConfigsRequest
from protocol.generated.diskless_find_batches import DisklessFindBatchesRequest as FB

DISKLESS_METADATA_TOPIC = "__diskless_metadata"
_TOPIC_RESOURCE = 2
_AHEAD = 3  # spans read from the store ahead of the one decoding
_GAP = 1 << 20  # bytes of other partitions' batches worth reading through rather than a new request


@dataclass(frozen=True)
class StoreOptions:
    url: str  # file:///abs/dir or s3://bucket/prefix
    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None

    def open(self) -> ObjectStore:
        from urllib.parse import urlparse

        u = urlparse(self.url)
        if u.scheme == "file" and u.path.startswith("/"):
            return LocalObjectStore(u.path)
        if u.scheme == "s3" and u.netloc:
            return _S3Ranges(u.netloc, endpoint=self.endpoint, region=self.region,
                             access_key_id=self.access_key_id, secret_access_key=self.secret_access_key)
        raise SourceError(f"diskless.storage.url: {self.url!r} is neither file:///abs/dir nor s3://bucket/prefix")


class _S3Ranges(S3ObjectStore):
    """The brokers' S3 store with a ranged get that hands back obstore's buffer as it came, for
    the decode to read where it lies (get_range copies it into bytes: a pass over every byte)."""

    async def get_view(self, key: str, start: int, end: int) -> memoryview:
        import obstore

        try:
            return memoryview(await obstore.get_range_async(self._store, key, start=start, end=end))
        except Exception as e:
            raise self._error(e) from e


def diskless_topics(view: ClusterView, topics: set[str], timeout: float) -> set[str]:
    """The topics of `topics` created with diskless.enable=true (DescribeConfigs)."""
    return asyncio.run(_diskless_topics(view, sorted(topics), timeout))


async def _diskless_topics(view: ClusterView, topics: list[str], timeout: float) -> set[str]:
    R = DescribeConfigsRequest
    req = R(resources=[R.DescribeConfigsResource(resource_type=_TOPIC_RESOURCE, resource_name=t,
                                                 configuration_keys=["diskless.enable"]) for t in topics])
    last = ""
    for host, port in view.brokers.values():
        try:
            async with NodeClient(host, port, client_id="strata-spark", timeout=timeout) as c:
                resp = await c.request(req)
        except ClientError as e:
            last = str(e)
            continue
        return {r.resource_name for r in resp.results if not r.error_code
                and any(c.name == "diskless.enable" and (c.value or "").lower() == "true" for c in r.configs)}
    raise SourceError(f"no broker answered DescribeConfigs: {last}")


def find_batches(view: ClusterView, topic: str, partition: int, start: int, end: int,
                 timeout: float, read_committed: bool = False) -> tuple[list[BatchRow], bool]:
    """The batches holding offsets [start, end) of a diskless partition, from its coordinator,
    and whether (under read_committed) an aborted transaction overlaps them."""
    return asyncio.run(_find_batches(view, topic, partition, start, end, timeout, read_committed))


async def _find_batches(view: ClusterView, topic: str, partition: int, start: int, end: int,
                        timeout: float, read_committed: bool) -> tuple[list[BatchRow], bool]:
    topic_id: UUID | None = view.topic_ids.get(topic)
    n = sum(1 for t, _ in view.partitions if t == DISKLESS_METADATA_TOPIC)
    if topic_id is None or not n:
        raise SourceError(f"{topic}-{partition}: no diskless coordinator in the metadata")
    index = (zlib.crc32(topic_id.bytes) + partition) % n  # the controller's mapping, fixed at creation
    brokers = [b for b in view.partitions[(DISKLESS_METADATA_TOPIC, index)].chunks[-1].brokers if b in view.brokers]
    rows: list[BatchRow] = []
    aborted = False
    offset, last_error = start, ""
    for broker in brokers:
        try:
            async with NodeClient(*view.brokers[broker], client_id="strata-spark", timeout=timeout) as c:
                while offset < end:
                    resp = await c.request(FB(fetch_max_bytes=256 << 20, max_batches_per_partition=10_000, topics=[
                        FB.DisklessFindBatchesTopic(topic_id=topic_id, partitions=[FB.DisklessFindBatchesPartition(
                            partition_index=partition, offset=offset, max_partition_fetch_bytes=256 << 20,
                            read_committed=read_committed)])]))
                    p = resp.topics[0].partitions[0]
                    if p.error_code:
                        raise SourceError(f"DisklessFindBatches {topic}-{partition} at {offset}: error {p.error_code}")
                    # those overlapping the batches answered (Kafka's Fetch rule): any before `end` counts
                    aborted = aborted or any(a.first_offset < end for a in p.aborted_transactions or ())
                    if not p.batches:
                        break  # a follower's view a little behind: what it has is planned
                    for b in p.batches:
                        rows.append(BatchRow(b.batch_id, b.object_key, b.magic, b.byte_offset, b.byte_size,
                                             b.base_offset, b.last_offset, b.log_append_timestamp,
                                             b.batch_max_timestamp, b.timestamp_type))
                    offset = p.batches[-1].last_offset + 1
            if offset >= end:
                return [r for r in rows if r.last_offset >= start and r.base_offset < end], aborted
            last_error = f"broker {broker} knows batches up to offset {offset} only"
        except ClientError as e:
            last_error = str(e)
    raise SourceError(f"{topic}-{partition}: the diskless coordinator did not plan [{start}, {end}): {last_error}")


@dataclass(frozen=True)
class Span:
    """One ranged get: bytes [lo, hi) of a WAL file, holding `batches` (position in the file,
    size, the (topic, partition) index, assigned base offset). A WAL file interleaves the batches
    of many partitions, so the batches of one file are read as one span over small gaps (fewer,
    larger requests, as the brokers' 1 MiB cache blocks are)."""

    key: str
    lo: int
    hi: int
    batches: tuple[tuple[int, int, int, int], ...]


def spans_of(rows: list[tuple[int, BatchRow]]) -> list[Span]:
    """The spans covering `rows` ((topic-partition index, batch)), gaps of at most _GAP bytes
    read through."""
    out: list[Span] = []
    cur: list[tuple[int, BatchRow]] = []
    for tp, r in sorted(rows, key=lambda x: (x[1].object_key, x[1].byte_offset)):
        if cur and (cur[0][1].object_key != r.object_key or r.byte_offset - _end(cur) > _GAP):
            out.append(_span(cur))
            cur = []
        cur.append((tp, r))
    if cur:
        out.append(_span(cur))
    return out


def _end(rows: list[tuple[int, BatchRow]]) -> int:
    return max(r.byte_offset + r.byte_size for _, r in rows)


def _span(rows: list[tuple[int, BatchRow]]) -> Span:
    lo = rows[0][1].byte_offset
    return Span(rows[0][1].object_key, lo, _end(rows),
                tuple((r.byte_offset - lo, r.byte_size, tp, r.base_offset) for tp, r in rows))


class _Fetcher:
    """The executor process's object-store reads: one event loop on its own thread, with one store
    client per store kept across pieces (an S3 client's connections and credentials are set up
    once). Reads are submitted ahead, so the next spans arrive while the current one decodes on
    the task's thread (the store client waits on the network without the GIL). The loop is not
    the task thread's: asyncio.Runner on the main thread installs a SIGINT handler per run, whose
    check formats the finished task's repr, result included (megabytes of bytes, every run)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.stores: dict[StoreOptions, ObjectStore] = {}
        threading.Thread(target=self.loop.run_forever, name="strata-diskless-read", daemon=True).start()

    def submit(self, store: StoreOptions, span: Span) -> Future[bytes | memoryview]:
        return asyncio.run_coroutine_threadsafe(self._read(store, span), self.loop)

    async def _read(self, store: StoreOptions, span: Span) -> bytes | memoryview:
        s = self.stores.get(store)
        if s is None:
            s = self.stores[store] = store.open()
        blob: bytes | memoryview
        if isinstance(s, _S3Ranges):
            blob = await s.get_view(span.key, span.lo, span.hi)
        else:
            blob = await s.get_range(span.key, span.lo, span.hi)
        if len(blob) != span.hi - span.lo:
            raise SourceError(f"object {span.key}: asked bytes [{span.lo}, {span.hi}), got {len(blob)}")
        return blob


_fetcher: _Fetcher | None = None
_fetcher_lock = threading.Lock()


def _the_fetcher() -> _Fetcher:
    global _fetcher
    with _fetcher_lock:
        if _fetcher is None or _fetcher.pid != os.getpid():  # a forked worker starts its own thread
            _fetcher = _Fetcher()
        return _fetcher


# ---------------------------------------------------------------- planning by WAL file
@dataclass(frozen=True)
class FileShare:
    """What one Spark partition reads: whole WAL files, each fetched once, and in them the batches
    of every planned partition (a WAL file interleaves many partitions' batches)."""

    rows: tuple[tuple[str, int, BatchRow], ...]  # (topic, partition, batch)
    bounds: tuple[tuple[str, int, int, int], ...]  # (topic, partition, start, end)


def plan_files(view: ClusterView, ranges: dict[tuple[str, int], tuple[int, int]], shares: int,
               timeout: float, read_committed: bool = False) -> tuple[list[FileShare], set[tuple[str, int]]]:
    """The batches of every range, from the coordinators, grouped by WAL file and the files dealt
    out to `shares` shares by size (largest first, to the lightest share); and, under
    read_committed, the partitions left out because aborted data lies in their range (to be read
    through the brokers' Fetch)."""
    files: dict[str, list[tuple[str, int, BatchRow]]] = {}
    through_brokers: set[tuple[str, int]] = set()
    for (topic, partition), (start, end) in sorted(ranges.items()):
        rows, aborted = find_batches(view, topic, partition, start, end, timeout, read_committed)
        if aborted:
            through_brokers.add((topic, partition))
            continue
        for r in rows:
            files.setdefault(r.object_key, []).append((topic, partition, r))
    bins: list[list[tuple[str, int, BatchRow]]] = [[] for _ in range(max(1, shares))]
    weight = [0] * len(bins)
    for key in sorted(files, key=lambda k: -sum(r.byte_size for _, _, r in files[k])):
        i = weight.index(min(weight))
        bins[i].extend(files[key])
        weight[i] += sum(r.byte_size for _, _, r in files[key])
    bounds = tuple((t, p, s, e) for (t, p), (s, e) in sorted(ranges.items()) if (t, p) not in through_brokers)
    return [FileShare(tuple(b), bounds) for b in bins if b], through_brokers


def read_files(store: StoreOptions, share: FileShare, include_headers: bool) -> Iterator[pa.RecordBatch]:
    """On an executor: the share's files, one span at a time, each decoded in one pass over its
    bytes for all its partitions (no copy of the batches: the base offsets the coordinator
    assigned are applied in the decode), with the next _AHEAD spans read meanwhile."""
    tps = sorted({(t, p) for t, p, _ in share.rows})
    index = {tp: i for i, tp in enumerate(tps)}
    bounds_of = {(t, p): (s, e) for t, p, s, e in share.bounds}
    bounds = [bounds_of[tp] for tp in tps]
    spans = spans_of([(index[(t, p)], r) for t, p, r in share.rows])
    fetcher = _the_fetcher()
    pending: deque[Future[bytes | memoryview]] = deque()
    try:
        for i, span in enumerate(spans):
            while len(pending) <= _AHEAD and i + len(pending) < len(spans):
                pending.append(fetcher.submit(store, spans[i + len(pending)]))
            batch = wal_to_arrow(pending.popleft().result(), span.batches, tps, bounds, include_headers)
            if batch.num_rows:
                yield batch
    finally:
        for f in pending:
            f.cancel()
