"""IncrementalAlterConfigs and AlterConfigs (topics and brokers). DescribeConfigs is the
brokers' job: they answer it from their own MetadataImage."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from controller.apis.registry import Apis
from controller.configs import ResourceResult
from protocol.generated.alter_configs import AlterConfigsRequest, AlterConfigsResponse
from protocol.generated.incremental_alter_configs import (
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from protocol.headers import Request

R = TypeVar("R")


def _response(response: Callable[..., R], entry: Callable[..., object], results: list[ResourceResult]) -> R:
    """Both APIs answer alike: one `entry` (their AlterConfigsResourceResponse) a resource, with its
    error if any."""
    return response(throttle_time_ms=0, responses=[
        entry(error_code=r.error.code if r.error else 0, error_message=r.error.message if r.error else None,
              resource_type=r.resource_type, resource_name=r.resource_name)
        for r in results
    ])


async def incremental_alter_configs(apis: Apis, req: Request) -> IncrementalAlterConfigsResponse:
    results = await apis.configs.incremental_alter(req.body.resources, req.body.validate_only)
    return _response(
        IncrementalAlterConfigsResponse, IncrementalAlterConfigsResponse.AlterConfigsResourceResponse, results
    )


async def alter_configs(apis: Apis, req: Request) -> AlterConfigsResponse:
    results = await apis.configs.alter(req.body.resources, req.body.validate_only)
    return _response(AlterConfigsResponse, AlterConfigsResponse.AlterConfigsResourceResponse, results)


HANDLERS = {
    44: (
        IncrementalAlterConfigsRequest.MIN_VERSION,
        IncrementalAlterConfigsRequest.MAX_VERSION,
        incremental_alter_configs,
    ),
    33: (AlterConfigsRequest.MIN_VERSION, AlterConfigsRequest.MAX_VERSION, alter_configs),
}
