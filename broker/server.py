"""The broker's request path: frame -> decoded request -> API handler -> encoded response.

Unknown API keys or versions: an ApiVersions request gets UNSUPPORTED_VERSION with a v0 body
listing what we serve (so a newer client can retry with a version we know); anything else is
a client bug and closes that connection, logged once. Malformed bytes do the same.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import structlog

from broker.apis.catalog import load_all
from broker.apis.registry import HANDLERS, RequestContext, advertised_versions
from broker.authz import Check, authorize
from broker.quotas.step_timer import StepTimer
from node.authz import Denied, log_denied
from node.waits import Eventual
from protocol.errors import ProtocolError
from protocol.file_region import with_regions
from protocol.generated import REQUESTS, RequestHeader
from protocol.generated.api_versions import ApiVersionsResponse
from protocol.headers import (
    Request,
    UnsupportedRequest,
    decode_request,
    encode_response,
    peek_header,
    request_header_version,
)

if TYPE_CHECKING:
    from broker.quotas.manager import ClientQuotas
    from broker.services import BrokerServices
    from node.server import Connection

log = structlog.get_logger(__name__)
API_VERSIONS = 18
UNSUPPORTED_VERSION = 35
PRODUCE, FETCH = 0, 1
# Served ahead of client data traffic (Kafka gives such traffic its own listener and queue,
# KIP-291): group and transaction coordinator requests, whose lateness costs a rebalance or an
# abort (OffsetCommit, FindCoordinator, JoinGroup, Heartbeat, LeaveGroup, SyncGroup,
# InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, WriteTxnMarkers, TxnOffsetCommit),
# a follower's OffsetForLeaderEpoch and chunk assignment changes; follower Fetches are found by
# their replica id.
CONTROL_PLANE_KEYS = frozenset({8, 10, 11, 12, 13, 14, 22, 23, 24, 25, 26, 27, 28, 1077})
_REPLICA_ID = struct.Struct(">i")


def is_control_plane(frame: bytes) -> bool:
    """Whether a request frame is control-plane traffic (see CONTROL_PLANE_KEYS). Never raises:
    a malformed frame is client traffic, and its handler reports it."""
    try:
        api_key, api_version, _ = peek_header(frame)
        if api_key in CONTROL_PLANE_KEYS:
            return True
        if api_key != FETCH or not 4 <= api_version <= REQUESTS[FETCH].MAX_VERSION:
            return False
        if api_version >= 15:  # the replica id moved into a tagged field: decode the whole request
            req = decode_client_request(frame)
            _decoded.keep(frame, req)  # the dispatcher takes it instead of decoding again
            body = req.body
            return body.replica_state is not None and body.replica_state.replica_id >= 0
        mv = memoryview(frame)
        _, pos = RequestHeader.decode_from(mv, 0, request_header_version(FETCH, api_version))
        return _REPLICA_ID.unpack_from(mv, pos)[0] >= 0
    except (ProtocolError, UnsupportedRequest, struct.error):
        return False


class _DecodedFrames:
    """Requests decoded to classify their frame (a Fetch v15+: its replica id is a tagged field
    at the end), kept for the dispatcher so a follower's Fetch is decoded once. Keyed by the
    frame object itself: held here until taken, at most MAX (a frame never dispatched, its
    connection closed, is pushed out by later ones)."""

    MAX = 256

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[bytes, Request]] = {}

    def keep(self, frame: bytes, req: Request) -> None:
        by_id = self._by_id
        if len(by_id) >= self.MAX:
            del by_id[next(iter(by_id))]  # the oldest
        by_id[id(frame)] = (frame, req)

    def take(self, frame: bytes) -> Request | None:
        if not self._by_id:
            return None
        kept = self._by_id.pop(id(frame), None)
        return kept[1] if kept is not None and kept[0] is frame else None


_decoded = _DecodedFrames()


# ApiVersions, WriteTxnMarkers, and Strata's broker-to-broker chunk APIs
BROKER_APIS = frozenset({API_VERSIONS, 27, 1076, 1077})


def decode_client_request(frame: bytes) -> Request:
    """decode_request, except that bytes after the body are ignored, as Kafka's broker ignores
    them: librdkafka 2.16's all-topics Metadata v13 (AdminClient.list_topics()) ends with 3 stray
    bytes, and a broker that refused it would fail every such call."""
    api_key, api_version, _ = peek_header(frame)
    cls = REQUESTS.get(api_key)
    if cls is None or not cls.MIN_VERSION <= api_version <= cls.MAX_VERSION:
        return decode_request(frame)  # raises UnsupportedRequest
    mv = memoryview(frame)
    header, pos = RequestHeader.decode_from(mv, 0, request_header_version(api_key, api_version))
    body, _ = cls.decode_from(mv, pos, api_version)
    return Request(header, body)


def is_from_broker(req: Request) -> bool:
    """Requests between brokers are never throttled (Kafka exempts cluster actions), nor
    ApiVersions (a client must be able to learn what it may send)."""
    if req.api_key in BROKER_APIS:
        return True
    if req.api_key == FETCH:
        body = req.body
        rs = getattr(body, "replica_state", None)
        replica_id = rs.replica_id if req.api_version >= 15 and rs is not None else body.replica_id
        return replica_id >= 0
    return False


def user_of(conn: Connection) -> str:
    """The quota user of a connection: its principal's name (Kafka's user quota entity)."""
    kind, _, name = conn.principal.partition(":")
    return name if kind == "User" and name else conn.principal


class RequestDispatcher:
    def __init__(self, services: BrokerServices) -> None:
        self.services = services
        self.quotas: ClientQuotas = services.quotas
        self.authorizer = services.config.authorizer  # None: no authorizer configured, nothing checked
        load_all()

    async def __call__(self, frame: bytes, conn: Connection) -> list | Eventual | None:
        # Each request runs in its own task (a copy of the context): every line logged while
        # handling it names the peer, so a rejected request is traceable to its connection.
        structlog.contextvars.bind_contextvars(peer=conn.peer)
        try:
            req = _decoded.take(frame) or decode_client_request(frame)
            entry = HANDLERS.get(req.api_key)
            if entry is None or not entry.min_version <= req.api_version <= entry.max_version:
                raise UnsupportedRequest(
                    f"API {req.api_key} v{req.api_version} is not served", req.api_key, req.api_version, req.correlation_id
                )
        except UnsupportedRequest as e:
            if e.api_key == API_VERSIONS:
                log.info("api_versions_version_unsupported", version=e.api_version, answered_with="v0 list")
                body = ApiVersionsResponse(error_code=UNSUPPORTED_VERSION, api_keys=advertised_versions())
                return encode_response(API_VERSIONS, 0, e.correlation_id, body)
            raise ProtocolError(str(e), error_code=UNSUPPORTED_VERSION) from None
        finish = None
        if self.authorizer is not None:
            try:
                finish = self._authorize(req, conn)
            except Denied as d:
                log_denied(conn.principal, conn.peer, req.api_key)
                if d.response is None:
                    conn.abort("authorization_failed", ProtocolError(f"{conn.principal} may not send API {req.api_key}"))
                    return None
                return encode_response(req.api_key, req.api_version, req.correlation_id, d.response)
        ctx = RequestContext(self.services, req.api_key, req.api_version, req.correlation_id, req.header.client_id, conn)
        quotas = self.quotas
        exempt = is_from_broker(req)
        client_id = req.header.client_id or ""
        throttle = 0.0
        if req.api_key == PRODUCE and not exempt:
            # as Kafka, the whole request's size counts; recorded before the handler runs so the
            # requests read behind this one wait (they would otherwise all pass at once)
            throttle = self._throttle_for(conn, quotas.record_produce(client_id, len(frame), user_of(conn)))
        timer = None
        if not exempt and quotas.any_request_quota():
            timer = StepTimer(entry.handler(ctx, req.body))
            resp = await timer
        else:
            resp = await entry.handler(ctx, req.body)
        if isinstance(resp, Eventual):  # answered later, from the call that settles it
            return resp.map(lambda r: self._encode(conn, req, r if finish is None or r is None else finish(r), exempt,
                                                   client_id, timer, throttle))
        if finish is not None and resp is not None:
            resp = finish(resp)
        return self._encode(conn, req, resp, exempt, client_id, timer, throttle)

    def _encode(self, conn: Connection, req: Request, resp, exempt: bool, client_id: str, timer: StepTimer | None,
                throttle: float) -> list | None:
        quotas = self.quotas
        parts = None if resp is None else encode_response(req.api_key, req.api_version, req.correlation_id, resp)
        if not exempt:
            after = 0.0
            if req.api_key == FETCH and parts is not None:
                after = quotas.record_fetch(client_id, sum(len(p) for p in parts), user_of(conn))
            if timer is not None:
                after = max(after, quotas.record_request_time(client_id, timer.seconds, user_of(conn)))
            throttle = max(throttle, self._throttle_for(conn, after))
        if throttle > 0 and resp is not None and hasattr(resp, "throttle_time_ms"):
            resp.throttle_time_ms = max(resp.throttle_time_ms, int(throttle * 1000))
            parts = encode_response(req.api_key, req.api_version, req.correlation_id, resp)
        if req.api_key == FETCH and parts is not None:
            parts = with_regions(parts)  # large reads stay in their files until sent (sendfile)
        return parts

    def _authorize(self, req: Request, conn: Connection):
        assert self.authorizer is not None
        image = self.services.metadata.image
        check = Check(self.authorizer, image.acls, conn.principal, conn.ip)

        def topic_name(t) -> str | None:
            name = getattr(t, "name", None) or getattr(t, "topic", None)
            if not name and getattr(t, "topic_id", None) is not None:
                info = image.topics.get(t.topic_id)
                name = info.name if info is not None else None
            return name

        follower = is_from_broker(req) if req.api_key == FETCH else (
            req.api_key == 23 and req.api_version >= 3 and req.body.replica_id >= 0)
        return authorize(check, req.api_key, req.api_version, req.body, topic_name, follower)

    def _throttle_for(self, conn: Connection, seconds: float) -> float:
        """KIP-219: the answer goes out now, saying how long to wait; the connection is muted for
        that long, so a client that does not wait is held back anyway."""
        if seconds > 0:
            conn.mute_for(seconds)
        return seconds
