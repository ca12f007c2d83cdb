"""Producer state from batches already numbered: a follower's appends, and the replay after a
snapshot when a log opens or is truncated (Kafka's UnifiedLog.updateProducers and
rebuildProducerState, which LogLoader calls too). An ABORT marker met on the way adds its
transaction to the aborted-transaction index of the segment it lies in."""

from __future__ import annotations

from bisect import bisect_right
from pathlib import Path

import structlog

from broker.storage.local_log import LocalLog
from broker.storage.producer_state import CompletedTxn, ProducerStateManager
from broker.storage.segment import LogSegment
from broker.storage.txn_index import AbortedTxn
from protocol.errors import ProtocolError
from protocol.records.batch import BatchHeader
from protocol.records.control import TxnMarker, read_txn_marker

log = structlog.get_logger(__name__)


def marker_of(batch, header: BatchHeader, dir: Path) -> TxnMarker | None:
    """The transaction marker of one control batch; None (logged) if it does not decode."""
    try:
        return read_txn_marker(batch)
    except ProtocolError as exc:
        log.warning("control_batch_undecodable", dir=str(dir), offset=header.base_offset, error=str(exc))
        return None


def index_aborted(producer_state: ProducerStateManager, seg: LogSegment, txn: CompletedTxn) -> None:
    """An aborted transaction into the index of the segment holding its marker."""
    lso = producer_state.last_stable_offset_after(txn)
    seg.txn_index.append(AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, lso))


def track_replicated(
    producer_state: ProducerStateManager, seg: LogSegment, data, batches: list[tuple[int, BatchHeader]], dir: Path
) -> None:
    """Follower side: state from batches the leader numbered and checked (positions in `data`);
    they were just appended to `seg`, the active segment, which so holds their markers."""
    for pos, header in batches:
        if header.producer_id >= 0:
            marker = marker_of(data[pos : pos + header.size], header, dir) if header.is_control else None
            done = producer_state.update_from_header(header, marker)
            if done is not None and done.aborted:
                index_aborted(producer_state, seg, done)


def rebuild_producer_state(
    producer_state: ProducerStateManager,
    local: LocalLog,
    log_start: int,
    high_watermark: int,
    now_ms: int,
    *,
    rebuild_txn_index_from: int | None = None,
) -> tuple[int, int]:
    """Producer state = newest snapshot in [log start, min(HW, LEO)] + the batch headers after
    it (header reads; only markers are decoded). Starting at or below the high watermark
    brings back the completed transactions whose marker it has not passed yet. Segments from
    `rebuild_txn_index_from` on get their aborted-transaction index rebuilt on the way (replay
    then starts at or below it). Returns (offset replayed from, batches replayed)."""
    leo = local.leo
    target = min(high_watermark, leo)
    if rebuild_txn_index_from is not None:
        target = min(target, rebuild_txn_index_from)
        for seg in local.segments:
            if seg.base_offset >= rebuild_txn_index_from:
                seg.txn_index.reset()
    start = producer_state.load(log_start, leo, now_ms, at_or_below=target)
    replayed = 0
    if start < leo:
        first = max(0, bisect_right(local.bases, start) - 1)
        for seg in local.segments[first:]:
            found = seg.find_batch(start, seg.size)
            if found is None:
                continue
            rebuild = rebuild_txn_index_from is not None and seg.base_offset >= rebuild_txn_index_from
            for pos, header in seg.iter_headers(found[0], seg.size):
                if header.producer_id >= 0:
                    marker = (
                        marker_of(seg.read_batch(pos, header.size), header, local.dir) if header.is_control else None
                    )
                    done = producer_state.update_from_header(header, marker)
                    if done is not None and done.aborted and rebuild:
                        index_aborted(producer_state, seg, done)
                    replayed += 1
    producer_state.on_high_watermark(high_watermark)
    return start, replayed


__all__ = ["index_aborted", "marker_of", "rebuild_producer_state", "track_replicated"]
