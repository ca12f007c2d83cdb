"""A chunk-aware reader of one partition's offset range, in plain Python (no Spark).

It reads the cluster's Metadata (the chunk fields are tagged fields of the partition entry) and
goes straight to the brokers holding each part of the range: for an inactive chunk, one of its
in-sync replicas chosen by a stable hash of (topic, partition, chunk start, client id), falling
back to the others; for the active chunk, its leader. So the old data of a partition stays
readable while the active chunk's leader is down, and readers of an old chunk spread over its
replicas. The Spark source plans the same way (connector/cluster_view.py) and reads with the same
RangeReader (connector/range_reader.py); this is their record-at-a-time face.

    reader = ChunkReader("127.0.0.1:9092")
    for rec in reader.read("orders", 0, 0, 1000):
        print(rec.offset, rec.value)

Control batches are left out, and under read_committed so are the records of aborted
transactions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from connector.cluster_view import READ_COMMITTED, READ_UNCOMMITTED, ClusterView, SourceError, parse_bootstrap
from connector.range_reader import RangeReader
from protocol.records import Header, Record

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "ChunkReader", "ReaderError"]


class ReaderError(SourceError):
    """The range cannot be read: unknown topic, or no broker holding a part of it answers."""


class ChunkReader:
    def __init__(
        self,
        bootstrap: str | Sequence[tuple[str, int]],
        *,
        client_id: str = "strata-reader",
        isolation_level: int = READ_UNCOMMITTED,
        max_bytes: int = 4 << 20,
        timeout: float = 10.0,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap) if isinstance(bootstrap, str) else list(bootstrap)
        self.client_id = client_id
        self.isolation_level = isolation_level
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.served_by: dict[int, int] = {}  # broker id -> records it served

    def read(self, topic: str, partition: int, start: int, end: int) -> Iterator[Record]:
        """Every record of [start, end) in offset order, fetched as it is consumed."""
        try:
            view = ClusterView.load(self.bootstrap, self.timeout)
        except SourceError as e:
            raise ReaderError(str(e)) from None
        pv = view.partitions.get((topic, partition))
        if pv is None:
            raise ReaderError(f"{topic}-{partition} does not exist")
        reader = RangeReader(view.brokers, isolation_level=self.isolation_level, include_headers=True,
                             max_bytes=self.max_bytes, request_timeout=self.timeout, stall_timeout=self.timeout,
                             client_id=self.client_id)
        offset = start
        try:
            for c in pv.chunks:
                lo = max(offset, c.start)
                hi = end if c.active else min(end, c.stop + 1)  # type: ignore[operator]
                if lo >= hi:
                    continue
                if lo > offset:
                    raise ReaderError(f"offsets [{offset}, {lo}) of {topic}-{partition} are in no chunk (deleted?)")
                for batch in reader.read(topic, partition, lo, hi, c.read_order(topic, partition, self.client_id)):
                    yield from _records(batch)
                offset = hi
        except SourceError as e:
            raise ReaderError(str(e)) from None
        finally:
            for b, n in reader.served_by.items():
                self.served_by[b] = self.served_by.get(b, 0) + n
        if offset < end:
            raise ReaderError(f"offsets [{offset}, {end}) of {topic}-{partition} are in no chunk")


def _records(batch: pa.RecordBatch) -> Iterator[Record]:
    cols = batch.to_pydict()
    millis = batch.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds since the epoch
    for key, value, offset, us, headers in zip(cols["key"], cols["value"], cols["offset"], millis, cols["headers"]):
        yield Record(value=value, key=key, headers=[Header(h["key"], h["value"]) for h in headers],
                     timestamp=us // 1000, offset=offset)
