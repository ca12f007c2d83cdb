"""The WAL files' lifecycle on a diskless coordinator's side: the state tells which files a
coordinator owns and has no live batch in (state.py's file_tasks); broker/diskless/file_cleaner.py
hands them on (DisklessHandOverFile, answered by hand_over() here on the next owner) or deletes
them, and reports each through done(). Their status is this replica's own (not in the log, as
KIP-1164 says); a file deleted from object storage is then pruned from every replica's state (a
DisklessFilesPrunedRecord in the log), so the state does not keep a row for every file ever
written."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from broker.coordinator import wall_clock_ms
from broker.diskless.coordinator.materializer import Materializer
from broker.diskless.coordinator.partition import DisklessCoordinatorPartition as Partition
from broker.diskless.coordinator.state import DELETED, HANDED_OVER, DisklessState, FileTask
from protocol.generated.metadata_records.diskless_file_handed_over_record import DisklessFileHandedOverRecord
from protocol.generated.metadata_records.diskless_files_pruned_record import DisklessFilesPrunedRecord
from protocol.generated.metadata_records.diskless_partition_deleted_record import DisklessPartitionDeletedRecord
from protocol.generated.metadata_records.diskless_records_deleted_record import DisklessRecordsDeletedRecord
from protocol.generated.metadata_records.diskless_topic_deleted_record import DisklessTopicDeletedRecord

log = structlog.get_logger(__name__)

# records after which a file may have no live batch left here, or a new owner
_FREES_FILES = (DisklessRecordsDeletedRecord, DisklessTopicDeletedRecord, DisklessPartitionDeletedRecord,
                DisklessFileHandedOverRecord)


class FileLifecycle:
    def __init__(self, partitions: Mapping[int, Partition], status: Callable[[int], tuple[int, Partition | None]],
                 wait_previous: Callable[[Partition], Awaitable[int]],
                 write: Callable[[Partition, list[Any]], Awaitable[int]], states: Materializer) -> None:
        """`partitions`: the coordinator's led partitions by index (read as they change);
        `status(index)`: (0, the partition) when it leads it loaded, else (the error, None);
        `wait_previous(ps)` waits for the pending appends; `write(ps, records)` appends."""
        self.partitions = partitions
        self.status = status
        self.wait_previous = wait_previous
        self.write = write
        self.states = states

    def note_write(self, ps: Partition, records: list[Any]) -> None:
        """After a write: if it may leave a file without live batches, the file worker looks again
        (the apply is queued before its read)."""
        if any(isinstance(r, _FREES_FILES) for r in records):
            ps.files_changed += 1

    async def hand_over(self, index: int, object_key: str, size: int, owners: list[int], from_coordinator: int) -> int:
        """DisklessHandOverFile: coordinator `index` owns the file from now on (its log says so:
        a new leader knows it). Idempotent: a file it owns already is answered at once."""
        err, ps = self.status(index)
        if err:
            return err
        assert ps is not None
        code = await self.wait_previous(ps)
        if code:
            return code
        if await self.states.run(index, DisklessState.owns_file, object_key, index):
            return 0
        err, ps = self.status(index)
        if err:
            return err
        assert ps is not None
        record = DisklessFileHandedOverRecord(object_key=object_key, file_size=size, owner_ids=list(owners),
                                              from_coordinator=from_coordinator)
        code = await self.write(ps, [record])
        log.info("diskless_file_taken_over", coordinator=index, key=object_key, from_coordinator=from_coordinator,
                 error=code)
        return code

    def version(self, index: int) -> tuple[int, int] | None:
        """Changes when coordinator `index`'s files may need work (a new leadership, a deletion, a
        handover), None when this broker does not lead it."""
        ps = self.partitions.get(index)
        return None if ps is None else (ps.epoch, ps.files_changed)

    async def tasks(self, index: int) -> tuple[list[FileTask], list[FileTask]] | None:
        """(owned, waiting) files of coordinator `index` with no live batch left (state.py), or
        None when this broker does not lead it (loaded)."""
        err, _ = self.status(index)
        if err:
            return None
        return await self.states.run(index, DisklessState.file_tasks, index)

    async def done(self, index: int, object_key: str, deleted: bool) -> None:
        """The leader handed the file on (remembered in this replica's state only) or deleted it
        from object storage: then every replica forgets it (DisklessFilesPrunedRecord). A prune
        that does not make it leaves the rows: the next leader deletes the file again (a missing
        key is no error) and prunes it then."""
        ps = self.partitions.get(index)
        if ps is None:
            return
        await self.states.run(index, DisklessState.set_file_status, object_key, DELETED if deleted else HANDED_OVER,
                              wall_clock_ms())
        if deleted:
            err, led = self.status(index)
            if not err and led is ps:
                code = await self.write(ps, [DisklessFilesPrunedRecord(object_keys=[object_key])])
                log.info("diskless_file_pruned", coordinator=index, key=object_key, error=code)
            ps.files_deleted += 1
        else:
            ps.files_handed_over += 1
