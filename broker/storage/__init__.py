"""Storage: log dirs, chunk replica logs, segments and their indexes. Files only; no requests, no
sockets, no asyncio. Methods are synchronous (the broker runs the fsync-heavy ones in an executor).

On-disk layout
--------------
::

    <log dir>/                              one entry of log.dirs (LogDir)
        meta.properties                     version=1, node.id, cluster.id, directory.id (Kafka's format)
        .kafka_cleanshutdown                present only between a clean broker shutdown and the next start
        high-watermark-checkpoint           "0\\n<count>\\n<replica dir> <incarnation hex> <high watermark>\\n..."
                                            every log's high watermark (as Kafka's replication-offset-checkpoint),
                                            written by the periodic checkpoint and the shutdown (log_state.py)
        <topic>-<partition>-<chunkStart>/   one chunk replica (Log); parse with rsplit('-', 2)
            00000000000000000000.log        segment: whole RecordBatch v2 batches, as produced/replicated
            00000000000000000000.index      offset index of that segment
            00000000000000000000.timeindex  time index of that segment
            00000000000000000000.txnindex   aborted transactions whose ABORT marker is in that segment
                                            (34-byte entries, Kafka's; only once there is one)
            ...                             name = base offset, 20 digits, so names sort like offsets
            leader-epoch-checkpoint         "0\\n<count>\\n<epoch> <start offset>\\n..." (Kafka's text format)
            partition.metadata              "version: 0\\ntopic_id: <base64 uuid>" (Kafka's format)
            log-state.checkpoint            "0\\nlog_start_offset N\\nrecovery_point N\\nhigh_watermark N\\nincarnation X\\n"
                                            rewritten when the log start, recovery point or incarnation
                                            (new at creation and each truncation) moves
            00000000000000000000.snapshot   producer state of every batch below that offset (written on
                                            roll and on clean close)
            cleaner-offset-checkpoint       compacted logs: first dirty offset, earliest pending delete horizon
            *.cleaned / *.swap              a compaction swap in progress (recovered or removed on open)
        <topic>-<partition>-<chunkStart>.move/    a replica being copied in (JBOD move): not served
        <topic>-<partition>-<chunkStart>.delete/  a replica waiting for deletion: not served

A partition that never had chunks is one chunk starting at 0 (`orders-3-0`).

Segment files
  `.log`: batches back to back, bytes exactly as written (offsets and partition leader epoch patched
  into the header on the leader; never re-encoded). A batch never spans two segments.
  `.index`: sparse, append-only (not preallocated: the file length is the number of entries, so no
  trimming and nothing to guess after a crash). Entry = int32 offset relative to the segment's base
  offset (the last offset of a batch) + int32 byte position of that batch, big-endian. One entry
  per index.interval.bytes of data.
  `.timeindex`: sparse, append-only. Entry = int64 largest timestamp so far + int32 relative offset
  (last offset of the batch that carried it). Timestamps strictly increase; the last entry of an
  inactive segment is its max timestamp (written on roll and on close).
  A segment rolls when the next append would pass segment.bytes, when the appended batches' max
  timestamp is more than segment.ms (less the segment's random share of segment.jitter.ms) past its
  first batch's timestamp (record time, as Kafka; the segment's creation time only when it has no
  timestamps), when either index reaches segment.index.bytes, or when a relative offset would
  overflow int32. Deleted segments are renamed `<name>.deleted` and unlinked
  file.delete.delay.ms later; leftovers are removed on the next open.

Small files are written atomically (tmp + fsync + rename + fsync of the dir); a new replica's
files and leader-epoch rewrites skip the fsyncs, which the log's next flush does before the
recovery point moves.

Descriptors
  Segment and index files are opened on use through one process-wide LRU (file_cache.py,
  `log.open.files.max`) and pinned while in use; nothing else keeps a descriptor open. EMFILE,
  ENFILE and ENOMEM fail the operation with ResourceExhaustedError (retriable) and leave the log
  online (exhaustion.py); other OSErrors fail the log and take its dir offline.

Recovery
  A broker's shutdown closes every log without fsyncs, syncs each log dir's filesystem once
  (syncfs) and writes the dir's `.kafka_cleanshutdown` (Kafka's marker, one per dir; log_dir.py).
  The next start removes it before opening anything and opens each log that was there without
  recovery. Otherwise Log.open checks every batch (header + CRC32C + increasing offsets) from
  the segment holding the recovery point on, cuts a torn or corrupt tail at the last whole batch,
  deletes later segments, rebuilds those segments' indexes and re-derives leader epochs from the
  batches. Indexes of other segments are sanity-checked and rebuilt if missing or damaged.
  Producer state = the newest snapshot at or below the high watermark (and the first recovered
  segment), plus a replay of the batch headers after it; the replay rebuilds the `.txnindex` of
  recovered segments from their ABORT markers.

Transactions
  Open transactions and completed ones whose marker the high watermark has not passed make the
  log's last stable offset (Log.last_stable_offset); read_committed fetches read up to it and get
  Log.aborted_transactions() for the range they return.
"""

from broker.storage.config import LogConfig
from broker.storage.errors import (
    InconsistentTopicIdError,
    InvalidRecordError,
    InvalidTimestampError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    ResourceExhaustedError,
    StorageError,
    UnexpectedAppendOffsetError,
)
from broker.storage.leader_epoch import LeaderEpochCache
from broker.storage.log import AppendInfo, AppendOrigin, FetchInfo, Log
from broker.storage.log_dir import LogDir

__all__ = [
    "AppendInfo",
    "AppendOrigin",
    "FetchInfo",
    "InconsistentTopicIdError",
    "InvalidRecordError",
    "InvalidTimestampError",
    "LeaderEpochCache",
    "Log",
    "LogConfig",
    "LogDir",
    "OffsetOutOfRangeError",
    "RecordListTooLargeError",
    "RecordTooLargeError",
    "ResourceExhaustedError",
    "StorageError",
    "UnexpectedAppendOffsetError",
]
