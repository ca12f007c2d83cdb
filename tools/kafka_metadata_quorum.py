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
import json
import sys
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from controller.log_dirs import META_PROPERTIES, id_to_uuid, uuid_to_id
from metadata.voters import describe_quorum_request
from node.causes import cause
from node.client import ClientError, NodeClient
from node.config import ConfigError, NodeConfig, parse_properties
from protocol.generated.add_raft_voter import AddRaftVoterRequest
from protocol.generated.describe_cluster import DescribeClusterRequest
from protocol.generated.remove_raft_voter import RemoveRaftVoterRequest
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


async def _leader_address(a: argparse.Namespace) -> tuple[str, int]:
    """The quorum leader's controller listener: each --bootstrap-controller is asked in turn,
    and one that is not the leader names it (DescribeQuorum's nodes, KIP-853)."""
    errors = []
    security = command_security(getattr(a, "command_config", None))
    for host, port in parse_bootstrap(a.bootstrap_controller):
        try:
            async with NodeClient(host, port, client_id="strata-admin", timeout=a.timeout, security=security) as c:
                resp = await c.request(describe_quorum_request())
        except (ClientError, TimeoutError) as e:
            errors.append(cause(e, timeout=a.timeout))
            continue
        p = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
        if not resp.error_code and p is not None and not p.error_code:
            return host, port
        leader = next((n for n in resp.nodes if p is not None and n.node_id == p.leader_id and n.listeners), None)
        if leader is not None:
            return leader.listeners[0].host, leader.listeners[0].port
        errors.append(f"{host}:{port} is not the quorum leader")
    raise AdminError("no controller answered as the quorum leader: " + "; ".join(errors))


async def _ask_leader(a: argparse.Namespace, bodies: list[Any], what: str) -> list[Any]:
    """Send `bodies` in turn to the quorum leader found through --bootstrap-controller."""
    host, port = await _leader_address(a)
    security = command_security(getattr(a, "command_config", None))
    try:
        async with NodeClient(host, port, client_id="strata-admin", timeout=a.timeout, security=security) as c:
            return [await c.request(body, timeout=a.timeout) for body in bodies]
    except (ClientError, TimeoutError) as e:
        raise AdminError(f"{what}the quorum leader {host}:{port}: {cause(e, timeout=a.timeout)}") from None


async def _from_controllers(a: argparse.Namespace) -> tuple[Any, str]:
    # as Kafka's tool: the cluster id from DescribeCluster, which controllers answer for their own
    # endpoint type (KIP-919)
    resp, cluster = await _ask_leader(a, [describe_quorum_request(),
                                          DescribeClusterRequest(endpoint_type=ENDPOINT_CONTROLLERS)], "")
    return resp, cluster.cluster_id or ""


async def describe(a: argparse.Namespace) -> tuple[Any, str]:
    """(DescribeQuorumResponse, cluster id)."""
    if a.bootstrap_controller:
        return await _from_controllers(a)
    async with admin_for(a, a.timeout) as admin:
        md = await admin.metadata([])
        resp = await admin.request(describe_quorum_request())
    return resp, md.cluster_id or ""


async def _change(a: argparse.Namespace, body: Any, what: str) -> None:
    """Send a voter change to the quorum leader (or a broker, which forwards it)."""
    if a.bootstrap_controller:
        [resp] = await _ask_leader(a, [body], f"{what}: ")
    else:
        async with admin_for(a, a.timeout) as admin:
            resp = await admin.request(body)
    if resp.error_code:
        raise broker_error(f"{what} failed", resp.error_code, getattr(resp, "error_message", None))


def _new_controller(path: str) -> tuple[int, UUID, list[tuple[str, str, int]]]:
    """(node id, metadata dir's directory id, controller endpoints) of the controller whose
    properties file is `path`, as Kafka's add-controller reads them."""
    try:
        cfg = NodeConfig.load(path)
        node_id = cfg.node_id
        props = parse_properties((cfg.metadata_dir / META_PROPERTIES).read_text(encoding="utf-8"))
        dir_id = id_to_uuid(props["directory.id"])
        endpoints = [(e.listener, e.host, e.port) for e in cfg.controller_endpoints]
    except (ConfigError, OSError, KeyError, ValueError) as e:
        raise AdminError(f"--command-config {path}: {getattr(e, 'strerror', None) or e}") from None
    if "controller" not in cfg.roles or not endpoints:
        raise AdminError(f"--command-config {path} is not a controller's config (process.roles, "
                         "controller.listener.names)")
    return node_id, dir_id, endpoints


