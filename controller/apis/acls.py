"""CreateAcls and DeleteAcls (brokers forward them here); DescribeAcls is the brokers' job, from
their image."""

from __future__ import annotations

from controller.apis.registry import Apis
from metadata.acls import acl_from_request
from protocol.errors import Errors
from protocol.generated.create_acls import CreateAclsRequest, CreateAclsResponse
from protocol.generated.delete_acls import DeleteAclsRequest, DeleteAclsResponse
from protocol.headers import Request


async def create_acls(apis: Apis, req: Request) -> CreateAclsResponse:
    results = await apis.acls.create([acl_from_request(c) for c in req.body.creations])
    R = CreateAclsResponse
    return R(results=[R.AclCreationResult(error_code=Errors.INVALID_REQUEST if r.error else 0, error_message=r.error)
                      for r in results])


async def delete_acls(apis: Apis, req: Request) -> DeleteAclsResponse:
    results = await apis.acls.delete([acl_from_request(f, is_filter=True) for f in req.body.filters])
    R = DeleteAclsResponse
    return R(filter_results=[R.DeleteAclsFilterResult(
        error_code=Errors.INVALID_REQUEST if r.error else 0, error_message=r.error,
        matching_acls=[R.DeleteAclsMatchingAcl(error_code=0, error_message=None, resource_type=a.resource_type,
                                               resource_name=a.resource_name, pattern_type=a.pattern_type,
                                               principal=a.principal, host=a.host, operation=a.operation,
                                               permission_type=a.permission) for a in r.matched])
        for r in results])


HANDLERS = {
    30: (CreateAclsRequest.MIN_VERSION, CreateAclsRequest.MAX_VERSION, create_acls),
    31: (DeleteAclsRequest.MIN_VERSION, DeleteAclsRequest.MAX_VERSION, delete_acls),
}
