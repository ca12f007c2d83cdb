"""AlterUserScramCredentials (brokers forward it here); SaslHandshake / SaslAuthenticate that
reach a handler came on a listener without SASL, or after authentication: ILLEGAL_SASL_STATE."""

from __future__ import annotations

from controller.apis.registry import Apis
from protocol.errors import Errors
from protocol.generated.alter_user_scram_credentials import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
)
from protocol.generated.sasl_authenticate import SaslAuthenticateRequest, SaslAuthenticateResponse
from protocol.generated.sasl_handshake import SaslHandshakeRequest, SaslHandshakeResponse
from protocol.headers import Request

R = AlterUserScramCredentialsResponse


async def alter_user_scram_credentials(apis: Apis, req: Request) -> AlterUserScramCredentialsResponse:
    results = await apis.scram.alter(req.body.deletions, req.body.upsertions)
    return R(throttle_time_ms=0, results=[
        R.AlterUserScramCredentialsResult(user=r.user, error_code=r.error.code if r.error else 0,
                                          error_message=r.error.message if r.error else None)
        for r in results
    ])


async def sasl_handshake(apis: Apis, req: Request) -> SaslHandshakeResponse:
    return SaslHandshakeResponse(error_code=Errors.ILLEGAL_SASL_STATE, mechanisms=[])


async def sasl_authenticate(apis: Apis, req: Request) -> SaslAuthenticateResponse:
    return SaslAuthenticateResponse(error_code=Errors.ILLEGAL_SASL_STATE,
                                    error_message="SASL is not enabled on this listener, or already complete")


HANDLERS = {
    51: (AlterUserScramCredentialsRequest.MIN_VERSION, AlterUserScramCredentialsRequest.MAX_VERSION,
         alter_user_scram_credentials),
    17: (SaslHandshakeRequest.MIN_VERSION, SaslHandshakeRequest.MAX_VERSION, sasl_handshake),
    36: (SaslAuthenticateRequest.MIN_VERSION, SaslAuthenticateRequest.MAX_VERSION, sasl_authenticate),
}