async def add_controller(a: argparse.Namespace) -> None:
    path = getattr(a, "command_config", None)
    if not path:
        raise AdminError("add-controller needs --command-config: the new controller's properties file")
    node_id, dir_id, endpoints = _new_controller(path)
    R = AddRaftVoterRequest
    await _change(a, R(cluster_id=None, timeout_ms=int(a.timeout * 1000), voter_id=node_id, voter_directory_id=dir_id,
                       listeners=[R.Listener(name=n, host=h, port=p) for n, h, p in endpoints]), "add-controller")
    print(f"Added controller {node_id} with directory id {uuid_to_id(dir_id)} and endpoints: "
          + ", ".join(f"{n}://{h}:{p}" for n, h, p in endpoints))


async def remove_controller(a: argparse.Namespace) -> None:
    try:
        dir_id = id_to_uuid(a.controller_directory_id)
    except ValueError:
        raise AdminError(f"--controller-directory-id: {a.controller_directory_id!r} is not a directory id") from None
    await _change(a, RemoveRaftVoterRequest(cluster_id=None, voter_id=a.controller_id, voter_directory_id=dir_id),
                  "remove-controller")
    print(f"Removed KRaft controller {a.controller_id} with directory id {a.controller_directory_id}")


def _partition(resp: Any) -> Any:
    if resp.error_code:
        raise broker_error("DescribeQuorum failed", resp.error_code, getattr(resp, "error_message", None))
    p = resp.topics[0].partitions[0] if resp.topics and resp.topics[0].partitions else None
    if p is None:
        raise AdminError("DescribeQuorum answered without the metadata partition")
    if p.error_code:
        raise broker_error("DescribeQuorum failed", p.error_code, getattr(p, "error_message", None))
    return p


def _voters_text(p: Any, nodes: list) -> str:
    """Static voters as ids (Kafka 3.x's form); a dynamic quorum's (KIP-853) with their
    directory ids and endpoints, as Kafka 3.9+ prints them."""
    if all(v.replica_directory_id.int == 0 for v in p.current_voters):
        return "[" + ",".join(str(v.replica_id) for v in p.current_voters) + "]"
    where = {n.node_id: [f"{x.name}://{x.host}:{x.port}" for x in n.listeners] for n in nodes}
    return "[" + ", ".join(json.dumps({"id": v.replica_id, "directoryId": uuid_to_id(v.replica_directory_id),
                                       "endpoints": where.get(v.replica_id, [])}) for v in p.current_voters) + "]"


def status_text(p: Any, cluster_id: str, nodes: list | None = None) -> str:
    nodes = nodes or []
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
        ("CurrentVoters", _voters_text(p, nodes)),
        ("CurrentObservers", "[" + ",".join(str(o.replica_id) for o in p.observers) + "]"),
    ]
    return "\n".join(f"{k + ':':<24}{v}" for k, v in rows)


def replication_text(p: Any) -> str:
    leader = next((v for v in p.current_voters if v.replica_id == p.leader_id), None)
    leader_end = leader.log_end_offset if leader is not None else p.high_watermark
    dirs = any(v.replica_directory_id.int for v in p.current_voters)  # a dynamic quorum (KIP-853)
    header = ["NodeId", *(["DirectoryId"] * dirs), "LogEndOffset", "Lag", "LastFetchTimestamp",
              "LastCaughtUpTimestamp", "Status"]
    rows = []
    ordered = ([leader] if leader is not None else []) + [v for v in p.current_voters if v is not leader]
    for v in ordered:
        status = "Leader" if v.replica_id == p.leader_id else "Follower"
        rows.append([v, status])
    rows += [[o, "Observer"] for o in p.observers]
    table = [header] + [[str(r.replica_id), *([uuid_to_id(r.replica_directory_id)] * dirs), str(r.log_end_offset),
                         str(max(leader_end - r.log_end_offset, 0)),
                         str(r.last_fetch_timestamp), str(r.last_caught_up_timestamp), status]
                        for r, status in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("\t".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in table)


async def run(a: argparse.Namespace) -> None:
    if a.command == "add-controller":
        return await add_controller(a)
    if a.command == "remove-controller":
        return await remove_controller(a)
    resp, cluster_id = await describe(a)
    p = _partition(resp)
    if a.status:
        print(status_text(p, cluster_id, resp.nodes))
    else:
        print(replication_text(p))


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-metadata-quorum.sh", description="Describe the metadata quorum (KRaft).")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--bootstrap-server", metavar="HOST:PORT[,...]", help="brokers to connect to")
    where.add_argument("--bootstrap-controller", metavar="HOST:PORT[,...]", help="controllers to connect to")
    ap.add_argument("--timeout", type=float, default=30.0, help=argparse.SUPPRESS)
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("add-controller", help="add the controller of --command-config to the voters (KIP-853)")
    r = sub.add_parser("remove-controller", help="remove a controller from the voters (KIP-853)")
    r.add_argument("--controller-id", type=int, required=True, metavar="ID", help="the controller's node id")
    r.add_argument("--controller-directory-id", required=True, metavar="DIRID",
                   help="the directory id of its metadata log dir")
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
