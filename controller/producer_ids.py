"""Producer id blocks (AllocateProducerIds, KIP-730).

Brokers hand out producer ids (InitProducerId) from blocks the controller gives them. Each block
is written as a ProducerIdsRecord whose next_producer_id is the first id after the block, so the
image (and therefore a restarted controller, from its log or snapshot) never hands out an id
twice. The block size is Kafka's (1000).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from metadata.image import MetadataImage
from protocol.generated.metadata_records.producer_ids_record import ProducerIdsRecord

log = structlog.get_logger(__name__)

BLOCK_SIZE = 1000
MAX_PRODUCER_ID = 2**63 - 1


@dataclass(frozen=True)
class ProducerIdBlock:
    start: int
    length: int


class ProducerIdControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    async def allocate(self, broker_id: int, broker_epoch: int) -> ProducerIdBlock:
        """The next block for `broker_id`; raises ApiError (STALE_BROKER_EPOCH, or
        UNKNOWN_SERVER_ERROR once the id space is used up)."""

        def build(image: MetadataImage, batch: Batch) -> ProducerIdBlock:
            b = image.brokers.get(broker_id)
            if b is None:
                raise ApiError(Errors.STALE_BROKER_EPOCH, f"Broker {broker_id} is not registered.")
            if b.epoch != broker_epoch:
                raise ApiError(
                    Errors.STALE_BROKER_EPOCH, f"Broker {broker_id} has epoch {b.epoch}, not {broker_epoch}."
                )
            start = image.next_producer_id
            if start > MAX_PRODUCER_ID - BLOCK_SIZE:
                raise ApiError(Errors.UNKNOWN_SERVER_ERROR, "Every producer id has been handed out.")
            batch.add(
                ProducerIdsRecord(broker_id=broker_id, broker_epoch=broker_epoch, next_producer_id=start + BLOCK_SIZE)
            )
            return ProducerIdBlock(start, BLOCK_SIZE)

        block = await self.ctl.write(build)
        log.info("producer_ids_allocated", broker=broker_id, start=block.start, length=block.length)
        return block
