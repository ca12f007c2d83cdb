"""DescribeAcls from this broker's image; CreateAcls and DeleteAcls forwarded to the controller."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from metadata.acls import AclError, acl_from_request, check_filter, filter_matches
from protocol.errors import Errors
from protocol.generated.describe_acls import DescribeAclsResponse

R = DescribeAclsResponse


@api(29, 0, 3)
async def describe_acls(ctx: RequestContext, req) -> DescribeAclsResponse:
    f = acl_from_request(req, is_filter=True)
    try:
        check_filter(f)
    except AclError as e:
        return R(error_code=Errors.INVALID_REQUEST, error_message=str(e), resources=[])
    by_pattern: dict[tuple[int, str, int], list] = {}
    for acl in sorted(ctx.services.metadata.image.acls.values(), key=repr):
        if filter_matches(f, acl):
            by_pattern.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
                R.AclDescription(principal=acl.principal, host=acl.host, operation=acl.operation,
                                 permission_type=acl.permission))
    return R(error_code=0, error_message=None, resources=[
        R.DescribeAclsResource(resource_type=t, resource_name=n, pattern_type=p, acls=acls)
        for (t, n, p), acls in sorted(by_pattern.items())])


@api(30, 0, 3)
async def create_acls(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)


@api(31, 0, 3)
async def delete_acls(ctx: RequestContext, req):
    return await ctx.services.forward(req, ctx.api_version)
