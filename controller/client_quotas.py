"""AlterClientQuotas on the controller: each entry is checked on its own and becomes one
ClientQuotaRecord per changed value, all in one batch (as Kafka's ClientQuotaControlManager)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from metadata.client_quotas import check_entity, check_value, describe_entity, entity_key
from metadata.image import MetadataImage
from protocol.generated.metadata_records.client_quota_record import ClientQuotaRecord

log = structlog.get_logger(__name__)


@dataclass
class EntryResult:
    entity: list[tuple[str, str | None]]
    error: ApiError | None = None


class ClientQuotaControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    async def alter(self, entries: list[Any], validate_only: bool) -> list[EntryResult]:
        """`entries` are AlterClientQuotasRequest.EntryData."""

        def build(image: MetadataImage, batch: Batch) -> list[EntryResult]:
            out = []
            for e in entries:
                pairs = [(x.entity_type, x.entity_name) for x in e.entity]
                res = EntryResult(pairs)
                out.append(res)
                try:
                    records = _records(image, pairs, e.ops)
                except ApiError as err:
                    res.error = err
                    continue
                if not validate_only:
                    batch.extend(records)
            return out

        results = await self.ctl.write(build)
        log.info("alter_client_quotas", validate_only=validate_only, results=", ".join(
            f"{describe_entity(entity_key(r.entity))}:{r.error.code if r.error else 'OK'}" for r in results))
        return results


def _records(image: MetadataImage, pairs: list[tuple[str, str | None]], ops: list[Any]) -> list[ClientQuotaRecord]:
    why = check_entity(pairs)
    if why:
        raise ApiError(Errors.INVALID_REQUEST, why)
    entity = entity_key(pairs)
    keys = [op.key for op in ops]
    if len(set(keys)) != len(keys):
        raise ApiError(Errors.INVALID_REQUEST, "A quota key appears more than once for one entity.")
    current = image.client_quotas.get(entity, {})
    records = []
    for op in ops:
        if op.remove:
            if op.key not in current:
                why = check_value(entity, op.key, 1.0)  # an unknown key is still an error
                if why and "Unknown" in why:
                    raise ApiError(Errors.INVALID_REQUEST, why)
                continue
        else:
            why = check_value(entity, op.key, op.value)
            if why:
                raise ApiError(Errors.INVALID_REQUEST, why)
        records.append(ClientQuotaRecord(entity=[ClientQuotaRecord.EntityData(t, n) for t, n in entity],
                                         key=op.key, value=0.0 if op.remove else op.value, remove=op.remove))
    return records
