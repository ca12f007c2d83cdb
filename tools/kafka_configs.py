"""kafka-configs.sh for SCRAM users (the `--entity-type users` path of Kafka's tool):

    kafka-configs.sh --bootstrap-server HOST:PORT --command-config admin.properties --alter \\
        --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]' \\
        --entity-type users --entity-name alice
    kafka-configs.sh ... --alter --delete-config SCRAM-SHA-512 --entity-type users --entity-name alice
    kafka-configs.sh ... --describe --entity-type users [--entity-name alice]

The password is salted here (a random salt, PBKDF2) and only the salted password is sent
(AlterUserScramCredentials), as Kafka's admin client does. Other entity types are not served by
this tool (topic and broker configs: any Kafka admin client).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from node.scram import MECHANISM_NAMES, SCRAM_MECHANISMS, salted_password
from protocol.generated.alter_user_scram_credentials import AlterUserScramCredentialsRequest
from protocol.generated.describe_user_scram_credentials import DescribeUserScramCredentialsRequest
from tools.admin import AdminError, ToolArgumentParser, admin_for, broker_error, run_tool

_ENTRY = re.compile(r"(SCRAM-SHA-256|SCRAM-SHA-512)=\[([^\]]*)\]")
DEFAULT_ITERATIONS = 4096  # Kafka's


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-configs.sh", description="Add, remove or describe users' SCRAM credentials.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]")
    act = ap.add_mutually_exclusive_group(required=True)
    act.add_argument("--alter", action="store_true")
    act.add_argument("--describe", action="store_true")
    ap.add_argument("--entity-type", required=True, help="users (the only type this tool serves)")
    ap.add_argument("--entity-name", action="append", default=[])
    ap.add_argument("--add-config", help="SCRAM-SHA-256=[iterations=N,password=P],SCRAM-SHA-512=[password=P]")
    ap.add_argument("--delete-config", help="SCRAM-SHA-256,SCRAM-SHA-512")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def parse_add(value: str) -> list[tuple[str, int, str]]:
    """(mechanism, iterations, password) per entry of --add-config."""
    out, rest = [], value
    for m in _ENTRY.finditer(value):
        fields = dict(kv.split("=", 1) for kv in m.group(2).split(",") if "=" in kv)
        if "password" not in fields:
            raise AdminError(f"--add-config {m.group(1)} needs password=")
        iterations = fields.get("iterations", str(DEFAULT_ITERATIONS))
        if not iterations.isdigit():
            raise AdminError(f"--add-config {m.group(1)}: iterations={iterations!r} is not a number")
        out.append((m.group(1), int(iterations), fields["password"]))
        rest = rest.replace(m.group(0), "")
    if not out or rest.strip(", "):
        raise AdminError("--add-config takes SCRAM-SHA-256=[password=..] and/or SCRAM-SHA-512=[iterations=..,password=..]")
    return out


async def run(a: argparse.Namespace) -> None:
    if a.entity_type != "users":
        raise AdminError(f"--entity-type {a.entity_type}: this kafka-configs.sh serves users (SCRAM credentials) only")
    async with admin_for(a, a.timeout) as admin:
        if a.describe:
            users = [DescribeUserScramCredentialsRequest.UserName(name=n) for n in a.entity_name] or None
            resp = await admin.request(DescribeUserScramCredentialsRequest(users=users))
            if resp.error_code:
                raise broker_error("describing users", resp.error_code, resp.error_message)
            for r in resp.results:
                if r.error_code:
                    raise broker_error(f"describing user {r.user}", r.error_code, r.error_message)
                creds = ",".join(f"{MECHANISM_NAMES.get(c.mechanism, c.mechanism)}=iterations={c.iterations}"
                                 for c in r.credential_infos)
                print(f"SCRAM credential configs for user-principal '{r.user}' are {creds}")
            return
        if len(a.entity_name) != 1 or not (a.add_config or a.delete_config):
            raise AdminError("--alter needs one --entity-name and --add-config or --delete-config")
        user = a.entity_name[0]
        R = AlterUserScramCredentialsRequest
        upserts = []
        for mech, iterations, password in parse_add(a.add_config) if a.add_config else []:
            mid, hash_name = SCRAM_MECHANISMS[mech]
            salt = os.urandom(32)
            upserts.append(R.ScramCredentialUpsertion(name=user, mechanism=mid, iterations=iterations, salt=salt,
                                                      salted_password=salted_password(hash_name, password, salt,
                                                                                      iterations)))
        deletions = []
        for mech in filter(None, (x.strip() for x in (a.delete_config or "").split(","))):
            if mech not in SCRAM_MECHANISMS:
                raise AdminError(f"--delete-config {mech}: not SCRAM-SHA-256 or SCRAM-SHA-512")
            deletions.append(R.ScramCredentialDeletion(name=user, mechanism=SCRAM_MECHANISMS[mech][0]))
        resp = await admin.request(R(deletions=deletions, upsertions=upserts), to_controller=False)
        for r in resp.results:
            if r.error_code:
                raise broker_error(f"altering user {r.user}", r.error_code, r.error_message)
        print(f"Completed updating config for user {user}.")


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(run(build_parser().parse_tool_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
