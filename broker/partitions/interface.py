"""The one partition interface Produce, Fetch, ListOffsets and DeleteRecords call (ARCHITECTURE.md, after Tansu's
storage trait). A local chunk replica (local.py), an inactive chunk served here or elsewhere
(chunk_views.py) and a diskless partition (broker/diskless/partition.py) implement it; the
handlers never ask which kind they hold: the router (router.py) hands them the one that serves.

append() does its synchronous part (validation, offset assignment or buffering) before it returns,
so pipelined requests on one connection keep their order; what it returns is awaited for the
answer (replication for acks=all, the WAL commit for diskless).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class AppendAnswer:
    error_code: int = 0
    error_message: str | None = None
    base_offset: int = -1
    log_append_time: int = -1
    log_start_offset: int = -1
    record_errors: list[tuple[int, str]] = field(default_factory=list)  # (batch index, message)


@dataclass(slots=True)
class FetchPosition:
    """What a fetcher asks of one partition."""

    fetch_offset: int
    max_bytes: int
    replica_id: int  # >= 0: a follower broker
    last_fetched_epoch: int
    read_committed: bool
    min_one_batch: bool


@dataclass(slots=True)
class ReadAnswer:
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: Any = b""
    size: int = 0
    aborted_transactions: list[tuple[int, int]] | None = None  # (producer id, first offset); None: not asked
    diverging: tuple[int, int] | None = None  # (epoch, end offset): the follower must truncate
    wait: bool = False  # nothing to read yet: a long poll waits on this partition
    # KIP-392: read this offset from that broker instead (an inactive chunk's replica)
    preferred_read_replica: int = -1
    # answer the Fetch now: a redirect, or bytes read on the client's behalf from another broker
    # (long-polling would only delay the client)
    at_once: bool = False


@dataclass(slots=True)
class OffsetAnswer:
    error_code: int = 0
    offset: int = -1
    timestamp: int = -1
    leader_epoch: int = -1


class ServedPartition(Protocol):
    def pipelines_appends(self, acks: int, size: int) -> bool:
        """Whether, once this partition has appended `size` bytes, the answer only waits on what
        is appended already: Produce then frees its connection's turn, and the client's next
        pipelined request appends behind it while the answer waits (answers still go back in
        order). A diskless append waits for the shared WAL file (diskless.wal.max.ms); a small
        local acks=all append for its replication, which the next request's records then share:
        the followers' next Fetch carries both."""
        ...

    def append(self, records: Any, acks: int, timeout_ms: int, now_ms: int) -> Awaitable[AppendAnswer]: ...

    def prepare_read(self, pos: FetchPosition) -> bool:
        """Start, without waiting, what read(pos) will need from elsewhere, so a request's
        partitions ask together (a diskless partition's batch lookup: one request per coordinator
        broker for the whole Fetch); read() then waits for it. True when read() may wait (a
        local replica has nothing to start and reads at once: False)."""

    async def read(self, pos: FetchPosition) -> ReadAnswer: ...

    async def offset_for(self, timestamp: int, read_committed: bool) -> OffsetAnswer: ...

    def add_data_waiter(self, fut: asyncio.Future, follower: bool = False) -> None:
        """Set `fut` when a read may bring more: for a follower, records past the log end; for a
        consumer, a high watermark (or last stable offset) move."""

    async def epoch_end_offset(self, leader_epoch: int, consumer: bool,
                               current_leader_epoch: int = -1) -> tuple[int, int, int]:
        """(error, epoch, end offset) for OffsetForLeaderEpoch; a consumer never sees past the
        high watermark. `current_leader_epoch`, the asker's (-1: none), is checked by the router
        for a leader's partition; a diskless one checks it where its epochs are kept (its
        coordinator)."""

    async def delete_records(self, offset: int) -> tuple[int, int]:
        """DeleteRecords: (error, low watermark) after removing the records below `offset` (-1:
        the high watermark); OFFSET_OUT_OF_RANGE beyond the high watermark."""


def answered(answer: AppendAnswer) -> Awaitable[AppendAnswer]:
    """An append decided synchronously (refused, or acks that need no waiting)."""
    fut = asyncio.get_running_loop().create_future()
    fut.set_result(answer)
    return fut
