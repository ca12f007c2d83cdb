"""DescribeCluster, BrokerRegistration, BrokerHeartbeat."""

from __future__ import annotations

import structlog

from controller.apis.registry import Apis
from controller.cluster import Heartbeat, Registration
from controller.errors import ApiError, Errors
from protocol.generated.broker_heartbeat import BrokerHeartbeatRequest, BrokerHeartbeatResponse
from protocol.generated.broker_registration import BrokerRegistrationRequest, BrokerRegistrationResponse
from protocol.generated.describe_cluster import DescribeClusterRequest, DescribeClusterResponse
from protocol.headers import Request

log = structlog.get_logger(__name__)

ENDPOINT_BROKERS = 1
ENDPOINT_CONTROLLERS = 2


async def describe_cluster(apis: Apis, req: Request) -> DescribeClusterResponse:
    ctl = apis.controller
    body = req.body
    resp = DescribeClusterResponse(
        throttle_time_ms=0,
        error_code=0,
        error_message=None,
        endpoint_type=body.endpoint_type,
        cluster_id=ctl.cluster_id,
        controller_id=ctl.node_id,
        brokers=[],
    )
    if body.endpoint_type == ENDPOINT_CONTROLLERS:
        e = ctl.config.listeners[0]
        resp.brokers = [DescribeClusterResponse.DescribeClusterBroker(ctl.node_id, e.host, e.port, None)]
    elif body.endpoint_type == ENDPOINT_BROKERS:
        include_fenced = req.api_version >= 2 and body.include_fenced_brokers
        for b in sorted(ctl.image.brokers.values(), key=lambda b: b.id):
            if b.fenced and not include_fenced:
                continue
            e = b.endpoint()  # the first listener the broker registered
            if e is not None:
                resp.brokers.append(
                    DescribeClusterResponse.DescribeClusterBroker(b.id, e.host, e.port, b.rack, b.fenced)
                )
    else:
        resp.error_code = Errors.UNSUPPORTED_ENDPOINT_TYPE
        resp.error_message = f"Endpoint type {body.endpoint_type} is unknown (1 = brokers, 2 = controllers)."
    return resp


async def broker_registration(apis: Apis, req: Request) -> BrokerRegistrationResponse:
    b = req.body
    reg = Registration(
        broker_id=b.broker_id,
        cluster_id=b.cluster_id,
        incarnation_id=b.incarnation_id,
        listeners=[(x.name, x.host, x.port, x.security_protocol) for x in b.listeners],
        features=[(f.name, f.min_supported_version, f.max_supported_version) for f in b.features],
        rack=b.rack,
        log_dirs=list(b.log_dirs),
        previous_broker_epoch=b.previous_broker_epoch,
    )
    try:
        epoch = await apis.cluster.register(reg)
    except ApiError as e:
        log.warning("broker_registration_refused", broker=b.broker_id, error=str(e))
        return BrokerRegistrationResponse(throttle_time_ms=0, error_code=e.code, broker_epoch=-1)
    return BrokerRegistrationResponse(throttle_time_ms=0, error_code=0, broker_epoch=epoch)


async def broker_heartbeat(apis: Apis, req: Request) -> BrokerHeartbeatResponse:
    b = req.body
    hb = Heartbeat(b.broker_id, b.broker_epoch, b.current_metadata_offset, b.want_fence, b.want_shut_down,
                   tuple(b.offline_log_dirs or ()))
    try:
        r = await apis.cluster.heartbeat(hb)
    except ApiError as e:
        return BrokerHeartbeatResponse(
            throttle_time_ms=0, error_code=e.code, is_caught_up=False, is_fenced=True, should_shut_down=False
        )
    return BrokerHeartbeatResponse(
        throttle_time_ms=0,
        error_code=0,
        is_caught_up=r.is_caught_up,
        is_fenced=r.is_fenced,
        should_shut_down=r.should_shut_down,
    )


HANDLERS = {
    60: (DescribeClusterRequest.MIN_VERSION, DescribeClusterRequest.MAX_VERSION, describe_cluster),
    62: (BrokerRegistrationRequest.MIN_VERSION, BrokerRegistrationRequest.MAX_VERSION, broker_registration),
    63: (BrokerHeartbeatRequest.MIN_VERSION, BrokerHeartbeatRequest.MAX_VERSION, broker_heartbeat),
}
