"""Log cleaner: key-based compaction of logs whose cleanup.policy contains "compact" (Kafka's
LogCleaner, Cleaner, LogCleanerManager and OffsetMap, rebuilt on our segments).

What is cleanable
  Only inactive segments wholly below the high watermark, never the active one. The first dirty
  offset comes from the log's `cleaner-offset-checkpoint`; it is reset to the log start offset when
  it lies below the log start or past the log end (Kafka does the same). The cleanable range ends
  at the first uncleanable segment: the active segment, the first segment reaching the high
  watermark or the first offset of an open transaction (the last stable offset), or
  (min.compaction.lag.ms > 0) the first dirty segment whose newest timestamp is younger than the
  lag. The range always ends on a segment boundary.
  dirty ratio = bytes of the dirty cleanable segments / (those + the clean segments before them).
  A log is cleaned when the ratio is above min.cleanable.dirty.ratio (strictly, as Kafka), or when
  a dirty segment's first batch is older than max.compaction.lag.ms, or (our addition) when the
  earliest delete horizon of a kept tombstone has passed, so tombstones go after
  delete.retention.ms even when no new data arrives. The loop cleans the filthiest log, then looks
  again at once; when nothing qualifies it sleeps log.cleaner.backoff.ms.

Cleaning
  1. Offset map: key -> offset of its latest record, over the dirty cleanable segments (records at
     or after the first dirty offset). A transaction's records count only once its COMMIT marker is
     read, so an aborted or unfinished transaction never hides an earlier value. Its memory is bounded by
     log.cleaner.dedupe.buffer.size (key bytes + ~100 bytes of Python overhead per key); when it
     fills, the round stops at a segment boundary and the rest waits for the next round.
  2. Every segment from the first one up to the end of the mapped range is rewritten, in groups of
     consecutive segments whose sizes add up to at most segment.bytes (and whose indexes fit
     segment.index.bytes, and whose offsets fit an int32 from the group's base), one new segment
     per group, named after the group's first segment. A record is dropped when a later offset for
     its key is in the map, or when it is a tombstone (key, null value) in a batch whose delete
     horizon has passed. Records with a null key are kept (Kafka drops them as invalid; Produce
     rejects them on compacted topics, so only data written before a policy change has them).
     Conservative about transactions: control batches (markers) are copied unchanged and never
     removed; aborted records stay unless a later committed record supersedes them; tombstones in
     transactional batches get no delete horizon and stay until a later record supersedes them.
  3. A batch keeps its base offset, last offset delta (so producers' last sequences survive, as
     Kafka's overrideLastOffset), partition leader epoch, producer id/epoch/base sequence,
     attributes and compression codec; only the surviving records are re-encoded (their bytes are
     copied; timestamp deltas are rewritten only when the base timestamp changes). A batch whose
     records all survive and that needs no delete horizon is copied byte for byte.
  4. Delete horizon (KIP-534): a rewritten v2 batch that keeps a tombstone and has no horizon yet
     gets attribute bit 6 (hasDeleteHorizonMs) and base timestamp = now + delete.retention.ms; a
     tombstone is dropped by the first cleaning at or after that time.
  5. A batch that loses every record is dropped, except the last batch of an active idempotent
     producer and the last batch of each group, which stay as empty batches (header only,
     record count 0, offsets kept): producer state keeps its last sequence, and each cleaned
     segment ends exactly where its group ended, which is what crash recovery relies on.
  6. The aborted-transaction index of the cleaned segment is the concatenation of the group's
     indexes (markers and offsets stay, so every entry stays true).
  7. The leader epoch cache is not touched: batches keep their epochs, epochs keep their start
     offsets (a start offset may now fall in a gap, which OffsetForLeaderEpoch handles as Kafka).
  8. The checkpoint moves to the end of the cleaned range, with the earliest delete horizon of the
     tombstones kept.

Swapping a group in
  The cleaned segment is written as `.cleaned` files without the log's lock and swapped in under
  it by Log.swap_cleaned_segment, crash-safely (segment_swap.py, which also recovers a swap a
  crash interrupted when the log opens).

Files
  `cleaner-offset-checkpoint` in the chunk dir: "0\\nfirst_dirty_offset N\\ndelete_horizon_ms N\\n"
  (-1 = none), written atomically after each round.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from crc32c import crc32c

from broker.storage.atomic_file import write_atomically
from broker.storage.cleaner_view import CleanerView, SegmentInfo
from broker.storage.errors import StorageError
from broker.storage.segment import CorruptSegmentError, header_at
from broker.storage.segment_swap import CleanedSegmentWriter
from protocol.errors import ProtocolError
from protocol.primitives import read_varint, read_varlong, varint
from protocol.records.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_DELETE_HORIZON,
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    HEADER,
    LOG_OVERHEAD,
    BatchHeader,
)
from protocol.records.compression import compress, decompress

if TYPE_CHECKING:
    from broker.storage.log import Log

log = structlog.get_logger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
CHECKPOINT_VERSION = 0

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
DEFAULT_BACKOFF_MS = 15_000  # log.cleaner.backoff.ms
DEFAULT_DEDUPE_BUFFER_BYTES = 128 * 1024 * 1024  # log.cleaner.dedupe.buffer.size
MAP_ENTRY_OVERHEAD = 100  # bytes a dict entry costs beyond its key (bytes object, int, slot)
_READ_CHUNK = 1024 * 1024
_CRC = struct.Struct(">I")


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class CleaningAborted(Exception):
    """The round stopped: the log changed under it, or the cleaner is shutting down."""


# -- configuration -------------------------------------------------------------------------------


def cleanup_policies(topic_config: Mapping[str, str]) -> set[str]:
    raw = topic_config.get("cleanup.policy") or "delete"
    return {p.strip().lower() for p in str(raw).split(",") if p.strip()}


def retention_applies(topic_config: Mapping[str, str]) -> bool:
    """Time and size retention run only for "delete" logs (also "compact,delete"); a compact-only
    log loses segments only below its log start offset, as in Kafka."""
    return "delete" in cleanup_policies(topic_config)


def _int(props: Mapping[str, str], name: str, default: int) -> int:
    raw = props.get(name)
    if raw is None:
        return default
    try:
        return int(str(raw).strip())
    except ValueError:
        log.warning("cleaner_config_ignored", name=name, value=raw)
        return default


def _float(props: Mapping[str, str], name: str, default: float) -> float:
    raw = props.get(name)
    if raw is None:
        return default
    try:
        return float(str(raw).strip())
    except ValueError:
        log.warning("cleaner_config_ignored", name=name, value=raw)
        return default


@dataclass(frozen=True)
class CleanerConfig:
    """The topic settings the cleaner obeys (Kafka's names in the comments)."""

    compact: bool = True  # cleanup.policy contains "compact"
    delete: bool = False  # cleanup.policy contains "delete": retention runs too
    delete_retention_ms: int = 86_400_000  # delete.retention.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = INT64_MAX  # max.compaction.lag.ms

    @classmethod
    def from_topic_config(cls, cfg: Mapping[str, str]) -> CleanerConfig:
        policies = cleanup_policies(cfg)
        return cls(
            compact="compact" in policies,
            delete="delete" in policies,
            delete_retention_ms=max(0, _int(cfg, "delete.retention.ms", 86_400_000)),
            min_cleanable_dirty_ratio=_float(cfg, "min.cleanable.dirty.ratio", 0.5),
            min_compaction_lag_ms=max(0, _int(cfg, "min.compaction.lag.ms", 0)),
            max_compaction_lag_ms=max(0, _int(cfg, "max.compaction.lag.ms", INT64_MAX)),
        )


# -- checkpoint ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CleanerCheckpoint:
    first_dirty_offset: int = -1  # -1: never cleaned (dirty from the log start)
    delete_horizon_ms: int = -1  # earliest delete horizon of a kept tombstone, -1: none


def read_checkpoint(dir: Path) -> CleanerCheckpoint:
    """The log's cleaner checkpoint; missing or unreadable means never cleaned (harmless: the
    next round treats the whole log as dirty)."""
    path = dir / CLEANER_CHECKPOINT
    try:
        text = path.read_text("ascii")
    except FileNotFoundError:
        return CleanerCheckpoint()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cleaner_checkpoint_unreadable", path=str(path), error=str(exc))
        return CleanerCheckpoint()
    lines = text.split("\n")
    try:
        if lines[0].strip() != str(CHECKPOINT_VERSION):
            raise ValueError(f"unknown version {lines[0]!r}")
        fields = dict(line.split(" ", 1) for line in lines[1:] if line.strip())
        return CleanerCheckpoint(int(fields["first_dirty_offset"]), int(fields["delete_horizon_ms"]))
    except (ValueError, KeyError) as exc:
        log.warning("cleaner_checkpoint_unreadable", path=str(path), error=str(exc))
        return CleanerCheckpoint()


def write_checkpoint(dir: Path, checkpoint: CleanerCheckpoint) -> None:
    text = (
        f"{CHECKPOINT_VERSION}\nfirst_dirty_offset {checkpoint.first_dirty_offset}\n"
        f"delete_horizon_ms {checkpoint.delete_horizon_ms}\n"
    )
    write_atomically(dir / CLEANER_CHECKPOINT, text.encode("ascii"))


# -- records ---------------------------------------------------------------------------------------


class _Batch:
    """A batch's records, parsed just enough to filter them and copy their bytes."""

    __slots__ = ("header", "body", "records")

    def __init__(self, header: BatchHeader, data) -> None:
        self.header = header
        body = memoryview(data)[BATCH_HEADER_SIZE : header.size]
        if header.compression:
            try:
                body = memoryview(decompress(header.compression, body))
            except ProtocolError as exc:
                raise CorruptSegmentError(0, f"batch at offset {header.base_offset}: {exc.reason}") from None
        self.body = body
        # (offset, timestamp delta, key, is tombstone, record start, start after offset delta, end)
        self.records: list[tuple[int, int, bytes | None, bool, int, int, int]] = []
        pos, n = 0, len(body)
        try:
            for _ in range(header.record_count):
                length, p = read_varint(body, pos)
                end = p + length
                if length < 1 or end > n:
                    raise IndexError
                ts_delta, q = read_varlong(body, p + 1)  # p: the record's attributes byte
                off_delta, q = read_varint(body, q)
                rest = q
                klen, q = read_varint(body, q)
                key = None
                if klen >= 0:
                    key = bytes(body[q : q + klen])
                    q += klen
                vlen, q = read_varint(body, q)
                if q > end:
                    raise IndexError
                self.records.append((header.base_offset + off_delta, ts_delta, key, vlen < 0, p, rest, end))
                pos = end
        except (IndexError, ProtocolError):
            raise CorruptSegmentError(0, f"batch at offset {header.base_offset} has a malformed record") from None
        if pos != n:
            raise CorruptSegmentError(0, f"batch at offset {header.base_offset} has bytes after its records")


def _build_batch(header: BatchHeader, records: bytes, count: int, attributes: int, base_ts: int, max_ts: int) -> bytes:
    """A v2 batch with the original's offsets, epoch, producer fields and codec, holding `records`."""
    codec = attributes & ATTR_COMPRESSION_MASK
    body = compress(codec, records) if codec and count else records
    total = BATCH_HEADER_SIZE + len(body)
    buf = bytearray(total)
    HEADER.pack_into(
        buf,
        0,
        header.base_offset,
        total - LOG_OVERHEAD,
        header.partition_leader_epoch,
        2,
        0,
        attributes,
        header.last_offset_delta,
        base_ts,
        max_ts,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        count,
    )
    buf[BATCH_HEADER_SIZE:] = body
    _CRC.pack_into(buf, CRC_OFFSET, crc32c(memoryview(buf)[ATTRIBUTES_OFFSET:]))
    return bytes(buf)


def empty_batch(header: BatchHeader) -> bytes:
    """Header only, no records, offsets kept (Kafka's writeEmptyHeader): uncompressed, no delete
    horizon, base and max timestamp = the original max timestamp."""
    attributes = header.attributes & ~(ATTR_COMPRESSION_MASK | ATTR_DELETE_HORIZON)
    return _build_batch(header, b"", 0, attributes, header.max_timestamp, header.max_timestamp)


@dataclass
class _Filtered:
    data: bytes | memoryview | None  # None: every record dropped
    changed: bool
    max_timestamp: int = -1
    horizon: int = -1  # delete horizon of kept keyed tombstones, -1 if none
    records_read: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0


def filter_batch(
    header: BatchHeader, data, key_map: Mapping[bytes, int], now_ms: int, delete_retention_ms: int
) -> _Filtered:
    """Kafka's retention rules for one batch (see the module docstring)."""
    if header.is_control:
        return _Filtered(
            data, False, header.max_timestamp, records_read=header.record_count, records_kept=header.record_count
        )
    batch = _Batch(header, data)
    has_horizon = bool(header.attributes & ATTR_DELETE_HORIZON)
    transactional = header.is_transactional  # its tombstones stay: the transaction may not have committed
    kept = []
    tombstones = dropped_tombstones = 0
    for rec in batch.records:
        offset, _, key, tombstone, *_ = rec
        if key is not None:
            if offset < key_map.get(key, -1):
                continue  # a later record of the key exists
            if tombstone and not transactional:
                if has_horizon and now_ms >= header.base_timestamp:
                    dropped_tombstones += 1
                    continue
                tombstones += 1
        kept.append(rec)
    result = _Filtered(
        None, True, records_read=len(batch.records), records_kept=len(kept), tombstones_dropped=dropped_tombstones
    )
    if not kept:
        return result
    set_horizon = tombstones > 0 and not has_horizon
    if len(kept) == len(batch.records) and not set_horizon:
        result.data, result.changed, result.max_timestamp = data, False, header.max_timestamp
        result.horizon = header.base_timestamp if tombstones else -1
        return result
    body = batch.body
    old_base = header.base_timestamp
    attributes = header.attributes
    if set_horizon:
        base_ts = min(now_ms + delete_retention_ms, INT64_MAX)
        attributes |= ATTR_DELETE_HORIZON
        parts = []
        for _, ts_delta, _, _, start, rest, end in kept:
            inner = bytes(body[start : start + 1]) + varint(old_base + ts_delta - base_ts) + _offset_delta(body, start)
            inner += body[rest:end]
            parts.append(varint(len(inner)) + inner)
        records = b"".join(parts)
    else:
        base_ts = old_base
        records = b"".join(_raw_record(body, start, end) for _, _, _, _, start, _, end in kept)
    if header.log_append_time:
        max_ts = header.max_timestamp
    else:
        max_ts = max(old_base + ts_delta for _, ts_delta, *_ in kept)
    result.data = _build_batch(header, records, len(kept), attributes, base_ts, max_ts)
    result.max_timestamp = max_ts
    result.horizon = base_ts if tombstones else -1
    return result


def _is_commit_marker(batch: _Batch) -> bool:
    """A control batch's record key: version int16, type int16 (0 ABORT, 1 COMMIT)."""
    return bool(batch.records) and (key := batch.records[0][2]) is not None and key[2:4] == b"\x00\x01"


def _offset_delta(body, start: int) -> bytes:
    """The raw offset-delta varint of the record whose attributes byte is at `start`."""
    _, q = read_varlong(body, start + 1)
    _, r = read_varint(body, q)
    return bytes(body[q:r])


def _raw_record(body, start: int, end: int) -> bytes:
    """A record's bytes including its length prefix (`start` is its attributes byte)."""
    return varint(end - start) + bytes(body[start:end])


# -- reading segments --------------------------------------------------------------------------


def _iter_batches(fd: int, size: int) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every batch of a segment's trusted bytes [0, size), whole, in chunked reads."""
    pos = 0
    while pos < size:
        buf = memoryview(os.pread(fd, min(_READ_CHUNK, size - pos), pos))
        if len(buf) < BATCH_HEADER_SIZE:
            raise CorruptSegmentError(pos, "segment is shorter than the cleaner expected")
        used = 0
        while len(buf) - used >= BATCH_HEADER_SIZE:
            header = header_at(buf, used, pos + used)
            if used + header.size > len(buf):
                break
            yield header, buf[used : used + header.size]
            used += header.size
        if used == 0:  # one batch larger than the chunk
            header = header_at(buf, 0, pos)
            if pos + header.size > size:
                raise CorruptSegmentError(pos, "batch runs past the end of the segment")
            whole = memoryview(os.pread(fd, header.size, pos))
            if len(whole) != header.size:
                raise CorruptSegmentError(pos, "segment is shorter than the cleaner expected")
            yield header, whole
            used = header.size
        pos += used


# -- planning and cleaning -------------------------------------------------------------------------


@dataclass
class CleaningPlan:
    view: CleanerView
    checkpoint: CleanerCheckpoint
    first_dirty: int
    cleanable: int  # the first `cleanable` inactive segments may be cleaned
    first_uncleanable: int
    dirty_bytes: int
    total_bytes: int
    reason: str

    @property
    def ratio(self) -> float:
        return self.dirty_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass
class CleanResult:
    log: str
    reason: str
    first_dirty: int
    end_offset: int  # the new first dirty offset
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    keys: int = 0
    records_read: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0
    groups_swapped: int = 0
    delete_horizon_ms: int = -1
    duration_ms: float = 0.0


def plan_cleaning(log_: Log, cfg: CleanerConfig, now_ms: int, *, force: bool = False) -> CleaningPlan | None:
    """The log's cleanable range, if the log should be cleaned now (or has anything cleanable, with force)."""
    view = log_.cleaner_view()
    checkpoint = read_checkpoint(log_.dir)
    first_dirty = checkpoint.first_dirty_offset
    if first_dirty < view.log_start or first_dirty > view.log_end:
        first_dirty = view.log_start
    segs = view.segments
    n = 0
    for s in segs:
        if s.next_base > view.high_watermark:
            break
        if 0 <= view.first_unstable_offset < s.next_base:  # never past the last stable offset
            break
        lag = cfg.min_compaction_lag_ms
        if lag > 0 and s.next_base > first_dirty and s.largest_timestamp > now_ms - lag:
            break
        n += 1
    if n == 0:
        return None
    first_uncleanable = segs[n].base_offset if n < len(segs) else view.active_base
    clean_bytes = sum(s.size for s in segs if s.next_base <= first_dirty)
    dirty_bytes = sum(s.size for s in segs[:n] if s.next_base > first_dirty)
    plan = CleaningPlan(view, checkpoint, first_dirty, n, first_uncleanable, dirty_bytes, clean_bytes + dirty_bytes, "")
    earliest = min(
        (s.first_batch_timestamp for s in segs if s.next_base > first_dirty and s.first_batch_timestamp > 0),
        default=None,
    )
    if force:
        plan.reason = "forced"
    elif dirty_bytes > 0 and plan.ratio > cfg.min_cleanable_dirty_ratio:
        plan.reason = "dirty ratio"
    elif dirty_bytes > 0 and earliest is not None and earliest < now_ms - cfg.max_compaction_lag_ms:
        plan.reason = "max.compaction.lag.ms"
    elif 0 <= checkpoint.delete_horizon_ms <= now_ms:
        plan.reason = "delete horizon"
    else:
        return None
    return plan


def _group(segs: list[SegmentInfo], max_bytes: int, max_index_bytes: int) -> list[list[SegmentInfo]]:
    """Consecutive segments whose total size fits segment.bytes and indexes fit segment.index.bytes,
    with every offset within int32 of the group's base (Kafka's groupSegmentsBySize)."""
    groups: list[list[SegmentInfo]] = []
    i = 0
    while i < len(segs):
        group = [segs[i]]
        size, index_size, time_size = segs[i].size, segs[i].offset_index_bytes, segs[i].time_index_bytes
        i += 1
        while i < len(segs):
            s = segs[i]
            if (
                size + s.size > max_bytes
                or index_size + s.offset_index_bytes > max_index_bytes
                or time_size + s.time_index_bytes > max_index_bytes
                or (s.size > 0 and s.next_base - 1 - group[0].base_offset > INT32_MAX)
            ):
                break
            group.append(s)
            size, index_size, time_size = (
                size + s.size,
                index_size + s.offset_index_bytes,
                time_size + s.time_index_bytes,
            )
            i += 1
        groups.append(group)
    return groups


def _open_segment(info: SegmentInfo) -> int:
    try:
        return os.open(info.path, os.O_RDONLY)
    except FileNotFoundError:
        raise CleaningAborted(f"segment {info.path.name} is gone (deleted meanwhile)") from None


def build_offset_map(
    segs: list[SegmentInfo], first_dirty: int, budget_bytes: int, stop: Callable[[], bool]
) -> tuple[dict[bytes, int], int]:
    """(key -> latest offset, number of segments mapped). Segments wholly before first_dirty are
    skipped; the map stops at a segment boundary once it would pass the budget (the first dirty
    segment is always mapped, so every round makes progress). A transaction's records enter the
    map when its COMMIT marker is read; an aborted or unfinished one's never do."""
    key_map: dict[bytes, int] = {}
    used = 0
    open_txns: dict[int, dict[bytes, int]] = {}  # producer id -> its transaction's keys so far
    for i, s in enumerate(segs):
        if s.next_base <= first_dirty:
            continue
        seg_map: dict[bytes, int] = {}
        fd = _open_segment(s)
        try:
            for header, data in _iter_batches(fd, s.size):
                if stop():
                    raise CleaningAborted("the cleaner is stopping")
                if header.last_offset < first_dirty:
                    continue
                batch = _Batch(header, data)
                if header.is_control:
                    txn = open_txns.pop(header.producer_id, None)
                    if txn and _is_commit_marker(batch):
                        for key, offset in txn.items():
                            if offset > seg_map.get(key, key_map.get(key, -1)):
                                seg_map[key] = offset
                    continue
                target = open_txns.setdefault(header.producer_id, {}) if header.is_transactional else seg_map
                for offset, _, record_key, *_ in batch.records:
                    if record_key is not None and offset >= first_dirty:
                        target[record_key] = offset
        finally:
            os.close(fd)
        added = sum(len(k) + MAP_ENTRY_OVERHEAD for k in seg_map if k not in key_map)
        if key_map and used + added > budget_bytes:
            return key_map, i
        key_map.update(seg_map)
        used += added
    return key_map, len(segs)


def clean_log(
    log_: Log,
    cfg: CleanerConfig,
    now_ms: int | None = None,
    *,
    plan: CleaningPlan | None = None,
    force: bool = False,
    dedupe_buffer_bytes: int = DEFAULT_DEDUPE_BUFFER_BYTES,
    stop: Callable[[], bool] = lambda: False,
) -> CleanResult | None:
    """One cleaning round of one log (synchronous: run it off the event loop). None if the log
    needs no cleaning. Raises CleaningAborted if the log changed under the round (segments
    already swapped stay swapped: each group is consistent on its own), StorageError if the log
    is closed or failed."""
    started = time.monotonic()
    now = now_ms if now_ms is not None else _wall_clock_ms()
    if plan is None:
        plan = plan_cleaning(log_, cfg, now, force=force)
        if plan is None:
            return None
    view = plan.view
    segs = view.segments[: plan.cleanable]
    key_map, mapped = build_offset_map(segs, plan.first_dirty, dedupe_buffer_bytes, stop)
    segs = segs[:mapped]
    end_offset = segs[-1].next_base
    result = CleanResult(f"{log_.dir.name}", plan.reason, plan.first_dirty, end_offset, keys=len(key_map))
    result.segments_before = len(segs)
    result.bytes_before = sum(s.size for s in segs)
    horizons: list[int] = []
    lcfg = view.config
    for group in _group(segs, lcfg.segment_bytes, lcfg.segment_index_bytes):
        size, changed = _clean_group(log_.dir, group, key_map, view, cfg, now, stop, result, horizons)
        if changed:
            if not log_.swap_cleaned_segment(group):
                raise CleaningAborted(f"{log_.dir.name} changed during cleaning")
            result.groups_swapped += 1
        result.segments_after += 1
        result.bytes_after += size
    result.delete_horizon_ms = min(horizons, default=-1)
    write_checkpoint(log_.dir, CleanerCheckpoint(max(end_offset, plan.first_dirty), result.delete_horizon_ms))
    result.duration_ms = round((time.monotonic() - started) * 1000, 1)
    log.info(
        "log_cleaned",
        dir=str(log_.dir),
        reason=result.reason,
        first_dirty_offset=result.first_dirty,
        end_offset=end_offset,
        keys=result.keys,
        segments_before=result.segments_before,
        segments_after=result.segments_after,
        bytes_before=result.bytes_before,
        bytes_after=result.bytes_after,
        records_read=result.records_read,
        records_kept=result.records_kept,
        tombstones_dropped=result.tombstones_dropped,
        groups_swapped=result.groups_swapped,
        delete_horizon_ms=result.delete_horizon_ms,
        duration_ms=result.duration_ms,
    )
    return result


def _clean_group(
    dir: Path,
    group: list[SegmentInfo],
    key_map: Mapping[bytes, int],
    view: CleanerView,
    cfg: CleanerConfig,
    now_ms: int,
    stop: Callable[[], bool],
    result: CleanResult,
    horizons: list[int],
) -> tuple[int, bool]:
    """Write the group's cleaned segment as `.cleaned` files. Returns (its size, whether it differs
    from the group); when it does not, the `.cleaned` files are already gone."""
    lcfg = view.config
    writer = CleanedSegmentWriter(dir, group[0].base_offset, lcfg.segment_index_bytes, lcfg.index_interval_bytes)
    changed = len(group) > 1
    emptied: tuple[BatchHeader, memoryview] | None = None  # lost every record: kept only if it ends the group

    def keep_empty(header: BatchHeader, data) -> None:
        nonlocal changed
        if header.record_count == 0:
            writer.add(data, header.last_offset, header.max_timestamp)  # already empty: as it is
        else:
            writer.add(empty_batch(header), header.last_offset, header.max_timestamp)
            changed = True

    try:
        for info in group:
            fd = _open_segment(info)
            try:
                for header, data in _iter_batches(fd, info.size):
                    if stop():
                        raise CleaningAborted("the cleaner is stopping")
                    out = filter_batch(header, data, key_map, now_ms, cfg.delete_retention_ms)
                    result.records_read += out.records_read
                    result.records_kept += out.records_kept
                    result.tombstones_dropped += out.tombstones_dropped
                    if emptied is not None:  # not the group's last batch after all: it goes
                        emptied, changed = None, True
                    if out.data is None:
                        if header.producer_id >= 0 and view.producer_last_offsets.get(header.producer_id) == (
                            header.last_offset
                        ):
                            keep_empty(header, data)  # an active producer's last batch: its sequence stays
                        else:
                            emptied = (header, data)
                        continue
                    changed = changed or out.changed
                    if out.horizon >= 0:
                        horizons.append(out.horizon)
                    writer.add(out.data, header.last_offset, out.max_timestamp)
            finally:
                os.close(fd)
        if emptied is not None:
            keep_empty(*emptied)  # the cleaned segment ends where the group did
        if not changed:
            writer.discard()
            return writer.size, False
        writer.finish()
        # Markers are never removed and offsets never change: the group's entries all stay true.
        writer.write_txn_index(e for info in group for e in info.segment.txn_index.entries)
        return writer.size, True
    except BaseException:
        writer.discard()
        raise


# -- the cleaner loop ----------------------------------------------------------------------------


class LogCleaner:
    """Cleans the broker's compacted logs in the background, one log per round on its own thread
    (Kafka's log.cleaner.threads = 1). `logs()` is called on the event loop and returns
    (log, effective topic config) pairs."""

    def __init__(
        self,
        logs: Callable[[], Iterable[tuple[Log, Mapping[str, str]]]],
        props: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        props = props or {}
        self.enabled = str(props.get("log.cleaner.enable", "true")).strip().lower() != "false"
        self.backoff_ms = max(0, _int(props, "log.cleaner.backoff.ms", DEFAULT_BACKOFF_MS))
        self.dedupe_buffer_bytes = max(1, _int(props, "log.cleaner.dedupe.buffer.size", DEFAULT_DEDUPE_BUFFER_BYTES))
        self._logs = logs
        self._clock = clock
        self._stop = threading.Event()
        self._executor: ThreadPoolExecutor | None = None
        self._uncleanable: weakref.WeakSet[Log] = weakref.WeakSet()  # failed once: skipped (Kafka does too)
        self.rounds = 0  # cleanings completed, for tests and metrics

    def candidates(self) -> list[tuple[Log, CleanerConfig]]:
        out = []
        for lg, topic_config in self._logs():
            cfg = CleanerConfig.from_topic_config(topic_config)
            if cfg.compact and lg not in self._uncleanable:
                out.append((lg, cfg))
        return out

    def clean_filthiest(self, candidates: list[tuple[Log, CleanerConfig]], now_ms: int) -> CleanResult | None:
        """Plan every candidate, clean the one with the highest dirty ratio. None if none needed it."""
        best: tuple[Log, CleanerConfig, CleaningPlan] | None = None
        for lg, cfg in candidates:
            if self._stop.is_set():
                return None
            try:
                plan = plan_cleaning(lg, cfg, now_ms)
            except StorageError:
                continue  # closed, deleted or offline meanwhile
            except Exception:
                log.exception("log_cleaner_plan_failed", dir=str(lg.dir))
                self._uncleanable.add(lg)
                continue
            if plan is not None and (best is None or plan.ratio > best[2].ratio):
                best = (lg, cfg, plan)
        if best is None:
            return None
        lg, cfg, plan = best
        try:
            result = clean_log(
                lg, cfg, now_ms, plan=plan, dedupe_buffer_bytes=self.dedupe_buffer_bytes, stop=self._stop.is_set
            )
        except CleaningAborted as exc:
            log.info("log_cleaning_aborted", dir=str(lg.dir), reason=str(exc))
            return None
        except StorageError as exc:
            log.info("log_cleaning_skipped", dir=str(lg.dir), reason=str(exc))
            return None
        except Exception as exc:
            if isinstance(exc, OSError) and not lg.dir.exists():
                log.info("log_cleaning_skipped", dir=str(lg.dir), reason="the log was deleted")
                return None
            log.exception("log_cleaning_failed", dir=str(lg.dir))
            self._uncleanable.add(lg)
            return None
        self.rounds += 1
        return result

    async def run(self) -> None:
        if not self.enabled:
            return
        loop = asyncio.get_running_loop()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="log-cleaner")
        try:
            while not self._stop.is_set():
                cleaned = None
                candidates = self.candidates()
                if candidates:
                    try:
                        cleaned = await loop.run_in_executor(
                            self._executor, self.clean_filthiest, candidates, self._clock()
                        )
                    except Exception:
                        log.exception("log_cleaner_round_failed")
                if cleaned is None:
                    await asyncio.sleep(self.backoff_ms / 1000)
                else:
                    await asyncio.sleep(0)  # more may be dirty: look again at once
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        """Stop: a round in progress aborts at its next batch and deletes its `.cleaned` files."""
        self._stop.set()


__all__ = [
    "CLEANER_CHECKPOINT",
    "CleanResult",
    "CleanerCheckpoint",
    "CleanerConfig",
    "CleaningAborted",
    "CleaningPlan",
    "LogCleaner",
    "clean_log",
    "cleanup_policies",
    "empty_batch",
    "filter_batch",
    "plan_cleaning",
    "read_checkpoint",
    "retention_applies",
    "write_checkpoint",
]
