"""kafka-broker-api-versions.sh for Strata: the API versions each broker serves, in the format of
Kafka's BrokerApiVersionsCommand:

    127.0.0.1:9092 (id: 1 rack: null) -> (
    <TAB>Produce(0): 3 to 12 [usable: 12],
    <TAB>...
    )

"usable" is the highest version this tool and the broker share. Strata's own APIs (keys of 1000
and up, docs/development.md, "API keys of Strata's own APIs") are named too, where Kafka's tool would print
UNKNOWN(key). A broker that does not answer gets ``... -> ERROR: reason`` as in Kafka, and the
tool then exits 1 after one line on stderr. Bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from node.client import ClientError, NodeClient
from protocol.generated import REQUESTS
from tools.admin import AdminError, ToolArgumentParser, admin_for, broker_error, run_tool


def api_line(key: int, lo: int, hi: int) -> str:
    ours = REQUESTS.get(key)
    name = ours.NAME.removesuffix("Request") if ours else "UNKNOWN"
    text = f"{name}({key}): {lo}" if lo == hi else f"{name}({key}): {lo} to {hi}"
    if ours is None:
        return text
    if lo > ours.MAX_VERSION:
        return text + " [unusable: node too new]"
    if hi < ours.MIN_VERSION:
        return text + " [unusable: node too old]"
    return text + f" [usable: {min(ours.MAX_VERSION, hi)}]"


def versions_text(versions: dict[int, tuple[int, int]]) -> str:
    """NodeApiVersions.toString(true): one API per line, by key."""
    return "(\n\t" + ",\n\t".join(api_line(k, *versions[k]) for k in sorted(versions)) + "\n)"


async def run(a: argparse.Namespace) -> None:
    async with admin_for(a, a.timeout) as admin:
        md = await admin.metadata([])
    if md.error_code:
        raise broker_error("cannot read cluster metadata", md.error_code)
    brokers = sorted(md.brokers, key=lambda b: b.node_id)

    async def versions(host: str, port: int) -> dict[int, tuple[int, int]] | str:
        try:
            async with NodeClient(host, port, client_id="strata-admin", timeout=a.timeout, security=admin.security) as c:
                return dict(c.versions)
        except ClientError as e:
            return str(e)

    answers = await asyncio.gather(*(versions(b.host, b.port) for b in brokers))
    failed = 0
    for b, ans in zip(brokers, answers):
        node = f"{b.host}:{b.port} (id: {b.node_id} rack: {b.rack if b.rack is not None else 'null'})"
        if isinstance(ans, str):
            failed += 1
            print(f"{node} -> ERROR: {ans}")
        else:
            print(f"{node} -> {versions_text(ans)}")
    if failed:
        raise AdminError(f"{failed} broker(s) did not answer ApiVersions")


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-broker-api-versions.sh", description="Print the API versions of each broker.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
