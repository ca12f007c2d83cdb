"""kafka-diskless.sh: the operator's view of the diskless coordinators (KIP-1164).

  --describe --bootstrap-server B [--coordinators] [--files] [--orphans] [--json]
      asks the leader of every coordinator (partition of __diskless_metadata) with
      DisklessDescribeFiles and prints: each coordinator's gauges (partitions, files, live files,
      batches and bytes, files it owns, pending handovers and deletions, files handed over and
      deleted since its leader took the lead, its oldest live file); every file each coordinator
      knows, with its owner list, the coordinator's live batches in it and its status (live,
      owned, waiting for an earlier owner's handover, handed-over, deleted); the orphan files the
      scan deleted lately (the scan runs on coordinator 0's leader). No option: all three.
      --json prints one JSON object instead of tables.

The coordinator APIs answer brokers only (until ACLs exist): run the tool on a broker's host; it
identifies as the broker it asks. Errors print one line on stderr and exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from metadata.diskless import DISKLESS_METADATA_TOPIC
from node.client import ClientError, NodeClient
from protocol.errors import error_name
from protocol.generated.diskless_describe_files import DisklessDescribeFilesRequest
from tools.admin import Admin, AdminError, ToolArgumentParser, admin_for, run_tool

COORDINATOR_COLUMNS = ["coordinator", "leader", "partitions", "files", "live_files", "live_batches", "live_bytes",
                       "owned_files", "pending_handovers", "pending_deletions", "files_handed_over", "files_deleted",
                       "oldest_file", "last_snapshot", "last_snapshot_time"]


def _time(ms: int) -> str:
    return "-" if ms < 0 else time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


async def gather(admin: Admin) -> dict[str, Any]:
    md = await admin.metadata([DISKLESS_METADATA_TOPIC])
    addresses = {b.node_id: (b.host, b.port) for b in md.brokers}
    topic = md.topics[0] if md.topics else None
    if topic is None or topic.error_code:
        return {"coordinators": [], "files": [], "orphans": [], "last_orphan_scan": "-"}
    leaders: dict[int, list[int]] = {}
    out: dict[str, Any] = {"coordinators": [], "files": [], "orphans": [], "last_orphan_scan": "-"}
    for p in sorted(topic.partitions, key=lambda p: p.partition_index):
        if p.leader_id < 0:
            out["coordinators"].append({"coordinator": p.partition_index, "leader": -1, "error": "no leader"})
            continue
        leaders.setdefault(p.leader_id, []).append(p.partition_index)
    last_scan = -1
    for broker, indexes in sorted(leaders.items()):
        if broker not in addresses:
            raise AdminError(f"broker {broker} (leader of coordinators {indexes}) is not a live broker")
        host, port = addresses[broker]
        try:
            async with NodeClient(host, port, client_id=f"diskless-{broker}", timeout=admin.timeout, security=admin.security) as c:
                resp = await c.request(DisklessDescribeFilesRequest(files=[], details=True))
        except ClientError as e:
            raise AdminError(f"broker {broker}: {e}") from None
        if not resp.coordinators:
            raise AdminError(f"broker {broker} did not describe its coordinators {indexes}: the coordinator APIs "
                             "answer brokers only, run kafka-diskless.sh on a broker's host")
        for s in resp.coordinators:
            row: dict[str, Any] = {"coordinator": s.coordinator_id, "leader": broker}
            if s.error_code:
                row["error"] = error_name(s.error_code)
            else:
                row.update(partitions=s.partitions, files=s.files, live_files=s.live_files,
                           live_batches=s.live_batches, live_bytes=s.live_bytes, owned_files=s.owned_files,
                           pending_handovers=s.pending_handovers, pending_deletions=s.pending_deletions,
                           files_handed_over=s.files_handed_over, files_deleted=s.files_deleted,
                           oldest_file=_time(s.oldest_file_timestamp_ms),
                           last_snapshot=s.last_snapshot_offset, last_snapshot_time=_time(s.last_snapshot_timestamp_ms))
            out["coordinators"].append(row)
        out["files"] += [{"coordinator": f.coordinator_id, "key": f.object_key, "size": f.file_size,
                          "owners": list(f.owner_ids), "live_batches": f.live_batches, "status": f.status}
                         for f in resp.file_details]
        out["orphans"] += [{"key": o.object_key, "size": o.size, "deleted": _time(o.deleted_ms), "scanner": broker}
                           for o in resp.orphans]
        last_scan = max(last_scan, resp.last_orphan_scan_ms)
    out["coordinators"].sort(key=lambda r: r["coordinator"])
    out["files"].sort(key=lambda r: (r["coordinator"], r["key"]))
    out["last_orphan_scan"] = _time(last_scan)
    return out


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    cells = [[c.upper() for c in columns]] + [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells)


def render(view: dict[str, Any], sections: set[str]) -> str:
    parts = []
    if "coordinators" in sections:
        cols = COORDINATOR_COLUMNS + (["error"] if any("error" in r for r in view["coordinators"]) else [])
        parts.append("Coordinators\n" + (_table(view["coordinators"], cols) if view["coordinators"]
                                         else "(none: no diskless topic was created yet)"))
    if "files" in sections:
        rows = [{**r, "owners": ",".join(str(o) for o in r["owners"])} for r in view["files"]]
        parts.append("Files\n" + (_table(rows, ["coordinator", "key", "size", "owners", "live_batches", "status"])
                                  if rows else "(none)"))
    if "orphans" in sections:
        parts.append(f"Orphans (last scan {view['last_orphan_scan']})\n" + (
            _table(view["orphans"], ["key", "size", "deleted", "scanner"]) if view["orphans"] else "(none deleted)"))
    return "\n\n".join(parts)


async def run(a: Any) -> None:
    sections = {s for s in ("coordinators", "files", "orphans") if getattr(a, s)} or {
        "coordinators", "files", "orphans"}
    async with admin_for(a, 30.0) as admin:
        view = await gather(admin)
    if a.json:
        print(json.dumps({k: v for k, v in view.items() if k in sections or k == "last_orphan_scan"}, indent=2))
    else:
        print(render(view, sections))


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-diskless.sh", description="Describe Strata's diskless coordinators.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT", help="a broker to ask first")
    ap.add_argument("--describe", action="store_true", required=True, help="describe the coordinators")
    ap.add_argument("--coordinators", action="store_true", help="each coordinator's gauges")
    ap.add_argument("--files", action="store_true", help="every file each coordinator knows, owners, live batches")
    ap.add_argument("--orphans", action="store_true", help="orphan files the scan deleted lately")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
