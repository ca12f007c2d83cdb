"""AllocateProducerIds."""

from __future__ import annotations

from controller.apis.registry import Apis
from controller.errors import ApiError
from protocol.generated.allocate_producer_ids import AllocateProducerIdsRequest, AllocateProducerIdsResponse
from protocol.headers import Request


async def allocate_producer_ids(apis: Apis, req: Request) -> AllocateProducerIdsResponse:
    try:
        block = await apis.producer_ids.allocate(req.body.broker_id, req.body.broker_epoch)
    except ApiError as e:
        return AllocateProducerIdsResponse(
            throttle_time_ms=0, error_code=e.code, producer_id_start=-1, producer_id_len=0
        )
    return AllocateProducerIdsResponse(
        throttle_time_ms=0, error_code=0, producer_id_start=block.start, producer_id_len=block.length
    )


HANDLERS = {
    67: (AllocateProducerIdsRequest.MIN_VERSION, AllocateProducerIdsRequest.MAX_VERSION, allocate_producer_ids),
}
