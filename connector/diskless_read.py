"""Diskless topics (KIP-1164) read straight from object storage: no broker carries the data.

The driver asks each partition's diskless coordinator (any replica of its `__diskless_metadata`
partition answers DisklessFindBatches from its SQLite) which WAL files and byte ranges hold the
batches of the offsets to read, and deals the files out to Spark partitions (a WAL file
interleaves many partitions' batches: cut by file, each file is fetched once); executors read the
ranges from the store (a local directory or S3, the brokers' `diskless.storage.url`), patch each
batch's assigned base offset into its header (outside the CRC, as the brokers' read path does)
and decode them into Arrow, per partition.
Diskless topics take no transactions, so every committed batch is readable under read_committed.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from uuid import UUID

import pyarrow as pa

from broker.diskless.batches import BatchRow
from broker.diskless.object_store import LocalObjectStore, ObjectStore, S3ObjectStore
from connector.arrow_records import records_to_arrow
from connector.cluster_view import ClusterView, SourceError
from node.client import ClientError, NodeClient
from protocol.generated.describe_configs import DescribeConfigsRequest
from protocol.generated.diskless_find_batches import DisklessFindBatchesRequest as FB
from protocol.records.batch import set_base_offset

DISKLESS_METADATA_TOPIC = "__diskless_metadata"
_TOPIC_RESOURCE = 2
_GROUP_BYTES = 32 << 20  # WAL bytes decoded into one Arrow batch
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
            return S3ObjectStore(u.netloc, endpoint=self.endpoint, region=self.region,
                                 access_key_id=self.access_key_id, secret_access_key=self.secret_access_key)
        raise SourceError(f"diskless.storage.url: {self.url!r} is neither file:///abs/dir nor s3://bucket/prefix")


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
                 timeout: float) -> list[BatchRow]:
    """The batches holding offsets [start, end) of a diskless partition, from its coordinator."""
    return asyncio.run(_find_batches(view, topic, partition, start, end, timeout))


async def _find_batches(view: ClusterView, topic: str, partition: int, start: int, end: int,
                        timeout: float) -> list[BatchRow]:
    topic_id: UUID | None = view.topic_ids.get(topic)
    n = sum(1 for t, _ in view.partitions if t == DISKLESS_METADATA_TOPIC)
    if topic_id is None or not n:
        raise SourceError(f"{topic}-{partition}: no diskless coordinator in the metadata")
    index = (zlib.crc32(topic_id.bytes) + partition) % n  # the controller's mapping, fixed at creation
    brokers = [b for b in view.partitions[(DISKLESS_METADATA_TOPIC, index)].chunks[-1].brokers if b in view.brokers]
    rows: list[BatchRow] = []
    offset, last_error = start, ""
    for broker in brokers:
        try:
            async with NodeClient(*view.brokers[broker], client_id="strata-spark", timeout=timeout) as c:
                while offset < end:
                    resp = await c.request(FB(fetch_max_bytes=256 << 20, max_batches_per_partition=10_000, topics=[
                        FB.DisklessFindBatchesTopic(topic_id=topic_id, partitions=[FB.DisklessFindBatchesPartition(
                            partition_index=partition, offset=offset, max_partition_fetch_bytes=256 << 20)])]))
                    p = resp.topics[0].partitions[0]
                    if p.error_code:
                        raise SourceError(f"DisklessFindBatches {topic}-{partition} at {offset}: error {p.error_code}")
                    if not p.batches:
                        break  # a follower's view a little behind: what it has is planned
                    for b in p.batches:
                        rows.append(BatchRow(b.batch_id, b.object_key, b.magic, b.byte_offset, b.byte_size,
                                             b.base_offset, b.last_offset, b.log_append_timestamp,
                                             b.batch_max_timestamp, b.timestamp_type))
                    offset = p.batches[-1].last_offset + 1
            if offset >= end:
                return [r for r in rows if r.last_offset >= start and r.base_offset < end]
            last_error = f"broker {broker} knows batches up to offset {offset} only"
        except ClientError as e:
            last_error = str(e)
    raise SourceError(f"{topic}-{partition}: the diskless coordinator did not plan [{start}, {end}): {last_error}")


# One event loop and one store client per executor process, kept across pieces: an S3 client's
# connection pool and credentials are set up once, not per piece.
_RUNNER = asyncio.Runner()
_stores: dict[StoreOptions, ObjectStore] = {}


async def _read(store: StoreOptions, rows: list[BatchRow]) -> list[bytearray]:
    """The rows' batches in order, each with its assigned base offset patched into its header.
    A WAL file interleaves the batches of many partitions, so the batches of one file are fetched
    as one ranged get over their span when the gaps are small (fewer, larger requests, as the
    brokers' 1 MiB cache blocks do), and sliced out of it."""
    spans: dict[tuple[str, int], tuple[int, int]] = {}  # (object, span #) -> [lo, hi)
    where: list[tuple[str, int]] = []
    last: dict[str, int] = {}
    for r in rows:
        k = last.get(r.object_key)
        if k is not None:
            lo, hi = spans[(r.object_key, k)]
            if r.byte_offset >= lo and r.byte_offset - hi <= _GAP:
                spans[(r.object_key, k)] = (lo, max(hi, r.byte_offset + r.byte_size))
                where.append((r.object_key, k))
                continue
        k = last[r.object_key] = (k + 1) if k is not None else 0
        spans[(r.object_key, k)] = (r.byte_offset, r.byte_offset + r.byte_size)
        where.append((r.object_key, k))
    s = _stores.get(store)
    if s is None:
        s = _stores[store] = store.open()
    keys = list(spans)
    got = await asyncio.gather(*(s.get_range(key, *spans[(key, n)]) for key, n in keys))
    data = dict(zip(keys, got))
    out = []
    for r, span in zip(rows, where):
        lo, hi = spans[span]
        blob = data[span]
        if len(blob) != hi - lo:
            raise SourceError(f"object {span[0]}: asked bytes [{lo}, {hi}), got {len(blob)}")
        one = bytearray(blob[r.byte_offset - lo:r.byte_offset - lo + r.byte_size])
        set_base_offset(one, 0, r.base_offset)
        out.append(one)
    return out


# ---------------------------------------------------------------- planning by WAL file
@dataclass(frozen=True)
class FileShare:
    """What one Spark partition reads: whole WAL files, each fetched once, and in them the batches
    of every planned partition (a WAL file interleaves many partitions' batches)."""

    rows: tuple[tuple[str, int, BatchRow], ...]  # (topic, partition, batch)
    bounds: tuple[tuple[str, int, int, int], ...]  # (topic, partition, start, end)


def plan_files(view: ClusterView, ranges: dict[tuple[str, int], tuple[int, int]], shares: int,
               timeout: float) -> list[FileShare]:
    """The batches of every range, from the coordinators, grouped by WAL file and the files dealt
    out to `shares` shares by size (largest first, to the lightest share)."""
    files: dict[str, list[tuple[str, int, BatchRow]]] = {}
    for (topic, partition), (start, end) in sorted(ranges.items()):
        for r in find_batches(view, topic, partition, start, end, timeout):
            files.setdefault(r.object_key, []).append((topic, partition, r))
    bins: list[list[tuple[str, int, BatchRow]]] = [[] for _ in range(max(1, shares))]
    weight = [0] * len(bins)
    for key in sorted(files, key=lambda k: -sum(r.byte_size for _, _, r in files[k])):
        i = weight.index(min(weight))
        bins[i].extend(files[key])
        weight[i] += sum(r.byte_size for _, _, r in files[key])
    bounds = tuple((t, p, s, e) for (t, p), (s, e) in sorted(ranges.items()))
    return [FileShare(tuple(b), bounds) for b in bins if b]


def read_files(store: StoreOptions, share: FileShare, include_headers: bool) -> Iterator[pa.RecordBatch]:
    """On an executor: the share's files, about _GROUP_BYTES at a time, decoded per partition."""
    bounds = {(t, p): (s, e) for t, p, s, e in share.bounds}
    group: list[tuple[str, int, BatchRow]] = []
    size = 0
    rows = sorted(share.rows, key=lambda x: (x[2].object_key, x[2].byte_offset))
    for i, item in enumerate(rows):
        group.append(item)
        size += item[2].byte_size
        if size >= _GROUP_BYTES or i == len(rows) - 1:
            blobs = _RUNNER.run(_read(store, [r for _, _, r in group]))
            by_tp: dict[tuple[str, int], list[tuple[int, bytearray]]] = {}
            for (t, p, r), blob in zip(group, blobs):
                by_tp.setdefault((t, p), []).append((r.base_offset, blob))
            for (t, p), batches in sorted(by_tp.items()):
                batches.sort(key=lambda x: x[0])
                start, end = bounds[(t, p)]
                batch, _ = records_to_arrow([b"".join(b for _, b in batches)], t, p, start=start, end=end,
                                            include_headers=include_headers)
                if batch.num_rows:
                    yield batch
            group, size = [], 0
