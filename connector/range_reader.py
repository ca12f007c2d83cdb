"""Read one offset range of one partition as Arrow batches, from an ordered list of brokers.

A range never crosses a chunk boundary (the planner splits there), so every broker in the list
holds all of it: the replicas of an inactive chunk, or the leader of the active chunk. The first
broker is tried first; on a connection error, a broker-side error or a stall the reader moves to
the next one and goes on from the offset it had reached, so a replica killed mid-read costs a
retry, not the read.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator, Sequence

import pyarrow as pa

from client.fetch import FETCH_VERSION, fetch_request
from connector.arrow_records import AbortedTransactions, records_to_arrow
from connector.cluster_view import SourceError
from node.client import ClientError, NodeClient
from protocol.errors import ProtocolError
from protocol.generated.fetch import FetchRequest

OFFSET_OUT_OF_RANGE = 1
MAX_REDIRECTS = 8  # a chain of preferred-replica answers longer than this is a loop


class RangeReader:
    def __init__(
        self,
        addresses: dict[int, tuple[str, int]],
        *,
        isolation_level: int = 1,
        include_headers: bool = False,
        max_bytes: int = 8 << 20,
        request_timeout: float = 30.0,
        stall_timeout: float = 30.0,
        client_id: str = "strata-spark",
    ) -> None:
        self.addresses = addresses
        self.isolation_level = isolation_level
        self.include_headers = include_headers
        self.max_bytes = max_bytes
        self.request_timeout = request_timeout
        self.stall_timeout = stall_timeout
        self.client_id = client_id
        self.served_by: dict[int, int] = {}  # broker id -> records it served (tests and logs)

    def read(self, topic: str, partition: int, start: int, end: int, brokers: Sequence[int]) -> Iterator[pa.RecordBatch]:
        """Yield Arrow batches with every record of [start, end) (aborted transactions and control
        records left out under read_committed)."""
        loop = asyncio.new_event_loop()
        try:
            yield from self._read(loop, topic, partition, start, end, list(brokers))
        finally:
            loop.close()

    def _read(self, loop: asyncio.AbstractEventLoop, topic: str, partition: int, start: int, end: int,
              brokers: list[int]) -> Iterator[pa.RecordBatch]:
        offset = start
        errors: list[str] = []
        aborted = AbortedTransactions()
        todo = deque(brokers)
        redirects = 0
        while todo and offset < end:
            broker = todo.popleft()
            addr = self.addresses.get(broker)
            if addr is None:
                errors.append(f"broker {broker}: unknown address")
                continue
            client = NodeClient(*addr, client_id=self.client_id, timeout=self.request_timeout)
            try:
                loop.run_until_complete(client.connect())
                last_progress = time.monotonic()
                while offset < end:
                    resp = loop.run_until_complete(client.request(self._request(topic, partition, offset), FETCH_VERSION))
                    p = resp.responses[0].partitions[0] if resp.responses and resp.responses[0].partitions else None
                    if resp.error_code or p is None:
                        raise SourceError(f"fetch error {resp.error_code}")
                    if p.error_code:
                        raise SourceError(f"fetch {topic}-{partition}@{offset} error {p.error_code}")
                    if not p.records and p.preferred_read_replica >= 0 and p.preferred_read_replica != broker:
                        # the broker says another one holds this offset (KIP-392's field, which
                        # Strata uses to point at the chunk holding it): go there next
                        redirects += 1
                        if redirects > MAX_REDIRECTS:
                            raise SourceError(f"redirected more than {MAX_REDIRECTS} times")
                        todo.appendleft(broker)
                        todo.appendleft(p.preferred_read_replica)
                        break
                    aborted.add((a.producer_id, a.first_offset) for a in p.aborted_transactions or ())
                    batch, next_offset = records_to_arrow(
                        [p.records or b""], topic, partition, start=offset, end=end,
                        include_headers=self.include_headers, aborted=aborted,
                    )
                    if next_offset > offset:
                        offset = next_offset
                        last_progress = time.monotonic()
                        self.served_by[broker] = self.served_by.get(broker, 0) + batch.num_rows
                        if batch.num_rows:
                            yield batch
                    elif time.monotonic() - last_progress > self.stall_timeout:
                        raise SourceError(f"no data at {topic}-{partition}@{offset} for {self.stall_timeout:.0f}s")
            except (ClientError, ProtocolError, SourceError, OSError) as e:
                errors.append(f"broker {broker}: {e}")
            finally:
                loop.run_until_complete(client.close())
        if offset < end:
            raise SourceError(
                f"could not read {topic}-{partition} [{offset}, {end}) from any of brokers {brokers}: {'; '.join(errors)}"
            )

    def _request(self, topic: str, partition: int, offset: int) -> FetchRequest:
        return fetch_request({(topic, partition): offset}, isolation_level=self.isolation_level,
                             max_bytes=self.max_bytes, partition_max_bytes=self.max_bytes)
