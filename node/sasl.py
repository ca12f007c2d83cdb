"""The SASL gate of a connection on a SASL_PLAINTEXT or SASL_SSL listener (Kafka's
SaslServerAuthenticator): nothing but ApiVersions, SaslHandshake and SaslAuthenticate is served
until the client has authenticated.

- SaslHandshake picks the mechanism: one not enabled on the listener gets
  UNSUPPORTED_SASL_MECHANISM (with the enabled list) and the connection is closed.
- SaslAuthenticate carries the mechanism's tokens; a failure answers SASL_AUTHENTICATION_FAILED
  with the reason and closes the connection. v0 SaslHandshake (no SaslAuthenticate framing) is
  Kafka's legacy form: the raw tokens follow, size-prefixed.
- Any other request before authentication, or a SaslAuthenticate before the handshake, is
  ILLEGAL_SASL_STATE: answered where it is a SaslAuthenticate, and the connection closed.
- KIP-368: with `connections.max.reauth.ms`, the session lifetime goes back in SaslAuthenticate
  v1+; the client re-authenticates on the same connection (same principal) before it ends, and a
  request after it ends closes the connection.
Each failure is logged once (rate-limited) with the peer and the user the client named.
"""

from __future__ import annotations

import time

import structlog

from node.logging import RateLimitedLog
from node.scram import PLAIN, AuthenticationError, PlainServer, SaslServerMechanism, ScramServer
from node.security import SaslServerConfig
from protocol.errors import Errors, ProtocolError
from protocol.generated.sasl_authenticate import SaslAuthenticateRequest, SaslAuthenticateResponse
from protocol.generated.sasl_handshake import SaslHandshakeRequest, SaslHandshakeResponse
from protocol.headers import RequestHeader, encode_response, peek_header, request_header_version

log = structlog.get_logger(__name__)
limited = RateLimitedLog(log)

SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
PASS_ON = object()  # handle() result: the request goes to the node's handler (ApiVersions)

HANDSHAKE, AUTHENTICATE, RAW_TOKEN, DONE = "handshake", "authenticate", "raw_token", "done"


