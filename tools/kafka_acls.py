"""kafka-acls.sh: add, remove and list ACLs, with Kafka's options.

    kafka-acls.sh --bootstrap-server HOST:PORT --command-config admin.properties \\
        --add --allow-principal User:alice --operation Write --topic orders- --resource-pattern-type prefixed
    kafka-acls.sh ... --add --allow-principal User:bob --consumer --topic orders --group billing
    kafka-acls.sh ... --list [--topic orders] [--principal User:alice]
    kafka-acls.sh ... --remove --allow-principal User:alice --operation Write --topic orders- --resource-pattern-type prefixed
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from metadata import acls as A
from protocol.generated.create_acls import CreateAclsRequest
from protocol.generated.delete_acls import DeleteAclsRequest
from protocol.generated.describe_acls import DescribeAclsRequest
from tools.admin import AdminError, ToolArgumentParser, admin_for, broker_error, run_tool

NAMES = {v: k for k, v in A.OPERATIONS.items()}
TYPE_NAMES = {v: k for k, v in A.RESOURCE_TYPES.items()}
PATTERN_NAMES = {A.LITERAL: "LITERAL", A.PREFIXED: "PREFIXED"}


def operation_name(value: str) -> str:
    """Kafka's spellings: DescribeConfigs, IdempotentWrite, describe_configs, WRITE."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", value.strip()).upper()


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-acls.sh", description="Add, remove or list ACLs.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]")
    act = ap.add_mutually_exclusive_group(required=True)
    act.add_argument("--add", action="store_true")
    act.add_argument("--remove", action="store_true")
    act.add_argument("--list", action="store_true")
    ap.add_argument("--allow-principal", action="append", default=[], metavar="User:NAME")
    ap.add_argument("--deny-principal", action="append", default=[], metavar="User:NAME")
    ap.add_argument("--allow-host", action="append", default=[])
    ap.add_argument("--deny-host", action="append", default=[])
    ap.add_argument("--principal", help="with --list: only this principal's ACLs")
    ap.add_argument("--operation", action="append", default=[], type=operation_name,
                    help=f"one of {', '.join(sorted(A.OPERATIONS))} (default ALL)")
    ap.add_argument("--topic", action="append", default=[])
    ap.add_argument("--group", action="append", default=[])
    ap.add_argument("--transactional-id", action="append", default=[])
    ap.add_argument("--cluster", action="store_true")
    ap.add_argument("--resource-pattern-type", type=str.upper, choices=["LITERAL", "PREFIXED", "ANY", "MATCH"])
    ap.add_argument("--producer", action="store_true", help="WRITE, DESCRIBE, CREATE on the topics")
    ap.add_argument("--consumer", action="store_true", help="READ, DESCRIBE on the topics, READ on the groups")
    ap.add_argument("--idempotent", action="store_true", help="with --producer: IDEMPOTENT_WRITE on the cluster")
    ap.add_argument("--force", action="store_true", help="no confirmation (there is none to give)")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def resources(a: argparse.Namespace) -> list[tuple[int, str]]:
    out = [(A.TOPIC, t) for t in a.topic] + [(A.GROUP, g) for g in a.group]
    out += [(A.TRANSACTIONAL_ID, t) for t in a.transactional_id]
    if a.cluster:
        out.append((A.CLUSTER, A.CLUSTER_NAME))
    return out


