"""KIP-714 client telemetry: GetTelemetrySubscriptions (71) and PushTelemetry (72). Thin: the
client's identity is read off the request and its connection, `broker.telemetry` decides."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from broker.telemetry.clients import ACCEPTED_COMPRESSION, TELEMETRY_MAX_BYTES
from protocol.generated.get_telemetry_subscriptions import GetTelemetrySubscriptionsResponse
from protocol.generated.push_telemetry import PushTelemetryResponse


def _identity(ctx: RequestContext) -> dict[str, str]:
    """The client attributes a subscription's `match` may name (KIP-714)."""
    conn = ctx.connection
    name, version = conn.client_software if conn is not None else ("", "")
    host, _, port = (conn.peer if conn is not None else "").rpartition(":")
    return {"client_id": ctx.client_id or "", "client_software_name": name, "client_software_version": version,
            "client_source_address": host, "client_source_port": port}


@api(71, 0, 0)
async def get_telemetry_subscriptions(ctx: RequestContext, req) -> GetTelemetrySubscriptionsResponse:
    given = req.client_instance_id
    instance_id, plan = ctx.services.telemetry.get_subscriptions(given, _identity(ctx))
    return GetTelemetrySubscriptionsResponse(
        throttle_time_ms=0, error_code=0, client_instance_id=instance_id if given.int == 0 else given.__class__(int=0),
        subscription_id=plan.subscription_id, accepted_compression_types=[int(c) for c in ACCEPTED_COMPRESSION],
        push_interval_ms=plan.interval_ms, telemetry_max_bytes=TELEMETRY_MAX_BYTES,
        # cumulative counters: a pushed sum is the value the Prometheus endpoint exports
        delta_temporality=False, requested_metrics=list(plan.requested))


@api(72, 0, 0)
async def push_telemetry(ctx: RequestContext, req) -> PushTelemetryResponse:
    err, _ = ctx.services.telemetry.push(req.client_instance_id, req.subscription_id, req.terminating,
                                         req.compression_type, bytes(req.metrics or b""), _identity(ctx))
    return PushTelemetryResponse(throttle_time_ms=0, error_code=err)
