"""ACLs and the authorizer, as Kafka's StandardAuthorizer: pure functions over the ACLs in a
MetadataImage (AccessControlEntryRecords), shared by brokers and the controller.

A request is allowed when the principal is a super user, or some ALLOW ACL matches and no DENY
ACL does. An ACL matches when its resource pattern does (LITERAL: the name, or `*`; PREFIXED: a
prefix of the name), its principal does (the principal or `User:*`), its host does (the client's
address or `*`) and its operation does (the operation or ALL; an ALLOW of READ, WRITE, DELETE or
ALTER implies DESCRIBE, and ALTER_CONFIGS implies DESCRIBE_CONFIGS). With no ACL at all on the
resource, `allow.everyone.if.no.acl.found` decides (default false: denied).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Kafka's codes (AclOperation, ResourceType, PatternType, AclPermissionType)
UNKNOWN, ANY = 0, 1
ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION = 2, 3, 4, 5, 6, 7, 8, 9
DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, CREATE_TOKENS, DESCRIBE_TOKENS = 10, 11, 12, 13, 14
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = 2, 3, 4, 5, 6, 7
MATCH, LITERAL, PREFIXED = 2, 3, 4
DENY, ALLOW = 2, 3
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
OPERATIONS = {"ALL": ALL, "READ": READ, "WRITE": WRITE, "CREATE": CREATE, "DELETE": DELETE, "ALTER": ALTER,
              "DESCRIBE": DESCRIBE, "CLUSTER_ACTION": CLUSTER_ACTION, "DESCRIBE_CONFIGS": DESCRIBE_CONFIGS,
              "ALTER_CONFIGS": ALTER_CONFIGS, "IDEMPOTENT_WRITE": IDEMPOTENT_WRITE, "CREATE_TOKENS": CREATE_TOKENS,
              "DESCRIBE_TOKENS": DESCRIBE_TOKENS}
RESOURCE_TYPES = {"TOPIC": TOPIC, "GROUP": GROUP, "CLUSTER": CLUSTER, "TRANSACTIONAL_ID": TRANSACTIONAL_ID,
                  "DELEGATION_TOKEN": DELEGATION_TOKEN, "USER": USER}
PATTERN_TYPES = {"LITERAL": LITERAL, "PREFIXED": PREFIXED}
_IMPLIES_DESCRIBE = (READ, WRITE, DELETE, ALTER, DESCRIBE)
_IMPLIES_DESCRIBE_CONFIGS = (ALTER_CONFIGS, DESCRIBE_CONFIGS)


@dataclass(frozen=True)
class AclEntry:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int


class AclError(ValueError):
    """An ACL or filter that cannot be stored or used (INVALID_REQUEST)."""


def check_acl(acl: AclEntry) -> None:
    """Kafka's rules for an ACL to create."""
    if acl.resource_type not in RESOURCE_TYPES.values():
        raise AclError(f"Invalid resource type {acl.resource_type}")
    if acl.pattern_type not in (LITERAL, PREFIXED):
        raise AclError(f"Invalid pattern type {acl.pattern_type}: only LITERAL and PREFIXED ACLs can be created")
    if acl.operation not in OPERATIONS.values():
        raise AclError(f"Invalid operation {acl.operation}")
    if acl.permission not in (ALLOW, DENY):
        raise AclError(f"Invalid permission type {acl.permission}")
    if not acl.resource_name:
        raise AclError("Resource name must not be empty")
    if acl.resource_type == CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    kind, sep, name = acl.principal.partition(":")
    if not sep or not kind or not name:
        raise AclError(f"Invalid principal {acl.principal!r}: expected TYPE:NAME (e.g. User:alice)")
    if not acl.host:
        raise AclError("Host must not be empty (use * for any host)")