def wanted(a: argparse.Namespace) -> list[A.AclEntry]:
    """The ACLs --add / --remove name (Kafka's rules for --producer and --consumer)."""
    pattern = A.PATTERN_TYPES.get(a.resource_pattern_type or "LITERAL")
    if pattern is None:
        raise AdminError("--add takes --resource-pattern-type literal or prefixed")
    for op in a.operation:
        if op not in A.OPERATIONS:
            raise AdminError(f"--operation {op} is not one of {', '.join(sorted(A.OPERATIONS))}")
    ops_for: list[tuple[int, str, list[int]]] = []
    if a.producer or a.consumer:
        for rtype, name in resources(a):
            if rtype == A.TOPIC:
                ops = ([A.WRITE, A.DESCRIBE, A.CREATE] if a.producer else []) + ([A.READ, A.DESCRIBE] if a.consumer else [])
                ops_for.append((rtype, name, sorted(set(ops))))
            elif rtype == A.GROUP and a.consumer:
                ops_for.append((rtype, name, [A.READ]))
            elif rtype == A.TRANSACTIONAL_ID and a.producer:
                ops_for.append((rtype, name, [A.WRITE, A.DESCRIBE]))
        if a.producer and a.idempotent:
            ops_for.append((A.CLUSTER, A.CLUSTER_NAME, [A.IDEMPOTENT_WRITE]))
    else:
        ops = [A.OPERATIONS[o] for o in a.operation] or [A.ALL]
        ops_for = [(rtype, name, ops) for rtype, name in resources(a)]
    if not ops_for:
        raise AdminError("name a resource: --topic, --group, --transactional-id or --cluster")
    people = [(p, A.ALLOW) for p in a.allow_principal] + [(p, A.DENY) for p in a.deny_principal]
    if not people:
        raise AdminError("name a principal: --allow-principal or --deny-principal")
    out = []
    for principal, perm in people:
        hosts = (a.allow_host if perm == A.ALLOW else a.deny_host) or ["*"]
        for rtype, name, ops in ops_for:
            for op in ops:
                for host in hosts:
                    out.append(A.AclEntry(rtype, name, A.LITERAL if rtype == A.CLUSTER else pattern, principal, host,
                                          op, perm))
    return out


def describe(acl: A.AclEntry) -> str:
    return (f"(principal={acl.principal}, host={acl.host}, operation={NAMES.get(acl.operation, acl.operation)}, "
            f"permissionType={'ALLOW' if acl.permission == A.ALLOW else 'DENY'})")


async def run(a: argparse.Namespace) -> None:
    async with admin_for(a, a.timeout) as admin:
        if a.add:
            acls = wanted(a)
            C = CreateAclsRequest
            resp = await admin.request(C(creations=[C.AclCreation(
                resource_type=x.resource_type, resource_name=x.resource_name, resource_pattern_type=x.pattern_type,
                principal=x.principal, host=x.host, operation=x.operation, permission_type=x.permission) for x in acls]))
            for x, r in zip(acls, resp.results, strict=True):
                if r.error_code:
                    raise broker_error(f"adding {describe(x)}", r.error_code, r.error_message)
            print(f"Adding ACLs: {len(acls)}")
            for x in acls:
                print(f"  {TYPE_NAMES[x.resource_type]} {x.resource_name} ({PATTERN_NAMES[x.pattern_type]}) {describe(x)}")
        elif a.remove:
            acls = wanted(a)
            D = DeleteAclsRequest
            resp = await admin.request(D(filters=[D.DeleteAclsFilter(
                resource_type_filter=x.resource_type, resource_name_filter=x.resource_name,
                pattern_type_filter=x.pattern_type, principal_filter=x.principal, host_filter=x.host,
                operation=x.operation, permission_type=x.permission) for x in acls]))
            removed = 0
            for r in resp.filter_results:
                if r.error_code:
                    raise broker_error("removing ACLs", r.error_code, r.error_message)
                removed += len(r.matching_acls)
            print(f"Removed ACLs: {removed}")
        else:
            await list_acls(admin, a)


async def list_acls(admin, a: argparse.Namespace) -> None:
    pattern = {"LITERAL": A.LITERAL, "PREFIXED": A.PREFIXED, "MATCH": A.MATCH}.get(a.resource_pattern_type or "", A.ANY)
    targets: Sequence[tuple[int, str | None]] = resources(a) or [(A.ANY, None)]
    for rtype, name in targets:
        resp = await admin.request(DescribeAclsRequest(
            resource_type_filter=rtype, resource_name_filter=name, pattern_type_filter=pattern,
            principal_filter=a.principal, host_filter=None, operation=A.ANY, permission_type=A.ANY))
        if resp.error_code:
            raise broker_error("listing ACLs", resp.error_code, resp.error_message)
        for r in resp.resources:
            print(f"Current ACLs for resource `ResourcePattern(resourceType={TYPE_NAMES.get(r.resource_type)}, "
                  f"name={r.resource_name}, patternType={PATTERN_NAMES.get(r.pattern_type)})`:")
            for d in r.acls:
                print(" \t" + describe(A.AclEntry(r.resource_type, r.resource_name, r.pattern_type, d.principal,
                                                  d.host, d.operation, d.permission_type)))
            print()


def main(argv: Sequence[str] | None = None) -> int:
    a = build_parser().parse_tool_args(argv)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
