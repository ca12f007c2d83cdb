"""Dispatch: frame -> decode_request -> handler -> encode_response, on node.server.FramedServer.

An ApiVersions version we do not know is answered with UNSUPPORTED_VERSION and a v0 body listing
what we serve (clients then retry with a common version). Any other API key or version we do not
serve closes that connection, logged once by the server; other connections are not affected.
"""

from __future__ import annotations

from typing import Any

import structlog

from controller.apis.api_versions import unsupported_version_response
from controller.apis.catalog import handlers
from controller.apis.registry import Apis
from controller.controller import Controller, NotControllerError
from controller.not_controller import not_controller_body
from metadata.acls import CLUSTER, CLUSTER_ACTION, CLUSTER_NAME
from node.authz import ALWAYS, deny_items, log_denied
from node.metrics import RequestMetrics
from node.security import ListenerSecurity
from node.server import Connection, ConnectionLimits, FramedServer
from protocol.errors import Errors, ProtocolError
from protocol.generated import REQUESTS
from protocol.headers import API_VERSIONS_KEY, UnsupportedRequest, decode_request, encode_response

log = structlog.get_logger(__name__)
CONTROLLER_PIPELINE = 100
# Served by every voter, active or not: the quorum's own traffic and what finds the leader.
QUORUM_APIS = frozenset({1, 17, 18, 36, 52, 53, 54, 55, 59})
FETCH_KEY, REGISTRATION_KEY, HEARTBEAT_KEY = 1, 62, 63


class ControllerServer:
    def __init__(self, apis: Apis, max_request_bytes: int) -> None:
        self.apis = apis
        self.table = handlers()
        apis.served = {k: (lo, hi) for k, (lo, hi, _) in self.table.items()}
        self.max_request_bytes = max_request_bytes
        self.listeners: list[FramedServer] = []
        self.request_metrics = RequestMetrics()

    async def handle(self, frame: bytes, conn: Connection) -> list | None:
        try:
            req = decode_request(frame)
        except UnsupportedRequest as e:
            if e.api_key == API_VERSIONS_KEY:
                return encode_response(
                    API_VERSIONS_KEY, 0, e.correlation_id, unsupported_version_response(self.apis.served)
                )
            raise
        key, version = req.api_key, req.api_version
        authz = self.apis.controller.config.authorizer
        if authz is not None and key not in ALWAYS and not authz.authorize(
                self.apis.controller.image.acls, conn.principal, conn.ip, CLUSTER_ACTION, CLUSTER, CLUSTER_NAME):
            # the controller's peers are brokers (and tools acting for an operator): all cluster actions
            log_denied(conn.principal, conn.peer, key)
            body = deny_items(key, version, req.body, Errors.CLUSTER_AUTHORIZATION_FAILED) if key in REQUESTS else None
            if body is None:
                conn.abort("authorization_failed", ProtocolError(f"{conn.principal} may not send API {key}"))
                return None
            return encode_response(key, version, req.correlation_id, body)
        entry = self.table.get(key)
        if entry is None or not entry[0] <= version <= entry[1]:
            name = REQUESTS[key].NAME
            reason = (
                f"{name} is not served by the controller"
                if entry is None
                else (f"{name} v{version} is not served (the controller serves v{entry[0]}-{entry[1]})")
            )
            raise UnsupportedRequest(reason, key, version, req.correlation_id)
        ctl = self.apis.controller
        if key not in QUORUM_APIS and not ctl.active:
            return self._not_controller(key, version, req)
        if key == FETCH_KEY:  # a broker's metadata fetch, long-polling: its link lives while it waits
            state = req.body.replica_state if version >= 15 else None
            self._bind(ctl, state.replica_id if state is not None else req.body.replica_id, conn)
        try:
            body = await entry[2](self.apis, req)
        except NotControllerError:
            return self._not_controller(key, version, req)
        if key in (REGISTRATION_KEY, HEARTBEAT_KEY) and not body.error_code:
            self._bind(ctl, req.body.broker_id, conn)
        return encode_response(key, version, req.correlation_id, body)

    @staticmethod
    def _bind(ctl: Controller, broker_id: int, conn: Connection) -> None:
        """The connections a registered broker talks to the active controller on: when all have
        closed, its process is gone (controller/fencing.py)."""
        if ctl.active and broker_id in ctl.image.brokers:
            ctl.sessions.bind(broker_id, conn)

    def _not_controller(self, key: int, version: int, req: Any) -> list | None:
        """A standby (or a leader that just lost its epoch) answers NOT_CONTROLLER: the sender
        finds the active controller and sends again (nothing was applied here)."""
        body = not_controller_body(key, version, req.body)
        if body is None:
            return None
        return encode_response(key, version, req.correlation_id, body)

    async def start(self, host: str, port: int, security: ListenerSecurity | None = None) -> int:
        """Listen on one more address; returns the bound port."""
        # Brokers multiplex heartbeats, AlterPartition and forwarded admin requests on one
        # connection: a heartbeat must not wait behind a slow forwarded request, so the controller
        # keeps a deep pipeline per connection (its peers are few and trusted).
        framed = FramedServer(self.request_metrics.wrap(self.handle), max_frame=self.max_request_bytes,
                              limits=ConnectionLimits(max_in_flight=CONTROLLER_PIPELINE, idle_ms=None),
                              security=security)
        port = await framed.start(host, port)
        self.listeners.append(framed)
        return port

    async def stop(self) -> None:
        for framed in self.listeners:
            await framed.stop()
