"""What a diskless coordinator keeps for each `__diskless_metadata` partition this broker leads."""

from __future__ import annotations

import asyncio

from broker.coordinator.partitioned import CoordinatorPartition
from broker.diskless.coordinator.view import CoordinatorView


class DisklessCoordinatorPartition(CoordinatorPartition):
    def __init__(self, index: int, epoch: int) -> None:
        super().__init__(index, epoch)
        self.view: CoordinatorView | None = None
        self.last_append: asyncio.Future | None = None  # resolves when the newest append replicated
        self.retention: asyncio.Task | None = None  # the running retention pass
        self.files_handed_over = 0  # by this broker since it took the lead
        self.files_deleted = 0
        self.files_changed = 0  # bumped by each write that may leave a file without live batches
        self.snapshot_task: asyncio.Task | None = None
        self.snapshot_offset = 0  # of the newest snapshot this leader knows of
        self.snapshot_ms = -1  # when this leader took its newest snapshot
