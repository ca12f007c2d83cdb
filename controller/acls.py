"""CreateAcls / DeleteAcls on the controller (Kafka's AclControlManager): each ACL becomes an
AccessControlEntryRecord with a new id, each deletion a RemoveAccessControlEntryRecord; one batch
per request. An invalid ACL or filter fails alone (INVALID_REQUEST), the others apply."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import structlog

from controller.controller import Batch, Controller
from metadata.acls import AclEntry, AclError, check_acl, check_filter, filter_matches
from metadata.image import MetadataImage
from protocol.generated.metadata_records.access_control_entry_record import AccessControlEntryRecord
from protocol.generated.metadata_records.remove_access_control_entry_record import RemoveAccessControlEntryRecord

log = structlog.get_logger(__name__)


@dataclass
class AclResult:
    error: str | None = None
    matched: list[AclEntry] = field(default_factory=list)


def _valid(items: list[AclEntry], check: Callable[[AclEntry], None],
           out: list[AclResult]) -> Iterator[tuple[AclEntry, AclResult]]:
    """Each item with its result (appended to `out`); an invalid one gets its error and is skipped."""
    for item in items:
        res = AclResult()
        out.append(res)
        try:
            check(item)
        except AclError as e:
            res.error = str(e)
            continue
        yield item, res


class AclControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    async def create(self, acls: list[AclEntry]) -> list[AclResult]:
        def build(image: MetadataImage, batch: Batch) -> list[AclResult]:
            out: list[AclResult] = []
            existing = set(image.acls.values())
            for acl, _res in _valid(acls, check_acl, out):
                if acl in existing:
                    continue  # as Kafka: creating an ACL that exists succeeds without a record
                existing.add(acl)
                batch.add(AccessControlEntryRecord(
                    id=uuid.uuid4(), resource_type=acl.resource_type, resource_name=acl.resource_name,
                    pattern_type=acl.pattern_type, principal=acl.principal, host=acl.host,
                    operation=acl.operation, permission_type=acl.permission))
            return out

        results = await self.ctl.write(build)
        log.info("acls_created", count=sum(r.error is None for r in results), failed=sum(r.error is not None for r in results))
        return results

    async def delete(self, filters: list[AclEntry]) -> list[AclResult]:
        def build(image: MetadataImage, batch: Batch) -> list[AclResult]:
            out: list[AclResult] = []
            removed = set()
            for f, res in _valid(filters, check_filter, out):
                for acl_id, acl in sorted(image.acls.items()):
                    if acl_id not in removed and filter_matches(f, acl):
                        removed.add(acl_id)
                        res.matched.append(acl)
                        batch.add(RemoveAccessControlEntryRecord(id=acl_id))
            return out

        results = await self.ctl.write(build)
        log.info("acls_deleted", count=sum(len(r.matched) for r in results))
        return results

