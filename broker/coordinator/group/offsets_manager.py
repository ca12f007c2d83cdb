"""Committed offsets of every group type (Kafka's OffsetMetadataManager): OffsetCommit,
TxnOffsetCommit, OffsetFetch, OffsetDelete, retention, and the __consumer_offsets records that
hold them.

Offsets live with their group (base.Group), in the __consumer_offsets partition of the group id;
who may commit, what may be deleted and when offsets expire is the group type's to say. A commit
is appended to the partition leader's log before any await and takes effect once replicated
(bounded by offsets.commit.timeout.ms). A transactional commit is a batch of its producer's
transaction and stays pending until the transaction's marker reaches the partition: applied on
commit, dropped on abort. Deletions are tombstones, appended without waiting (as Kafka does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from broker.coordinator import wall_clock_ms
from broker.coordinator.group.base import OFFSET_COMMIT_LATEST_VERSION, Group, TopicPartition
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.loader import PendingTxnOffsets
from broker.coordinator.group.records import OffsetAndMetadata, offset_commit_key, offset_commit_value
from broker.coordinator.group.runtime import (
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    GroupRuntime,
    OffsetsPartition,
)
from protocol.errors import Errors

log = structlog.get_logger(__name__)

CommitCallback = Callable[[dict[TopicPartition, int]], None]


class OffsetsManager:
    def __init__(self, config: GroupCoordinatorConfig, runtime: GroupRuntime, new_group: Callable[[str], Group],
                 member_committed: Callable[[Group, str], None]) -> None:
        """`new_group(id)`: the group a commit for an unknown id makes (Kafka: an empty classic
        group, holding offsets only). `member_committed(group, member id)`: told of every accepted
        commit by a member (a classic member's commit counts as its heartbeat)."""
        self.config = config
        self._runtime = runtime
        self._new_group = new_group
        self._member_committed = member_committed
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ loading
    def load(self, ps: OffsetsPartition, offsets: dict[str, dict[TopicPartition, tuple[OffsetAndMetadata, int]]],
             pending_txn: PendingTxnOffsets) -> None:
        """The offsets of a partition being loaded (after its groups): committed, and transactional
        ones whose transaction had not ended in the log."""
        for gid, offs in offsets.items():
            if not offs:
                continue
            group = self._group_or_new(ps, gid)
            for tp, (value, rec_offset) in offs.items():
                group.apply_offset(tp, value, rec_offset)
        for producer_id, pend in pending_txn.items():
            for (gid, topic, partition), (pending, rec_offset) in pend.items():
                if pending is None:
                    continue
                group = self._group_or_new(ps, gid)
                group.add_pending_txn_offset(producer_id, (topic, partition), pending, rec_offset)

    def complete_transactions_ended_while_loading(self, ps: OffsetsPartition) -> None:
        for producer_id, commit, end in ps.completed_while_loading:
            for group in ps.groups.values():
                group.complete_txn_offsets(producer_id, commit, end)
        ps.completed_while_loading.clear()

    def _group_or_new(self, ps: OffsetsPartition, group_id: str) -> Group:
        group = ps.groups.get(group_id)
        if group is None:
            group = ps.groups[group_id] = self._new_group(group_id)
        return group

    # ------------------------------------------------------------------ OffsetCommit
    async def commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], api_version: int = OFFSET_COMMIT_LATEST_VERSION,
    ) -> dict[TopicPartition, int]:
        fut = self._loop.create_future()

        def respond(result: dict[TopicPartition, int]) -> None:
            if not fut.done():
                fut.set_result(result)

        self.handle_commit_offsets(group_id, member_id, instance_id, generation_id, offsets, respond, api_version)
        return await fut

    def handle_commit_offsets(
        self, group_id: str, member_id: str, instance_id: str | None, generation_id: int,
        offsets: dict[TopicPartition, OffsetAndMetadata], respond: CommitCallback,
        api_version: int = OFFSET_COMMIT_LATEST_VERSION,
    ) -> None:
        def all_(code: int) -> None:
            respond({tp: code for tp in offsets})

        err, ps = self._runtime.status(group_id, OFFSET_COMMIT)
        if err:
            all_(err)
            return
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None:
            if generation_id >= 0:
                all_(Errors.ILLEGAL_GENERATION)
                return
            log.info("group_created_by_offset_commit", group=group_id)
            group = ps.groups[group_id] = self._new_group(group_id)
        err = group.validate_offset_commit(member_id, instance_id, generation_id, api_version)
        if err:
            log.info("offset_commit_refused", group=group_id, member=member_id, generation=generation_id,
                     version=api_version, error_code=err)
            all_(err)
            return
        self._member_committed(group, member_id)
        self._store_offsets(ps, group, offsets, respond)

    def _split_oversized_metadata(
        self, offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> tuple[dict[TopicPartition, int], dict[TopicPartition, OffsetAndMetadata]]:
        """(OFFSET_METADATA_TOO_LARGE per partition whose metadata passes offset.metadata.max.bytes,
        the offsets to write)."""
        limit = self.config.offset_metadata_max_bytes
        result: dict[TopicPartition, int] = {}
        valid: dict[TopicPartition, OffsetAndMetadata] = {}
        for tp, om in offsets.items():
            if om.metadata is not None and len(om.metadata.encode()) > limit:
                result[tp] = Errors.OFFSET_METADATA_TOO_LARGE
            else:
                valid[tp] = om
        return result, valid

    def _store_offsets(
        self, ps: OffsetsPartition, group: Group, offsets: dict[TopicPartition, OffsetAndMetadata],
        respond: CommitCallback,
    ) -> None:
        result, valid = self._split_oversized_metadata(offsets)
        if not valid:
            respond(result)
            return
        records = [(offset_commit_key(group.group_id, t, p), offset_commit_value(om)) for (t, p), om in valid.items()]
        err, first, done = self._runtime.write(ps.index, records)
        if err:
            respond({**result, **{tp: commit_error(err) for tp in valid}})
            return
        group.pending_offset_commits.update(valid.keys())

        def replicated(f: asyncio.Future) -> None:
            code = f.result()
            for i, (tp, om) in enumerate(valid.items()):
                group.pending_offset_commits[tp] -= 1
                if group.pending_offset_commits[tp] <= 0:
                    del group.pending_offset_commits[tp]
                if code == 0 and not group.is_dead:
                    group.apply_offset(tp, om, first + i)
                result[tp] = commit_error(code)
            respond(result)

        done.add_done_callback(replicated)

    # ------------------------------------------------------------------ TxnOffsetCommit
    async def txn_commit_offsets(
        self, group_id: str, producer_id: int, producer_epoch: int, member_id: str, instance_id: str | None,
        generation_id: int, offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> dict[TopicPartition, int]:
        """TxnOffsetCommit (Kafka's handleTxnCommitOffsets): the offsets are written as a
        transactional batch of the producer and stay pending until its transaction ends
        (on_transaction_completed): applied on commit, dropped on abort."""
        err, ps = self._runtime.status(group_id, OFFSET_COMMIT)
        if err:
            return {tp: err for tp in offsets}
        assert ps is not None
        group = self._group_or_new(ps, group_id)
        err = group.validate_txn_offset_commit(member_id, instance_id, generation_id)
        if err:
            return {tp: err for tp in offsets}
        result, valid = self._split_oversized_metadata(offsets)
        if not valid:
            return result
        records = [(offset_commit_key(group_id, t, p), offset_commit_value(om)) for (t, p), om in valid.items()]
        err, first, done = self._runtime.write(ps.index, records, (producer_id, producer_epoch))
        if err:
            return {**result, **{tp: commit_error(err) for tp in valid}}
        for i, (tp, om) in enumerate(valid.items()):
            group.add_pending_txn_offset(producer_id, tp, om, first + i)
        code = await done
        if code:
            per = group.pending_txn_offsets.get(producer_id, {})
            for i, tp in enumerate(valid):
                c = per.get(tp)
                if c is not None and c.record_offset == first + i:
                    del per[tp]
            if not per:
                group.pending_txn_offsets.pop(producer_id, None)
        return {**result, **{tp: commit_error(code) for tp in valid}}

    def on_transaction_completed(self, partition_index: int, producer_id: int, commit: bool) -> None:
        """A transaction marker of `producer_id` was written (and replicated) on our partition
        `partition_index` of __consumer_offsets: its pending offsets take effect or go."""
        ps = self._runtime.partition(partition_index)
        if ps is None:
            return  # not ours: whoever loads the partition reads the marker from the log
        if ps.loading:
            # the scan may have ended before the marker: apply it after loading, to the offsets
            # written before it (a producer's next transaction only starts after this one ended)
            ps.completed_while_loading.append((producer_id, commit, self._runtime.log_end_offset(partition_index)))
            return
        n = 0
        for group in ps.groups.values():
            if producer_id in group.pending_txn_offsets:
                n += group.complete_txn_offsets(producer_id, commit)
        if n:
            log.debug("txn_offsets_completed", partition=partition_index, producer_id=producer_id, commit=commit,
                      offsets=n)

    # ------------------------------------------------------------------ OffsetFetch
    def unstable_partitions(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with a transactional offset commit whose transaction has not
        ended: OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them."""
        err, ps = self._runtime.status(group_id, OFFSET_FETCH)
        group = ps.groups.get(group_id) if ps is not None else None
        if err or group is None:
            return set()
        return {tp for per in group.pending_txn_offsets.values() for tp in per}

    def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None, member_id: str | None = None,
        member_epoch: int = -1,
    ) -> tuple[int, list[tuple[TopicPartition, OffsetAndMetadata | None]]]:
        """Committed offsets of the requested partitions (None: every committed partition); a
        partition without a commit has None. A KIP-848 member's fetch carries its id and epoch,
        which its group checks (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID)."""
        err, ps = self._runtime.status(group_id, OFFSET_FETCH)
        if err:
            return err, []
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None or group.is_dead:
            return 0, [] if partitions is None else [(tp, None) for tp in partitions]
        err = group.validate_offset_fetch(member_id, member_epoch)
        if err:
            return err, []
        if partitions is None:
            return 0, [(tp, c.value) for tp, c in sorted(group.offsets.items())]
        out = []
        for tp in partitions:
            c = group.offsets.get(tp)
            out.append((tp, None if c is None else c.value))
        return 0, out

    # ------------------------------------------------------------------ deletion and retention
    def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> tuple[int, dict[TopicPartition, int]]:
        err, ps = self._runtime.status(group_id, OFFSET_DELETE)
        if err:
            return err, {}
        assert ps is not None
        group = ps.groups.get(group_id)
        if group is None or group.is_dead:
            return Errors.GROUP_ID_NOT_FOUND, {}
        err, verdicts = group.validate_offset_delete(partitions)
        if err:
            return err, {}
        errors = {tp: code for tp, code in verdicts.items() if code}
        eligible = [tp for tp, code in verdicts.items() if not code]
        if eligible:
            removed = group.remove_offsets(eligible)
            self.remove(ps, [group], {group.group_id: removed})
            errors.update({tp: 0 for tp in eligible})
        return 0, errors

    def remove(self, ps: OffsetsPartition, groups: list[Group], removed: dict[str, list[TopicPartition]]) -> None:
        """Tombstones for the removed offsets; a group left with nothing dies, and its own records
        get tombstones too (Kafka's cleanupGroupMetadata)."""
        keys = []
        for group in groups:
            keys += [offset_commit_key(group.group_id, t, p) for t, p in removed.get(group.group_id, [])]
            if group.is_removable:
                group.mark_dead()
            if group.is_dead:
                keys += group.tombstone_keys()
                if ps.groups.get(group.group_id) is group:
                    del ps.groups[group.group_id]
                group.cancel_timers()
        self._append_tombstones(ps.index, keys)

    def _append_tombstones(self, pid: int, keys: list[bytes]) -> None:
        """Deletions (DeleteGroups, OffsetDelete, expiry): appended locally without waiting for
        replication, as Kafka does; the cache forgets the entries at once either way."""
        if keys:
            err, _, _ = self._runtime.write(pid, [(k, None) for k in keys])
            if err:
                log.warning("offsets_tombstones_not_written", partition=pid, error_code=err, count=len(keys))

    def expire_offsets(self, now_ms: int | None = None) -> int:
        """Drop offsets past offsets.retention.minutes (and groups left with nothing). Returns the
        number of offsets removed."""
        now = now_ms if now_ms is not None else wall_clock_ms()
        total = 0
        for ps in self._runtime.loaded_partitions():
            touched, removed = [], {}
            for group in list(ps.groups.values()):
                expired = group.expired_offsets(now, self.config.offsets_retention_ms)
                if expired:
                    removed[group.group_id] = group.remove_offsets(expired)
                    total += len(expired)
                if expired or group.is_removable:
                    touched.append(group)
            if touched:
                self.remove(ps, touched, removed)
        if total:
            log.info("offsets_expired", count=total)
        return total

    def forget_deleted_partitions(self, partitions: set[TopicPartition]) -> None:
        """KIP-253 deleted these partitions: every group we hold forgets their offsets (and, for a
        classic group, the positions its members exchanged)."""
        for ps in self._runtime.loaded_partitions():
            removed = {g.group_id: g.forget_partitions(partitions) for g in ps.groups.values()}
            touched = [g for g in ps.groups.values() if removed[g.group_id]]
            if touched:
                self.remove(ps, touched, removed)
                log.info("offsets_of_deleted_partitions_removed", groups=[g.group_id for g in touched])


def commit_error(code: int) -> int:
    """Kafka's mapping of append errors for offset commits."""
    if code in (Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.NOT_ENOUGH_REPLICAS,
                Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return Errors.COORDINATOR_NOT_AVAILABLE
    if code in (Errors.NOT_LEADER_OR_FOLLOWER, Errors.KAFKA_STORAGE_ERROR):
        return Errors.NOT_COORDINATOR
    if code in (Errors.MESSAGE_TOO_LARGE, Errors.RECORD_LIST_TOO_LARGE, Errors.INVALID_FETCH_SIZE):
        return Errors.INVALID_COMMIT_OFFSET_SIZE
    return code
