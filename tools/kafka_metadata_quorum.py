"""kafka-metadata-quorum.sh for Strata: the metadata quorum as its leader sees it, in the format
of Kafka's MetadataQuorumCommand (3.x, static voters).

    kafka-metadata-quorum.sh --bootstrap-server localhost:9092 describe --status
    ClusterId:              <id>
    LeaderId:               100
    LeaderEpoch:            3
    HighWatermark:          42
    MaxFollowerLag:         0
    MaxFollowerLagTimeMs:   0
    CurrentVoters:          [100,101,102]
    CurrentObservers:       [1,2,3]

    kafka-metadata-quorum.sh --bootstrap-server localhost:9092 describe --replication
    NodeId  LogEndOffset  Lag  LastFetchTimestamp  LastCaughtUpTimestamp  Status
    100     42            0    1700000000000       1700000000000          Leader
    ...

DescribeQuorum goes to a broker (which forwards it to the active controller) with
--bootstrap-server, or straight to the controllers with --bootstrap-controller (each is asked
until the leader answers). Errors: one line on stderr, exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from metadata.image import METADATA_TOPIC
from node.causes import cause
from node.client import ClientError, NodeClient
from protocol.generated.describe_cluster import DescribeClusterRequest
from protocol.generated.describe_quorum import DescribeQuorumRequest
from tools.admin import (
    AdminError,
    ToolArgumentParser,
    admin_for,
    broker_error,
    command_security,
    parse_bootstrap,
    run_tool,
)

ENDPOINT_CONTROLLERS = 2  # DescribeCluster's endpoint type for a controller (KIP-919)


def _request() -> DescribeQuorumRequest:
    R = DescribeQuorumRequest
    return R(topics=[R.TopicData(topic_name=METADATA_TOPIC, partitions=[R.PartitionData(partition_index=0)])])


async def _from_controllers(a: argparse.Namespace) -> tuple[Any, str]:
    errors = []
    security = command_security(getattr(a, "command_config", None))
    for host, port in parse_bootstrap(a.bootstrap_controller):
        try:
            async with NodeClient(host, port, client_id="strata-admin", timeout=a.timeout, security=security) as c:
                resp = await c.request(_request())
                p = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
                if not resp.error_code and p is not None and not p.error_code:
                    # as Kafka's tool: the cluster id from DescribeCluster, which controllers
                    # answer for their own endpoint type (KIP-919)
                    cluster = await c.request(DescribeClusterRequest(endpoint_type=ENDPOINT_CONTROLLERS))
                    return resp, cluster.cluster_id or ""
        except (ClientError, TimeoutError) as e:
            errors.append(cause(e, timeout=a.timeout))
            continue
        errors.append(f"{host}:{port} is not the quorum leader")
    raise AdminError("no controller answered as the quorum leader: " + "; ".join(errors))


async def describe(a: argparse.Namespace) -> tuple[Any, str]:
    """(DescribeQuorumResponse, cluster id)."""
    if a.bootstrap_controller:
        return await _from_controllers(a)
    async with admin_for(a, a.timeout) as admin:
        md = await admin.metadata([])
        resp = await admin.request(_request())
    return resp, md.cluster_id or ""


def _partition(resp: Any) -> Any:
    if resp.error_code:
        raise broker_error("DescribeQuorum failed", resp.error_code, getattr(resp, "error_message", None))
    p = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
    if p is None:
        raise AdminError("DescribeQuorum answered without the metadata partition")
    if p.error_code:
        raise broker_error("DescribeQuorum failed", p.error_code, getattr(p, "error_message", None))
    return p


def status_text(p: Any, cluster_id: str) -> str:
    leader = next((v for v in p.current_voters if v.replica_id == p.leader_id), None)
    leader_end = leader.log_end_offset if leader is not None else p.high_watermark
    followers = [v for v in p.current_voters if v.replica_id != p.leader_id]
    max_lag = max((leader_end - v.log_end_offset for v in followers), default=0)
    leader_caught = leader.last_caught_up_timestamp if leader is not None else -1
    max_lag_ms = max((leader_caught - v.last_caught_up_timestamp for v in followers
                      if v.last_caught_up_timestamp >= 0), default=0)
    rows = [
        ("ClusterId", cluster_id),
        ("LeaderId", p.leader_id),
        ("LeaderEpoch", p.leader_epoch),
        ("HighWatermark", p.high_watermark),
        ("MaxFollowerLag", max_lag),
        ("MaxFollowerLagTimeMs", max_lag_ms),
        ("CurrentVoters", "[" + ",".join(str(v.replica_id) for v in p.current_voters) + "]"),
        ("CurrentObservers", "[" + ",".join(str(o.replica_id) for o in p.observers) + "]"),
    ]
    return "\n".join(f"{k + ':':<24}{v}" for k, v in rows)


def replication_text(p: Any) -> str:
    leader = next((v for v in p.current_voters if v.replica_id == p.leader_id), None)
    leader_end = leader.log_end_offset if leader is not None else p.high_watermark
    header = ["NodeId", "LogEndOffset", "Lag", "LastFetchTimestamp", "LastCaughtUpTimestamp", "Status"]
    rows = []
    ordered = ([leader] if leader is not None else []) + [v for v in p.current_voters if v is not leader]
    for v in ordered:
        status = "Leader" if v.replica_id == p.leader_id else "Follower"
        rows.append([v, status])
    rows += [[o, "Observer"] for o in p.observers]
    table = [header] + [[str(r.replica_id), str(r.log_end_offset), str(max(leader_end - r.log_end_offset, 0)),
                         str(r.last_fetch_timestamp), str(r.last_caught_up_timestamp), status]
                        for r, status in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("\t".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in table)


async def run(a: argparse.Namespace) -> None:
    resp, cluster_id = await describe(a)
    p = _partition(resp)
    if a.status:
        print(status_text(p, cluster_id))
    else:
        print(replication_text(p))


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-metadata-quorum.sh", description="Describe the metadata quorum (KRaft).")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--bootstrap-server", metavar="HOST:PORT[,...]", help="brokers to connect to")
    where.add_argument("--bootstrap-controller", metavar="HOST:PORT[,...]", help="controllers to connect to")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("describe", help="describe the quorum")
    what = d.add_mutually_exclusive_group(required=True)
    what.add_argument("--status", action="store_true", help="the leader, epoch, high watermark and voters")
    what.add_argument("--replication", action="store_true", help="each voter's and observer's replication state")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    if a.bootstrap_controller is not None:
        try:
            parse_bootstrap(a.bootstrap_controller)
        except AdminError as e:
            ap.error(f"--bootstrap-controller: {e}")
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
