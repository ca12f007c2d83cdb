"""ApiVersions: what this broker serves, exactly the registered handlers."""

from __future__ import annotations

from broker.apis.registry import RequestContext, advertised_versions, api
from metadata.features import add_features
from protocol.generated.api_versions import ApiVersionsResponse


@api(18, 0, 4)
async def api_versions(ctx: RequestContext, req) -> ApiVersionsResponse:
    if ctx.connection is not None and ctx.api_version >= 3:
        ctx.connection.client_software = (req.client_software_name or "", req.client_software_version or "")
    resp = ApiVersionsResponse(error_code=0, api_keys=advertised_versions(ctx.services.config))
    if ctx.api_version >= 3:
        image = ctx.services.metadata.image
        add_features(resp, image.features, image.offset, ctx.api_version)
    return resp

