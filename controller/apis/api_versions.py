"""ApiVersions: the keys and version ranges this controller serves, nothing more."""

from __future__ import annotations

from controller.apis.registry import Apis
from metadata.features import add_features
from protocol.generated.api_versions import ApiVersionsRequest, ApiVersionsResponse
from protocol.headers import Request


def version_list(served: dict[int, tuple[int, int]]) -> list[ApiVersionsResponse.ApiVersion]:
    return [ApiVersionsResponse.ApiVersion(k, lo, hi) for k, (lo, hi) in sorted(served.items())]


async def api_versions(apis: Apis, req: Request) -> ApiVersionsResponse:
    resp = ApiVersionsResponse(error_code=0, api_keys=version_list(apis.served), throttle_time_ms=0)
    if req.api_version >= 3:
        image = apis.controller.image
        add_features(resp, image.features, image.offset, req.api_version)
    return resp


def unsupported_version_response(served: dict[int, tuple[int, int]]) -> ApiVersionsResponse:
    """For an ApiVersions version we do not know: error 35 and a v0 body listing ours, so the
    client retries with a version we share (Kafka's behaviour)."""
    return ApiVersionsResponse(error_code=35, api_keys=version_list(served))


HANDLERS = {18: (ApiVersionsRequest.MIN_VERSION, ApiVersionsRequest.MAX_VERSION, api_versions)}
