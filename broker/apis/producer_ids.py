"""InitProducerId for idempotent and transactional producers.

Without a transactional id: a request without a producer id gets a fresh id from the broker's
block (broker/producer_ids.py) with epoch 0. A request carrying its current id and epoch (v3+,
KIP-360: an idempotent producer resetting its sequences after an error) keeps its id with the
epoch bumped, or gets a fresh id once the epoch would pass MAX_EPOCH.

With a transactional id the transaction coordinator answers (broker/coordinator/transaction): a
new id, or the id's epoch bumped (fencing older producers), after aborting a transaction left
open. PRODUCER_FENCED goes to versions before 4 as INVALID_PRODUCER_EPOCH, as Kafka.
"""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from broker.apis.transactions import fenced_for_version, transaction_coordinator
from broker.producer_ids import ProducerIdsUnavailable
from protocol.errors import Errors
from protocol.generated.init_producer_id import InitProducerIdResponse

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
MAX_EPOCH = 32766  # Kafka's exhausted epoch (Short.MAX_VALUE - 1): one more bump rotates the id

R = InitProducerIdResponse


def _error(code: int) -> InitProducerIdResponse:
    return R(error_code=code, producer_id=NO_PRODUCER_ID, producer_epoch=NO_PRODUCER_EPOCH)


@api(22, 0, 5)
async def init_producer_id(ctx: RequestContext, req) -> InitProducerIdResponse:
    v = ctx.api_version
    pid, epoch = (req.producer_id, req.producer_epoch) if v >= 3 else (NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    has_id = pid != NO_PRODUCER_ID
    if has_id != (epoch != NO_PRODUCER_EPOCH) or pid < NO_PRODUCER_ID or epoch < NO_PRODUCER_EPOCH:
        return _error(Errors.INVALID_REQUEST)  # as Kafka: an id without an epoch or the other way round
    if req.transactional_id is not None:
        c = transaction_coordinator(ctx)
        if c is None:
            return _error(Errors.COORDINATOR_NOT_AVAILABLE)
        err, new_pid, new_epoch = await c.init_producer_id(
            req.transactional_id, req.transaction_timeout_ms, (pid, epoch) if has_id else None)
        if err:
            return _error(fenced_for_version(err, v, 4))
        return R(producer_id=new_pid, producer_epoch=new_epoch)
    if has_id and epoch < MAX_EPOCH:
        return R(producer_id=pid, producer_epoch=epoch + 1)
    try:
        new_pid = await ctx.services.producer_ids.generate()
    except ProducerIdsUnavailable as e:
        return _error(e.error_code)
    return R(producer_id=new_pid, producer_epoch=0)
