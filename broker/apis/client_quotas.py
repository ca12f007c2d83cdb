"""DescribeClientQuotas, answered from this broker's image; AlterClientQuotas, forwarded to the
controller (it becomes ClientQuotaRecords in the metadata log)."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from broker.quotas.describe import FilterError, matching
from protocol.generated.describe_client_quotas import DescribeClientQuotasResponse

R = DescribeClientQuotasResponse


@api(48, 0, 1)
async def describe_client_quotas(ctx: RequestContext, req) -> DescribeClientQuotasResponse:
    try:
        found = matching(ctx.services.metadata.image.client_quotas, req.components, req.strict)
    except FilterError as e:
        return R(error_code=e.code, error_message=str(e), entries=None)
    return R(error_code=0, error_message=None, entries=[
        R.EntryData(entity=[R.EntityData(t, n) for t, n in entity],
                    values=[R.ValueData(k, v) for k, v in sorted(values.items())])
        for entity, values in found
    ])


@api(49, 0, 1)
async def alter_client_quotas(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)
