"""kafka-share-groups.sh for Strata: list and describe share groups (KIP-932), with the options
and output of Kafka's ShareGroupCommand.

  --list [--state [S,S]]
  --describe (--group G ... | --all-groups) [--offsets (default) | --members [--verbose] | --state [--verbose]]
  --reset-offsets --group G (--topic T[:P,P] ... | --all-topics)
      (--to-earliest | --to-latest | --to-datetime YYYY-MM-DDTHH:mm:SS.sss[zone]) [--dry-run | --execute]
  --delete (--group G ... | --all-groups)
  --delete-offsets --group G --topic T ...

ListGroups goes to every broker (type filter `share`), ShareGroupDescribe and
DescribeShareGroupOffsets to the group's coordinator, ListOffsets to partition leaders. --offsets
shows each share-partition's start offset and its lag as the coordinator answers it (KIP-1226:
from the start offset to the high watermark, less the records past the start offset already
acknowledged or archived); from a broker answering no lag, the log end minus the start offset.
--reset-offsets sets the start offsets of an empty group (AlterShareGroupOffsets; a group with
members answers NON_EMPTY_GROUP); --delete (DeleteGroups) and --delete-offsets
(DeleteShareGroupOffsets, whole topics) delete an empty group and its share-partitions' state.
Errors go to stderr, one line, exit 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from protocol.errors import Errors, error_message
from protocol.generated.alter_share_group_offsets import AlterShareGroupOffsetsRequest
from protocol.generated.delete_share_group_offsets import DeleteShareGroupOffsetsRequest
from protocol.generated.describe_share_group_offsets import DescribeShareGroupOffsetsRequest
from protocol.generated.list_groups import ListGroupsRequest
from protocol.generated.share_group_describe import ShareGroupDescribeRequest
from tools.admin import AdminError, ToolArgumentParser, admin_for, broker_error, ranged_int, run_tool
from tools.brokers import EARLIEST, LATEST, Brokers, TopicPartition
from tools.kafka_consumer_groups import (
    Group,
    Member,
    assignment_text,
    delete_groups,
    parse_datetime,
    parse_topic_partitions,
    print_state,
    row_text,
    show,
    table,
)

STATES = ["Empty", "Stable", "Dead"]


async def list_share_groups(brokers: Brokers) -> list[tuple[str, str]]:
    """(group id, state) of every share group."""
    await brokers.topics([])
    ids = sorted(brokers.addresses)
    answers = await asyncio.gather(*(brokers.send(b, ListGroupsRequest(states_filter=[], types_filter=["share"]), 5)
                                     for b in ids))
    out = {}
    for b, resp in zip(ids, answers):
        if resp.error_code:
            raise broker_error(f"cannot list the groups of broker {b}", resp.error_code)
        for g in resp.groups:
            if g.group_type == "share":
                out[g.group_id] = g.group_state
    return sorted(out.items())


async def describe_share_group(brokers: Brokers, group: str) -> Group:
    coordinator = await brokers.coordinator(group)
    resp = await brokers.send_to(coordinator.host, coordinator.port,
                                 ShareGroupDescribeRequest(group_ids=[group], include_authorized_operations=False), 1)
    d = resp.groups[0]
    if d.error_code == Errors.GROUP_ID_NOT_FOUND:
        raise AdminError(f"Share group '{group}' does not exist.", Errors.GROUP_ID_NOT_FOUND)
    if d.error_code:
        raise broker_error(f"cannot describe share group '{group}'", d.error_code, d.error_message)
    members = [Member(m.member_id, "", m.client_id, m.client_host,
                      sorted((t.topic_name, p) for t in m.assignment.topic_partitions for p in t.partitions),
                      m.member_epoch)
               for m in d.members]
    return Group(group, d.group_state, d.assignor_name, coordinator, members, "share", d.group_epoch,
                 d.assignment_epoch)


async def list_action(brokers: Brokers, a: argparse.Namespace) -> None:
    groups = await list_share_groups(brokers)
    if a.state is None:
        for g, _ in groups:
            print(g)
        return
    wanted = {s.lower() for s in a.state.split(",") if s}
    if wanted - {s.lower() for s in STATES}:
        raise AdminError(f"Invalid state list '{a.state}'. Valid states are: {', '.join(STATES)}")
    shown = [(g, s) for g, s in groups if not wanted or s.lower() in wanted]
    width = max([15, *(len(g) for g, _ in shown)]) + 10
    print("\n".join(row_text([width, None], r) for r in [["GROUP", "STATE"], *shown]))


def print_members(g: Group, verbose: bool) -> None:
    if g.state == "Empty":
        print(f"\nShare group '{g.group_id}' has no active members.", file=sys.stderr)
    w = [max([15, len(g.group_id)]), max([15, *(len(m.member_id) for m in g.members)]),
         max([15, *(len(m.host) for m in g.members)]), max([15, *(len(m.client_id) for m in g.members)])]
    header = ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID"]
    if verbose:
        header.append("MEMBER-EPOCH")
        w.append(15)
    lines = [row_text(w, header) + " ASSIGNMENT"]
    for m in g.members:
        row = [g.group_id, m.member_id, m.host, m.client_id, *([m.epoch] if verbose else [])]
        lines.append(row_text(w, row) + " " + assignment_text(m.assignment))
    print("\n" + "\n".join(lines))


async def print_offsets(brokers: Brokers, g: Group) -> None:
    resp = await brokers.to_coordinator(g.group_id, DescribeShareGroupOffsetsRequest(groups=[
        DescribeShareGroupOffsetsRequest.DescribeShareGroupOffsetsRequestGroup(group_id=g.group_id, topics=None)]))
    d = resp.groups[0]
    if d.error_code:
        raise broker_error(f"cannot describe the offsets of share group '{g.group_id}'", d.error_code,
                           d.error_message)
    starts = {(t.topic_name, p.partition_index): p.start_offset for t in d.topics for p in t.partitions
              if not p.error_code}
    lags = {(t.topic_name, p.partition_index): p.lag for t in d.topics for p in t.partitions
            if not p.error_code and p.lag >= 0}
    # the coordinator's Lag (v1, KIP-1226) when it answered one; else the log end minus the start
    unanswered = [tp for tp in starts if tp not in lags]
    answers = await brokers.list_offsets(dict.fromkeys(unanswered, LATEST)) if unanswered else {}
    rows: list[list[object]] = []
    for tp, start in sorted(starts.items()):
        end = answers[tp].offset if tp in answers and not answers[tp].error_code else None
        known = start if start >= 0 else None
        lag = lags.get(tp, end - known if end is not None and known is not None else None)
        rows.append([g.group_id, tp[0], tp[1], show(known), show(lag)])
    if g.state == "Empty":
        print(f"\nShare group '{g.group_id}' has no active members.", file=sys.stderr)
    if not rows:
        return
    w = [max([15, *(len(str(r[i])) for r in rows)]) for i in (0, 1)]
    print(table([w[0], w[1], 10, 15, None], [["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"], *rows]))


async def reset_action(brokers: Brokers, a: argparse.Namespace) -> None:
    group = a.group[0]
    tps: list[TopicPartition] = []
    if a.all_topics:
        resp = await brokers.to_coordinator(group, DescribeShareGroupOffsetsRequest(groups=[
            DescribeShareGroupOffsetsRequest.DescribeShareGroupOffsetsRequestGroup(group_id=group, topics=None)]))
        d = resp.groups[0]
        if d.error_code:
            raise broker_error(f"cannot describe the offsets of share group '{group}'", d.error_code,
                               d.error_message)
        tps = sorted((t.topic_name, p.partition_index) for t in d.topics for p in t.partitions)
    for arg in a.topic or ():
        topic, parts = parse_topic_partitions(arg) if ":" in arg else (arg, [])
        tps += [(topic, p) for p in parts] if parts else await brokers.partitions_of([topic])
    which = EARLIEST if a.to_earliest else LATEST if a.to_latest else a.to_datetime
    answers = await brokers.list_offsets(dict.fromkeys(tps, which))
    plan = {}
    for tp in sorted(answers):
        ans = answers[tp]
        if ans.error_code:
            raise broker_error(f"cannot list the offsets of {tp[0]}-{tp[1]}", ans.error_code)
        plan[tp] = ans.offset if ans.offset >= 0 else (await brokers.offsets([tp], LATEST))[tp]
    if a.execute:
        A = AlterShareGroupOffsetsRequest
        by_topic: dict[str, list] = {}
        for (topic, p), off in plan.items():
            by_topic.setdefault(topic, []).append(A.AlterShareGroupOffsetsRequestPartition(partition_index=p,
                                                                                          start_offset=off))
        resp = await brokers.to_coordinator(group, A(group_id=group, topics=[
            A.AlterShareGroupOffsetsRequestTopic(topic_name=t, partitions=ps) for t, ps in by_topic.items()]))
        if resp.error_code:
            raise broker_error(f"cannot reset the offsets of share group '{group}'", resp.error_code,
                               resp.error_message)
        for t in resp.responses:
            for p in t.partitions:
                if p.error_code:
                    raise broker_error(f"cannot reset the offset of {t.topic_name}-{p.partition_index}",
                                       p.error_code, p.error_message)
    w = [max([15, len(group)]), max([15, *(len(t) for t, _ in plan)])]
    print(table([w[0], w[1], 10, None], [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
                                          *([group, t, p, off] for (t, p), off in plan.items())]))


async def delete_action(brokers: Brokers, a: argparse.Namespace) -> None:
    groups = [g for g, _ in await list_share_groups(brokers)] if a.all_groups else list(dict.fromkeys(a.group))
    await delete_groups(brokers, groups, "share groups", "Share group")


async def delete_offsets_action(brokers: Brokers, a: argparse.Namespace) -> None:
    gid = a.group[0]
    D = DeleteShareGroupOffsetsRequest
    resp = await brokers.to_coordinator(gid, D(group_id=gid, topics=[
        D.DeleteShareGroupOffsetsRequestTopic(topic_name=t) for t in dict.fromkeys(a.topic)]))
    if resp.error_code == Errors.NON_EMPTY_GROUP:
        raise AdminError(f"Deleting offsets of share group '{gid}' is forbidden if the group is not empty.",
                         resp.error_code)
    if resp.error_code:
        raise broker_error(f"cannot delete the offsets of share group '{gid}'", resp.error_code, resp.error_message)
    rows = [[t.topic_name, f"Error: {error_message(t.error_code)}" if t.error_code else "Successful"]
            for t in resp.responses]
    print(table([30, None], [["TOPIC", "STATUS"], *rows]))
    failed = [t.error_code for t in resp.responses if t.error_code]
    if failed:
        raise AdminError("Encounter some topic level error, see the details above", failed[0])


async def describe_action(brokers: Brokers, a: argparse.Namespace) -> None:
    names = [g for g, _ in await list_share_groups(brokers)] if a.all_groups else a.group
    for name in names:
        g = await describe_share_group(brokers, name)
        if a.members:
            print_members(g, a.verbose)
        elif a.state is not None:
            print_state(g, a.verbose)
        else:
            await print_offsets(brokers, g)


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-share-groups.sh", description="List and describe share groups.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--group", action="append", help="the share group (repeatable)")
    ap.add_argument("--all-groups", action="store_true", help="every share group")
    ap.add_argument("--list", action="store_true", help="list all share groups")
    ap.add_argument("--describe", action="store_true", help="describe share groups")
    ap.add_argument("--reset-offsets", action="store_true", help="set the start offsets of an empty share group")
    ap.add_argument("--delete", action="store_true", help="delete empty share groups")
    ap.add_argument("--delete-offsets", action="store_true", help="delete an empty share group's offsets of topics")
    ap.add_argument("--topic", action="append",
                    help="with --reset-offsets: a topic, or TOPIC:P,P; with --delete-offsets: a topic")
    ap.add_argument("--all-topics", action="store_true", help="with --reset-offsets: every topic of the group")
    ap.add_argument("--to-earliest", action="store_true", help="reset to the earliest offset")
    ap.add_argument("--to-latest", action="store_true", help="reset to the latest offset")
    ap.add_argument("--to-datetime", type=parse_datetime, metavar="YYYY-MM-DDTHH:mm:SS.sss",
                    help="reset to the first offset at or after this time")
    ap.add_argument("--dry-run", action="store_true", help="show the new offsets only (the default)")
    ap.add_argument("--execute", action="store_true", help="set the new offsets")
    ap.add_argument("--members", action="store_true", help="with --describe: the group's members")
    ap.add_argument("--offsets", action="store_true", help="with --describe: start offsets and lag (the default)")
    ap.add_argument("--verbose", action="store_true", help="with --members: epochs; with --state: the group's epochs")
    ap.add_argument("--state", nargs="?", const="", default=None, metavar="S,S",
                    help="with --describe: the group's state; with --list: states (filtered by S,S)")
    ap.add_argument("--timeout", type=ranged_int(1, 2**31 - 1), default=5000, metavar="MS",
                    help="how long to wait for the cluster (ms, default 5000)")
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    if sum((a.list, a.describe, a.reset_offsets, a.delete, a.delete_offsets)) != 1:
        ap.error("Command must include exactly one action: --list, --describe, --reset-offsets, --delete, "
                 "--delete-offsets")
    if a.topic and not (a.reset_offsets or a.delete_offsets):
        ap.error("Option --topic is only allowed with --reset-offsets and --delete-offsets")
    reset_args = a.all_topics or a.to_earliest or a.to_latest or a.to_datetime is not None or a.dry_run or a.execute
    if reset_args and not a.reset_offsets:
        ap.error("--all-topics, reset scenarios, --dry-run and --execute are only allowed with --reset-offsets")
    if a.delete and not (a.group or a.all_groups):
        ap.error("Option --delete takes one of these options: --all-groups, --group")
    if a.delete_offsets and (not a.group or len(a.group) != 1 or not a.topic or a.all_groups):
        ap.error("Option --delete-offsets takes the following options: --group (one), --topic")
    if a.reset_offsets:
        if not a.group or len(a.group) != 1 or a.all_groups:
            ap.error("Option --reset-offsets takes one --group")
        if sum((a.to_earliest, a.to_latest, a.to_datetime is not None)) != 1:
            ap.error("Option --reset-offsets requires one of the following scenarios: --to-datetime, --to-earliest, "
                     "--to-latest")
        if bool(a.topic) == a.all_topics:
            ap.error("One of the reset scopes should be defined: --all-topics, --topic.")
        if a.dry_run and a.execute:
            ap.error("Option --reset-offsets only accepts one of --execute and --dry-run")
    if (a.group or a.all_groups) and a.list:
        ap.error("Option --group/--all-groups can't be used with --list")
    if a.group and a.all_groups:
        ap.error("Option --group can't be used with --all-groups")
    if a.describe:
        if not (a.group or a.all_groups):
            ap.error("Option --describe takes one of these options: --all-groups, --group")
        if a.state:
            ap.error("Option --describe does not take a value for --state")
        if sum((a.members, a.offsets, a.state is not None)) > 1:
            ap.error("Option --describe takes at most one of these options: --members, --offsets, --state")
        if a.verbose and not (a.members or a.state is not None):
            ap.error("Option --verbose is only allowed with --members or --state")
    if (a.members or a.offsets or a.verbose) and not a.describe:
        ap.error("Options --members, --offsets and --verbose are only allowed with --describe")


async def run(a: argparse.Namespace) -> None:
    async with admin_for(a, a.timeout / 1000) as admin, Brokers(admin) as brokers:
        action = (list_action if a.list else describe_action if a.describe else reset_action if a.reset_offsets
                  else delete_action if a.delete else delete_offsets_action)
        await action(brokers, a)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    check_args(ap, a)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
