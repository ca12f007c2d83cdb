"""The controller's current MetadataImage, advanced one committed batch at a time.

Only committed (fsynced) batches reach it, so every operation validates against durable state
and a failed write leaves nothing half-applied in memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from metadata.image import MetadataDelta, MetadataImage
from metadata.records import decode_record
from protocol.records import decode_batches


class ImageState:
    def __init__(self, image: MetadataImage | None = None) -> None:
        self.image = image if image is not None else MetadataImage.EMPTY

    def apply(self, records: Iterable[Any], base_offset: int) -> MetadataDelta:
        """Replay records that hold offsets base_offset, base_offset + 1, ... and publish the new
        image. Returns the delta (what changed), for whoever wants to react."""
        delta = MetadataDelta(self.image)
        offset = base_offset - 1
        for offset, r in enumerate(records, base_offset):
            delta.replay(r, offset)
        self.image = delta.apply()
        return delta

    def apply_batch_bytes(self, data: bytes) -> int:
        """Replay one stored batch (start-up). Returns how many records it held."""
        n = 0
        for batch in decode_batches(data):
            if batch.header.is_control:
                # Raft's LEADER_CHANGE (KIP-595) holds no metadata: the image only moves past it
                self.skip_to(batch.header.last_offset)
                continue
            self.apply([decode_record(r.value)[0] for r in batch.records], batch.base_offset)
            n += len(batch.records)
        return n

    def skip_to(self, last_offset: int) -> None:
        """The image stands at `last_offset` without a record applied (a control batch)."""
        delta = MetadataDelta(self.image)
        delta.offset = last_offset
        self.image = delta.apply()

    def load_snapshot(self, records: list[Any], end_offset: int) -> None:
        """Start from a snapshot: an image of exactly its records, ending before end_offset."""
        delta = MetadataDelta(MetadataImage.EMPTY)
        for r in records:
            delta.replay(r)
        delta.offset = end_offset - 1
        self.image = delta.apply()
