"""DescribeUserScramCredentials, answered from this broker's image (mechanisms and iterations,
never keys); AlterUserScramCredentials, forwarded to the controller. SaslHandshake and
SaslAuthenticate reach a handler only on a listener without SASL (or once authenticated, without
re-authentication): ILLEGAL_SASL_STATE, as Kafka's KafkaApis answers them."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from protocol.errors import Errors
from protocol.generated.describe_user_scram_credentials import DescribeUserScramCredentialsResponse
from protocol.generated.sasl_authenticate import SaslAuthenticateResponse
from protocol.generated.sasl_handshake import SaslHandshakeResponse

R = DescribeUserScramCredentialsResponse


@api(50, 0, 0)
async def describe_user_scram_credentials(ctx: RequestContext, req) -> DescribeUserScramCredentialsResponse:
    by_user: dict[str, list[tuple[int, int]]] = {}
    for (name, mechanism), cred in sorted(ctx.services.metadata.image.scram.items()):
        by_user.setdefault(name, []).append((mechanism, cred.iterations))

    def result(name: str, code: int = 0, message: str | None = None) -> R.DescribeUserScramCredentialsResult:
        infos = [R.CredentialInfo(mechanism=m, iterations=i) for m, i in by_user.get(name, [])]
        return R.DescribeUserScramCredentialsResult(user=name, error_code=code, error_message=message,
                                                    credential_infos=[] if code else infos)

    if not req.users:  # null or empty: every user
        return R(results=[result(name) for name in sorted(by_user)])
    names = [u.name for u in req.users]
    out = []
    for name in dict.fromkeys(names):
        if names.count(name) > 1:
            out.append(result(name, Errors.DUPLICATE_RESOURCE,
                              "Cannot describe SCRAM credentials for the same user twice in a single request"))
        elif name not in by_user:
            out.append(result(name, Errors.RESOURCE_NOT_FOUND, "Attempt to describe nonexistent user."))
        else:
            out.append(result(name))
    return R(results=out)


@api(51, 0, 0)
async def alter_user_scram_credentials(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)


@api(17, 0, 1)
async def sasl_handshake(ctx: RequestContext, req) -> SaslHandshakeResponse:
    return SaslHandshakeResponse(error_code=Errors.ILLEGAL_SASL_STATE, mechanisms=[])


@api(36, 0, 2)
async def sasl_authenticate(ctx: RequestContext, req) -> SaslAuthenticateResponse:
    return SaslAuthenticateResponse(error_code=Errors.ILLEGAL_SASL_STATE,
                                    error_message="SASL is not enabled on this listener, or already complete")
