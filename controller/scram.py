"""SCRAM credentials on the controller (Kafka's ScramControlManager): AlterUserScramCredentials
becomes UserScramCredentialRecord / RemoveUserScramCredentialRecord, one batch per request; the
client salts the password, the controller derives and stores only the keys (RFC 5802).

Per user, all of its changes apply or none: an unknown mechanism (UNSUPPORTED_SASL_MECHANISM), an
empty name or iterations outside 4096-16384 (UNACCEPTABLE_CREDENTIAL), the same (user, mechanism)
twice (DUPLICATE_RESOURCE), removing what does not exist (RESOURCE_NOT_FOUND)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import structlog

from controller.controller import Batch, Controller
from controller.errors import ApiError, Errors
from metadata.image import MetadataImage
from node.scram import (
    MAX_ITERATIONS,
    MECHANISM_NAMES,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    credential_from_salted,
    make_credential,
)
from protocol.generated.metadata_records.remove_user_scram_credential_record import RemoveUserScramCredentialRecord
from protocol.generated.metadata_records.user_scram_credential_record import UserScramCredentialRecord

log = structlog.get_logger(__name__)


@dataclass
class UserResult:
    user: str
    error: ApiError | None = None


def _check(name: str, mechanism: int, iterations: int | None = None) -> None:
    if not name:
        raise ApiError(Errors.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
    if mechanism not in MECHANISM_NAMES:
        raise ApiError(Errors.UNSUPPORTED_SASL_MECHANISM, f"Unknown SCRAM mechanism {mechanism}")
    if iterations is not None and iterations < MIN_ITERATIONS:
        raise ApiError(Errors.UNACCEPTABLE_CREDENTIAL, f"Too few iterations (at least {MIN_ITERATIONS})")
    if iterations is not None and iterations > MAX_ITERATIONS:
        raise ApiError(Errors.UNACCEPTABLE_CREDENTIAL, f"Too many iterations (at most {MAX_ITERATIONS})")


def _upsert_record(name: str, mechanism: int, salt: bytes, salted: bytes, iterations: int) -> UserScramCredentialRecord:
    _, hash_name = SCRAM_MECHANISMS[MECHANISM_NAMES[mechanism]]
    c = credential_from_salted(hash_name, salted, salt, iterations)
    return UserScramCredentialRecord(name=name, mechanism=mechanism, salt=salt, stored_key=c.stored_key,
                                     server_key=c.server_key, iterations=iterations)


class ScramControl:
    def __init__(self, controller: Controller) -> None:
        self.ctl = controller

    async def alter(self, deletions: list[Any], upsertions: list[Any]) -> list[UserResult]:
        def build(image: MetadataImage, batch: Batch) -> list[UserResult]:
            users: dict[str, UserResult] = {}
            records: dict[str, list[Any]] = {}
            seen: set[tuple[str, int]] = set()
            for op in [*deletions, *upsertions]:
                res = users.setdefault(op.name, UserResult(op.name))
                if res.error is not None:
                    continue
                upsert = hasattr(op, "salted_password")
                try:
                    _check(op.name, op.mechanism, op.iterations if upsert else None)
                    if (op.name, op.mechanism) in seen:
                        raise ApiError(Errors.DUPLICATE_RESOURCE,
                                       "A user credential cannot be altered twice in the same request")
                    seen.add((op.name, op.mechanism))
                    if upsert:
                        if not op.salt or not op.salted_password:
                            raise ApiError(Errors.UNACCEPTABLE_CREDENTIAL, "Salt and salted password are required")
                        rec: Any = _upsert_record(op.name, op.mechanism, op.salt, op.salted_password, op.iterations)
                    else:
                        if (op.name, op.mechanism) not in image.scram:
                            raise ApiError(Errors.RESOURCE_NOT_FOUND,
                                           "Attempt to delete a user credential that does not exist")
                        rec = RemoveUserScramCredentialRecord(name=op.name, mechanism=op.mechanism)
                    records.setdefault(op.name, []).append(rec)
                except ApiError as e:
                    res.error = e
            for name, res in users.items():
                if res.error is None:
                    batch.extend(records.get(name, []))
            return list(users.values())

        results = await self.ctl.write(build)
        log.info("alter_user_scram_credentials",
                 results=", ".join(f"{r.user}:{r.error.code if r.error else 'OK'}" for r in results))
        return results

    async def bootstrap(self, entries: list[tuple[str, str, str, int]]) -> None:
        """Write the configured credentials that the metadata does not hold yet (as
        kafka-storage.sh format --add-scram does at format time): brokers authenticate with them."""
        def build(image: MetadataImage, batch: Batch) -> list[str]:
            added = []
            for mech, name, password, iterations in entries:
                mid = SCRAM_MECHANISMS[mech][0]
                if (name, mid) in image.scram:
                    continue
                c = make_credential(mech, password, iterations)
                batch.add(UserScramCredentialRecord(name=name, mechanism=mid, salt=c.salt, stored_key=c.stored_key,
                                                    server_key=c.server_key, iterations=iterations))
                added.append(f"{name}:{mech}")
            return added

        if entries:
            added = await self.ctl.write(build)
            if added:
                log.info("scram_credentials_bootstrapped", users=",".join(added))