class Authenticator:
    def __init__(self, config: SaslServerConfig, peer: str, listener: str) -> None:
        self.config = config
        self.peer = peer
        self.listener = listener
        self.state = HANDSHAKE
        self.mechanism: SaslServerMechanism | None = None
        self.principal: str | None = None
        self.expires_at = 0.0  # monotonic; 0: the session never expires
        self.failed = False  # the connection is closed once the answer is written

    def intercepts(self, frame: bytes) -> bool:
        """Whether this frame is the authenticator's (cheap: called for every request)."""
        if self.state != DONE:
            return True
        if not self.config.reauth_ms:
            return False
        key = (frame[0] << 8) | frame[1] if len(frame) >= 2 else -1
        return key in (SASL_HANDSHAKE, SASL_AUTHENTICATE) or time.monotonic() >= self.expires_at

    def handle(self, frame: bytes) -> list | None | object:
        """The answer's parts, None (no answer: closed), or PASS_ON."""
        if self.state == RAW_TOKEN:
            return self._raw_token(frame)
        try:
            key, version, cid = peek_header(frame)
        except ProtocolError as e:
            self._fail("sasl_bad_frame", str(e))
            return None
        if key == API_VERSIONS:
            return PASS_ON
        if key == SASL_HANDSHAKE:
            return self._handshake(frame, version, cid)
        if key == SASL_AUTHENTICATE:
            return self._authenticate(frame, version, cid)
        if self.state == DONE:  # re-authentication enabled and the session is over
            self._fail("sasl_session_expired", "the SASL session expired without re-authentication")
            return None
        self._fail("sasl_illegal_state", f"API {key} before SASL authentication completed")
        return None

    # ----
    def _decode(self, frame: bytes, cls, version: int):
        mv = memoryview(frame)
        _, pos = RequestHeader.decode_from(mv, 0, request_header_version(cls.API_KEY, version))
        body, _ = cls.decode_from(mv, pos, version)
        return body

    def _handshake(self, frame: bytes, version: int, cid: int) -> list | None:
        if not SaslHandshakeRequest.MIN_VERSION <= version <= SaslHandshakeRequest.MAX_VERSION:
            self._fail("sasl_illegal_state", f"SaslHandshake v{version} is not served")
            return None
        if self.state not in (HANDSHAKE, DONE):
            self._fail("sasl_illegal_state", "SaslHandshake during authentication")
            return None
        try:
            req = self._decode(frame, SaslHandshakeRequest, version)
        except ProtocolError as e:
            self._fail("sasl_bad_frame", str(e))
            return None
        enabled = list(self.config.mechanisms)
        mech = (req.mechanism or "").upper()
        if mech not in self.config.mechanisms:
            self._fail("sasl_unsupported_mechanism", f"mechanism {req.mechanism!r} is not enabled", mechanism=mech)
            return encode_response(SASL_HANDSHAKE, version, cid,
                                   SaslHandshakeResponse(error_code=Errors.UNSUPPORTED_SASL_MECHANISM, mechanisms=enabled))
        if self.state == DONE and self.mechanism is not None and mech != self.mechanism.mechanism:
            self._fail("sasl_reauthentication_failed", "re-authentication must use the same mechanism")
            return None
        self.mechanism = (PlainServer(self.config.plain_users) if mech == PLAIN
                          else ScramServer(mech, self.config.scram_lookup))
        self.state = AUTHENTICATE if version >= 1 else RAW_TOKEN
        return encode_response(SASL_HANDSHAKE, version, cid, SaslHandshakeResponse(error_code=0, mechanisms=enabled))

    def _authenticate(self, frame: bytes, version: int, cid: int) -> list | None:
        R = SaslAuthenticateResponse
        if not SaslAuthenticateRequest.MIN_VERSION <= version <= SaslAuthenticateRequest.MAX_VERSION:
            self._fail("sasl_illegal_state", f"SaslAuthenticate v{version} is not served")
            return None
        if self.state != AUTHENTICATE:
            why = "SaslAuthenticate before SaslHandshake"
            self._fail("sasl_illegal_state", why)
            return encode_response(SASL_AUTHENTICATE, version, cid, R(error_code=Errors.ILLEGAL_SASL_STATE, error_message=why))
        try:
            token = self._decode(frame, SaslAuthenticateRequest, version).auth_bytes
            out = self._evaluate(token)
        except (AuthenticationError, ProtocolError) as e:
            self._fail("sasl_authentication_failed", str(e))
            msg = f"Authentication failed during authentication due to invalid credentials with SASL mechanism " \
                  f"{self.mechanism.mechanism if self.mechanism else '?'}: {e}"
            return encode_response(SASL_AUTHENTICATE, version, cid,
                                   R(error_code=Errors.SASL_AUTHENTICATION_FAILED, error_message=msg))
        lifetime = self.config.reauth_ms if self.state == DONE and version >= 1 else 0
        return encode_response(SASL_AUTHENTICATE, version, cid,
                               R(error_code=0, error_message=None, auth_bytes=out, session_lifetime_ms=lifetime))

    def _raw_token(self, frame: bytes) -> list | None:
        try:
            out = self._evaluate(bytes(frame))
        except AuthenticationError as e:
            self._fail("sasl_authentication_failed", str(e))
            return None
        return [out]

    def _evaluate(self, token: bytes) -> bytes:
        mech = self.mechanism
        assert mech is not None
        before = self.principal
        out = mech.evaluate(token)
        if mech.complete:
            principal = f"User:{mech.user}"
            if before is not None and principal != before:
                raise AuthenticationError("re-authentication must keep the same principal")
            self.principal = principal
            self.state = DONE
            if self.config.reauth_ms:
                self.expires_at = time.monotonic() + self.config.reauth_ms / 1000
            if before is None:
                log.info("sasl_authenticated", peer=self.peer, listener=self.listener, principal=principal,
                         mechanism=mech.mechanism)
        return out

    def _fail(self, event: str, error: str, **kw: object) -> None:
        self.failed = True
        user = getattr(self.mechanism, "user", None) if self.mechanism is not None else None
        limited.warning(event, peer=self.peer, listener=self.listener, principal=self.principal or
                        (f"User:{user}" if user else None), error=error, **kw)
        return None