def filter_matches(f: AclEntry, acl: AclEntry) -> bool:
    """An ACL filter (DescribeAcls, DeleteAcls): ANY / null fields match everything; MATCH
    pattern type matches every pattern that would apply to the named resource."""
    if f.resource_type != ANY and f.resource_type != acl.resource_type:
        return False
    if f.pattern_type == MATCH:
        if f.resource_name is not None and not _pattern_applies(acl, f.resource_name):
            return False
    else:
        if f.pattern_type != ANY and f.pattern_type != acl.pattern_type:
            return False
        if f.resource_name is not None and f.resource_name != acl.resource_name:
            return False
    if f.principal is not None and f.principal != acl.principal:
        return False
    if f.host is not None and f.host != acl.host:
        return False
    if f.operation != ANY and f.operation != acl.operation:
        return False
    return f.permission == ANY or f.permission == acl.permission


def check_filter(f: AclEntry) -> None:
    for value, name in ((f.resource_type, "resource type"), (f.pattern_type, "pattern type"),
                        (f.operation, "operation"), (f.permission, "permission type")):
        if value == UNKNOWN:
            raise AclError(f"Filter has an unknown {name}")


def _pattern_applies(acl: AclEntry, name: str) -> bool:
    if acl.pattern_type == LITERAL:
        return acl.resource_name in (name, WILDCARD)
    return acl.pattern_type == PREFIXED and name.startswith(acl.resource_name)


def _op_matches(acl_op: int, op: int, permission: int) -> bool:
    if acl_op in (ALL, op):
        return True
    if permission != ALLOW:
        return False
    return (op == DESCRIBE and acl_op in _IMPLIES_DESCRIBE) or (
        op == DESCRIBE_CONFIGS and acl_op in _IMPLIES_DESCRIBE_CONFIGS)


@dataclass(frozen=True)
class Authorizer:
    """`authorizer.class.name` set: every request is authorized against the image's ACLs."""

    super_users: frozenset[str] = frozenset()
    allow_if_no_acl: bool = False

    def authorize(self, acls: Mapping[object, AclEntry], principal: str, host: str, op: int, rtype: int,
                  name: str) -> bool:
        if principal in self.super_users:
            return True
        found = allowed = False
        for acl in _applicable(acls.values(), rtype, name):
            found = True
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.host not in (host, WILDCARD):
                continue
            if not _op_matches(acl.operation, op, acl.permission):
                continue
            if acl.permission == DENY:
                return False
            allowed = True
        return allowed or (not found and self.allow_if_no_acl)

    def any_allowed(self, acls: Mapping[object, AclEntry], principal: str, host: str, op: int, rtype: int) -> bool:
        """Whether some resource of the type may be used (Kafka's authorizeByResourceType: an ALLOW
        on any pattern of the type and no DENY on it for everything)."""
        if principal in self.super_users:
            return True
        ok = False
        for acl in acls.values():
            if acl.resource_type != rtype or acl.principal not in (principal, WILDCARD_PRINCIPAL) or \
                    acl.host not in (host, WILDCARD) or not _op_matches(acl.operation, op, acl.permission):
                continue
            if acl.permission == DENY and acl.pattern_type == LITERAL and acl.resource_name == WILDCARD:
                return False
            ok = ok or acl.permission == ALLOW
        return ok or self.allow_if_no_acl


def _applicable(acls: Iterable[AclEntry], rtype: int, name: str) -> Iterable[AclEntry]:
    return (a for a in acls if a.resource_type == rtype and _pattern_applies(a, name))


def parse_super_users(value: str) -> frozenset[str]:
    """super.users: ``User:admin;User:broker`` (Kafka separates them with semicolons)."""
    return frozenset(x.strip() for x in value.split(";") if x.strip())


def acl_from_request(x: Any, *, is_filter: bool = False) -> AclEntry:
    """An AclEntry from a CreateAcls creation, or a filter from DescribeAcls / a DeleteAcls filter."""
    if is_filter:
        return AclEntry(x.resource_type_filter, x.resource_name_filter, x.pattern_type_filter, x.principal_filter,
                        x.host_filter, x.operation, x.permission_type)
    return AclEntry(x.resource_type, x.resource_name, x.resource_pattern_type, x.principal, x.host, x.operation,
                    x.permission_type)
