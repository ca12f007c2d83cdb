"""AlterClientQuotas (brokers forward it here). DescribeClientQuotas is the brokers' job: they
answer it from their own MetadataImage."""

from __future__ import annotations

from controller.apis.registry import Apis
from protocol.generated.alter_client_quotas import AlterClientQuotasRequest, AlterClientQuotasResponse
from protocol.headers import Request

R = AlterClientQuotasResponse


async def alter_client_quotas(apis: Apis, req: Request) -> AlterClientQuotasResponse:
    results = await apis.client_quotas.alter(req.body.entries, req.body.validate_only)
    return R(throttle_time_ms=0, entries=[
        R.EntryData(error_code=r.error.code if r.error else 0, error_message=r.error.message if r.error else None,
                    entity=[R.EntityData(t, n) for t, n in r.entity])
        for r in results
    ])


HANDLERS = {49: (AlterClientQuotasRequest.MIN_VERSION, AlterClientQuotasRequest.MAX_VERSION, alter_client_quotas)}
