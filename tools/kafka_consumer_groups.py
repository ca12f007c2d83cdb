"""kafka-consumer-groups.sh for Strata: list, describe, delete consumer groups, reset and delete
their offsets, with the options and output of Kafka's ConsumerGroupCommand.

  --list [--state [S,S]] [--type [classic,consumer]]
  --describe (--group G ... | --all-groups) [--offsets (default) | --members [--verbose] | --state]
  --reset-offsets (--group G ... | --all-groups) (--topic T[:P,P] ... | --all-topics)
      (--to-earliest | --to-latest | --to-current | --to-offset N | --shift-by N |
       --to-datetime YYYY-MM-DDTHH:mm:SS.sss[zone] | --by-duration PnDTnHnMnS) [--dry-run | --execute] [--export]
  --reset-offsets (--group G ... | --all-groups) --from-file CSV [--dry-run | --execute] [--export]
  --delete (--group G ... | --all-groups)
  --delete-offsets --group G --topic T[:P,P] ...

Requests go where Kafka's AdminClient sends them: ListGroups to every broker, the group requests
to the group's coordinator, ListOffsets to partition leaders. Tables have Kafka's columns and
widths. Departures: errors and warnings go to stderr, one line, and exit 1 (Kafka prints errors on
stdout and mostly exits 0); `--members --verbose` prints each topic's partitions as
``topic(0,1)`` (Kafka's Scala tool; the Java port dropped the topic name). Bad arguments exit 2.

KIP-848 consumer groups are described with ConsumerGroupDescribe (a classic group answers
GROUP_ID_NOT_FOUND there and is described with DescribeGroups, as Kafka's admin falls back):
`--members --verbose` then shows each member's epoch and current assignment, and the target
epoch and assignment; `--state --verbose` the group and target assignment epochs.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from client.group import decode_assignment
from protocol.errors import Errors, error_message, error_name
from protocol.generated.consumer_group_describe import ConsumerGroupDescribeRequest
from protocol.generated.delete_groups import DeleteGroupsRequest
from protocol.generated.describe_groups import DescribeGroupsRequest
from protocol.generated.list_groups import ListGroupsRequest
from protocol.generated.offset_delete import OffsetDeleteRequest
from tools.admin import (
    INT64,
    AdminError,
    ToolArgumentParser,
    admin_for,
    broker_error,
    ranged_int,
    run_tool,
)
from tools.brokers import EARLIEST, LATEST, Brokers, Coordinator, TopicPartition, tp_str
from tools.group_offsets import OFFSET_FETCH_VERSION, offset_commit_request, offset_fetch_request, partition_results

MISSING = "-"
STATES = ["PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty", "Assigning", "Reconciling"]
DURATION = re.compile(r"(-)?P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", re.IGNORECASE)


# ---------------------------------------------------------------- what the cluster says
@dataclass
class Member:
    member_id: str
    instance_id: str
    client_id: str
    host: str
    assignment: list[TopicPartition]
    # KIP-848 members only
    epoch: int | None = None
    target: list[TopicPartition] | None = None


@dataclass
class Group:
    group_id: str
    state: str  # Kafka's ConsumerGroupState names; "Dead" for a group the coordinator does not know
    protocol: str  # the assignment strategy
    coordinator: Coordinator
    members: list[Member] = field(default_factory=list)
    type: str = "classic"
    group_epoch: int | None = None
    assignment_epoch: int | None = None


async def list_groups(brokers: Brokers) -> list[tuple[str, str]]:
    return [(g, s) for g, s, _ in await list_typed_groups(brokers)]


async def list_typed_groups(brokers: Brokers) -> list[tuple[str, str, str]]:
    """(group id, state, type) of every consumer group (ListGroups to each broker, as Kafka's
    admin): classic groups of the consumer protocol type and KIP-848 consumer groups."""
    await brokers.topics([])
    answers = await asyncio.gather(*(brokers.send(b, ListGroupsRequest(states_filter=[], types_filter=[]))
                                     for b in sorted(brokers.addresses)))
    out = {}
    for b, resp in zip(sorted(brokers.addresses), answers):
        if resp.error_code:
            raise broker_error(f"cannot list the groups of broker {b}", resp.error_code)
        for g in resp.groups:
            if g.protocol_type in ("consumer", ""):
                out[g.group_id] = (g.group_state, g.group_type or "classic")
    return sorted((g, s, t) for g, (s, t) in out.items())


async def describe_group(brokers: Brokers, group: str) -> Group:
    coordinator = await brokers.coordinator(group)
    cgd = await brokers.send_to(coordinator.host, coordinator.port,
                                ConsumerGroupDescribeRequest(group_ids=[group], include_authorized_operations=False))
    c = cgd.groups[0]
    if c.error_code == 0:
        def tps(a) -> list[TopicPartition]:  # noqa: ANN001 - a generated Assignment
            return sorted((t.topic_name, p) for t in a.topic_partitions for p in t.partitions)

        return Group(group, c.group_state, c.assignor_name, coordinator, [
            Member(m.member_id, m.instance_id or "", m.client_id, m.client_host, tps(m.assignment), m.member_epoch,
                   tps(m.target_assignment))
            for m in c.members
        ], "consumer", c.group_epoch, c.assignment_epoch)
    if c.error_code != Errors.GROUP_ID_NOT_FOUND:
        raise broker_error(f"cannot describe group '{group}'", c.error_code, c.error_message)
    resp = await brokers.send_to(coordinator.host, coordinator.port, DescribeGroupsRequest(groups=[group]))
    d = resp.groups[0]
    if d.error_code == Errors.GROUP_ID_NOT_FOUND:
        return Group(group, "Dead", "", coordinator)
    if d.error_code:
        raise broker_error(f"cannot describe group '{group}'", d.error_code, d.error_message)
    members = []
    for m in d.members:
        try:
            assigned = decode_assignment(bytes(m.member_assignment)) if d.protocol_type == "consumer" else []
        except Exception:  # noqa: BLE001 - a member's own bytes: show it without an assignment
            assigned = []
        members.append(Member(m.member_id, m.group_instance_id or "", m.client_id, m.client_host, sorted(assigned)))
    return Group(group, d.group_state or "Dead", d.protocol_data or "", coordinator, members)


async def committed_offsets(brokers: Brokers, group: str) -> dict[TopicPartition, int]:
    resp = await brokers.to_coordinator(group, offset_fetch_request(group, None), OFFSET_FETCH_VERSION)
    if resp.error_code and resp.error_code != Errors.GROUP_ID_NOT_FOUND:
        raise broker_error(f"cannot fetch the offsets of group '{group}'", resp.error_code)
    out = {}
    for tp, p in partition_results(resp):
        if p.error_code:
            raise broker_error(f"cannot fetch the offset of group '{group}' for {tp_str(tp)}", p.error_code)
        if p.committed_offset >= 0:
            out[tp] = p.committed_offset
    return out


def state_note(g: Group, rows: int) -> bool:
    """Kafka's shouldPrintMemberState: a notice for an empty or rebalancing group; False when
    there is nothing to print."""
    if g.state == "Dead":
        raise AdminError(f"Consumer group '{g.group_id}' does not exist.", Errors.GROUP_ID_NOT_FOUND)
    if g.state == "Empty":
        print(f"\nConsumer group '{g.group_id}' has no active members.", file=sys.stderr)
    elif g.state in ("PreparingRebalance", "CompletingRebalance"):
        print(f"\nWarning: Consumer group '{g.group_id}' is rebalancing.", file=sys.stderr)
    return rows > 0


def row_text(widths: Sequence[int | None], row: Sequence[object]) -> str:
    """Java's printf("%-Ns %-Ns ... %s"): each column left-aligned to its width (None: as is)."""
    return " ".join(str(v) if w is None else f"{v!s:<{w}}" for w, v in zip(widths, row))


def table(widths: Sequence[int | None], rows: Sequence[Sequence[object]]) -> str:
    """Kafka's tables: every line, the header's too, starts with a newline."""
    return "".join("\n" + row_text(widths, r) for r in rows)


# ---------------------------------------------------------------- --list
async def list_action(brokers: Brokers, a: argparse.Namespace) -> None:
    typed = await list_typed_groups(brokers)
    kinds = {g: t for g, _, t in typed}
    groups = [(g, s) for g, s, _ in typed]
    if a.state is None and a.type is None:
        for g, _ in groups:
            print(g)
        return
    wanted = {s.lower() for s in (a.state or "").split(",") if s}
    unknown = wanted - {s.lower() for s in STATES}
    if unknown:
        raise AdminError(f"Invalid state list '{a.state}'. Valid states are: {', '.join(STATES)}")
    types = {t.lower() for t in (a.type or "").split(",") if t}
    if types - {"classic", "consumer"}:
        raise AdminError(f"Invalid types list '{a.type}'. Valid types are: classic, consumer")
    shown = [(g, s) for g, s in groups if (not wanted or s.lower() in wanted) and (not types or kinds[g] in types)]
    width = max([15, *(len(g) for g, _ in shown)]) + 10
    header, cols = ["GROUP"], [width]
    if a.type is not None:
        header.append("TYPE")
        cols.append(20)
    if a.state is not None:
        header.append("STATE")
        cols.append(20)
    rows = [header] + [[g] + ([kinds[g].capitalize()] if a.type is not None else []) +
                       ([s] if a.state is not None else []) for g, s in shown]
    print("\n".join(row_text(cols, r) for r in rows))


# ---------------------------------------------------------------- --describe
async def describe_action(brokers: Brokers, a: argparse.Namespace) -> None:
    groups = [g for g, _ in await list_groups(brokers)] if a.all_groups else a.group
    for gid in sorted(set(groups)):
        g = await describe_group(brokers, gid)
        if a.members:
            print_members(g, a.verbose)
        elif a.state is not None:
            print_state(g, a.verbose)
        else:
            await print_offsets(brokers, g)


async def print_offsets(brokers: Brokers, g: Group) -> None:
    committed = await committed_offsets(brokers, g.group_id) if g.state != "Dead" else {}
    rows: list[list[object]] = []
    assigned: set[TopicPartition] = set()
    owners: list[tuple[Member | None, list[TopicPartition]]] = []  # None: partitions no member owns
    for member in sorted((m for m in g.members if m.assignment), key=lambda m: -len(m.assignment)):
        owners.append((member, member.assignment))
        assigned.update(member.assignment)
    rest = sorted(tp for tp in committed if tp not in assigned)
    tps = sorted(assigned | set(rest))
    ends = await log_end_offsets(brokers, tps)
    for m, tps_of in owners + ([(None, rest)] if rest else []):
        for tp in tps_of:
            off = committed.get(tp)
            end = ends.get(tp)
            lag = end - off if off is not None and end is not None else None
            rows.append([g.group_id, tp[0], tp[1], show(off), show(end), show(lag),
                         m.member_id if m else MISSING, m.host if m else MISSING, m.client_id if m else MISSING])
    if not state_note(g, len(rows)):
        return
    w = [max([15, *(len(str(r[i])) for r in rows)]) for i in (0, 1, 6, 7)]
    header = ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
              "CLIENT-ID"]
    print(table([w[0], w[1], 10, 15, 15, 15, w[2], w[3], None], [header, *rows]))


def show(v: object) -> object:
    return MISSING if v is None else v


async def log_end_offsets(brokers: Brokers, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Each partition's log end offset (the high watermark); a partition that is gone or has no
    leader shows "-", as Kafka's Unknown."""
    if not tps:
        return {}
    answers = await brokers.list_offsets(dict.fromkeys(tps, LATEST))
    return {tp: a.offset for tp, a in answers.items() if not a.error_code}


def print_members(g: Group, verbose: bool) -> None:
    state_note(g, len(g.members))  # Kafka prints the header even for a group without members
    with_instance = any(m.instance_id for m in g.members)
    w = {
        "g": max([15, *(len(g.group_id) for _ in g.members)]),
        "c": max([15, *(len(m.member_id) for m in g.members)]),
        "i": max([17, *(len(m.instance_id) for m in g.members)]),
        "h": max([15, *(len(m.host) for m in g.members)]),
        "cl": max([15, *(len(m.client_id) for m in g.members)]),
    }
    cols = [w["g"], w["c"], *([w["i"]] if with_instance else []), w["h"], w["cl"], 15]
    header = ["GROUP", "CONSUMER-ID", *(["GROUP-INSTANCE-ID"] if with_instance else []), "HOST", "CLIENT-ID",
              "#PARTITIONS"]
    if verbose and g.type == "consumer":
        # Kafka 4's columns for a KIP-848 group: epochs and the current and target assignments
        w["a"] = max([18, *(len(assignment_text(m.assignment)) for m in g.members)])
        lines = [row_text([*cols, 15, w["a"], 15], [*header, "CURRENT-EPOCH", "CURRENT-ASSIGNMENT", "TARGET-EPOCH"])
                 + " TARGET-ASSIGNMENT"]
        for m in g.members:
            row = [g.group_id, m.member_id, *([m.instance_id] if with_instance else []), m.host, m.client_id,
                   len(m.assignment), m.epoch, assignment_text(m.assignment), g.assignment_epoch]
            lines.append(row_text([*cols, 15, w["a"], 15], row) + " " + assignment_text(m.target or []))
        print("\n" + "\n".join(lines))
        return
    lines = [row_text(cols, header) + " " + ("ASSIGNMENT" if verbose else "")]
    for m in g.members:
        row = [g.group_id, m.member_id, *([m.instance_id] if with_instance else []), m.host, m.client_id,
               len(m.assignment)]
        lines.append(row_text(cols, row) + " " + (assignment_text(m.assignment) if verbose else ""))
    print("\n" + "\n".join(lines))


def assignment_text(tps: list[TopicPartition]) -> str:
    if not tps:
        return MISSING
    by_topic: dict[str, list[int]] = {}
    for t, p in tps:
        by_topic.setdefault(t, []).append(p)
    return ", ".join(sorted(f"{t}({','.join(map(str, sorted(ps)))})" for t, ps in by_topic.items()))


def print_state(g: Group, verbose: bool = False) -> None:
    state_note(g, 1)
    c = g.coordinator
    coordinator = f"{c.host}:{c.port}  ({c.node_id})"
    width = max(25, len(coordinator))
    if verbose:
        rows: list[list[object]] = [
            ["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "GROUP-EPOCH", "TARGET-ASSIGNMENT-EPOCH",
             "#MEMBERS"],
            [g.group_id, coordinator, g.protocol, g.state, show(g.group_epoch), show(g.assignment_epoch),
             len(g.members)]]
        print(table([width, 25, 20, 15, 15, 25, None], rows))
        return
    rows = [["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
            [g.group_id, coordinator, g.protocol, g.state, len(g.members)]]
    print(table([width, 25, 20, 15, None], rows))


# ---------------------------------------------------------------- --reset-offsets
async def reset_action(brokers: Brokers, a: argparse.Namespace) -> None:
    groups = [g for g, _ in await list_groups(brokers)] if a.all_groups else list(dict.fromkeys(a.group))
    plans: dict[str, dict[TopicPartition, int]] = {}
    for gid in groups:
        g = await describe_group(brokers, gid)
        if g.state not in ("Empty", "Dead"):
            raise AdminError(f"Assignments can only be reset if the group '{gid}' is inactive, but the current state "
                             f"is {g.state}.", Errors.NON_EMPTY_GROUP)
        tps = await partitions_to_reset(brokers, gid, a)
        plans[gid] = await new_offsets(brokers, gid, tps, a)
    if a.execute:
        for gid, plan in plans.items():
            await commit(brokers, gid, plan)
    if a.export:
        one = len(groups) == 1 and not a.all_groups
        print("".join(f"{'' if one else gid + ','}{t},{p},{off}\n"
                      for gid, plan in plans.items() for (t, p), off in sorted(plan.items())))
        return
    rows = [[gid, t, p, off] for gid, plan in plans.items() for (t, p), off in sorted(plan.items())]
    if rows:
        print(table([30, 30, 10, 15], [["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], *rows]), end="")
    print()


async def partitions_to_reset(brokers: Brokers, group: str, a: argparse.Namespace) -> list[TopicPartition]:
    if a.from_file is not None and not (a.all_topics or a.topic):
        return []  # as Kafka: the file names the partitions
    if a.all_topics:
        return sorted(await committed_offsets(brokers, group))
    whole = [t for t in a.topic if ":" not in t]
    out = set(await brokers.partitions_of(whole)) if whole else set()
    named = [parse_topic_partitions(t) for t in a.topic if ":" in t]
    if named:
        known = set(await brokers.partitions_of({t for t, _ in named}))
        for topic, parts in named:
            for p in parts:
                if (topic, p) not in known:
                    raise AdminError(f"partition {topic}-{p} does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
                out.add((topic, p))
    return sorted(out)


def parse_topic_partitions(arg: str) -> tuple[str, list[int]]:
    topic, _, parts = arg.partition(":")
    try:
        return topic, [int(p) for p in parts.split(",")]
    except ValueError:
        raise AdminError(f"Invalid topic arg '{arg}', expected topic name and partitions") from None


async def new_offsets(brokers: Brokers, group: str, tps: list[TopicPartition], a: argparse.Namespace
                      ) -> dict[TopicPartition, int]:
    if a.from_file is not None:
        return await plan_from_file(brokers, group, a.reset_plan, a.from_file)
    if not tps:
        return {}
    if a.to_earliest:
        return await brokers.offsets(tps, EARLIEST)
    if a.to_latest:
        return await brokers.offsets(tps, LATEST)
    if a.to_offset is not None:
        return await clamp(brokers, dict.fromkeys(tps, a.to_offset))
    if a.shift_by is not None or a.to_current:
        current = await committed_offsets(brokers, group)
        if a.to_current:  # a partition without a commit goes to its end, as Kafka
            ends = await brokers.offsets([tp for tp in tps if tp not in current], LATEST) if any(
                tp not in current for tp in tps) else {}
            return {tp: current[tp] if tp in current else ends[tp] for tp in tps}
        for tp in tps:
            if tp not in current:
                raise AdminError(f"Cannot shift offset for partition {tp_str(tp)} since there is no current "
                                 "committed offset")
        return await clamp(brokers, {tp: current[tp] + a.shift_by for tp in tps})
    stamp = a.to_datetime if a.to_datetime is not None else int(time.time() * 1000) - a.by_duration
    answers = await brokers.list_offsets(dict.fromkeys(tps, stamp))
    out, empty = {}, []
    for tp, ans in answers.items():
        if ans.error_code:
            raise broker_error(f"Error getting offset by timestamp of topic partition: {tp_str(tp)}", ans.error_code)
        if ans.offset < 0:
            print(f"Warn: Partition {tp[1]} from topic {tp[0]} is empty. Falling back to latest known offset.",
                  file=sys.stderr)
            empty.append(tp)
        else:
            out[tp] = ans.offset
    if empty:
        out.update(await brokers.offsets(empty, LATEST))
    return out


def parse_reset_plan(path: str, single_group: str | None) -> dict[str, dict[TopicPartition, int]]:
    """Kafka's reset CSV: "topic,partition,offset" lines when one --group is given and the first
    line has that form, else "group,topic,partition,offset" lines. group -> partition -> offset."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f.read().split("\n")]
    except OSError as e:
        raise AdminError(f"cannot read {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise AdminError(f"{path} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    lines = [line for line in lines if line]
    no_group = single_group is not None and bool(lines) and _csv_row(lines[0], 3) is not None
    plan: dict[str, dict[TopicPartition, int]] = {}
    for n, line in enumerate(lines, 1):
        row = _csv_row(line, 3 if no_group else 4)
        if row is None:
            three = no_group or (single_group is not None and line.count(",") != 3)
            form = "topic,partition,offset" if three else "group,topic,partition,offset"
            shown = line if len(line) <= 60 else line[:60] + "..."
            raise AdminError(f"{path} line {n}: '{shown}' is not {form} (a partition and an offset are "
                             "non-negative integers)")
        group = single_group if no_group and single_group is not None else row[0]
        topic, partition, offset = row[-3:]
        plan.setdefault(group, {})[(topic, int(partition))] = int(offset)
    return plan


def _csv_row(line: str, fields: int) -> list[str] | None:
    parts = line.split(",")
    if len(parts) != fields or not all(parts[:-2]):
        return None
    partition, offset = parts[-2:]
    if not (partition.isdigit() and offset.isdigit() and len(partition) <= 10 and len(offset) <= 19
            and int(partition) <= 2**31 - 1 and int(offset) <= INT64[1]):
        return None
    return parts


async def plan_from_file(brokers: Brokers, group: str, plans: dict[str, dict[TopicPartition, int]], path: str
                         ) -> dict[TopicPartition, int]:
    wanted = plans.get(group)
    if wanted is None:
        raise AdminError(f"No reset plan for group {group} found in {path}")
    known = set(await brokers.partitions_of({t for t, _ in wanted}))
    for tp in sorted(wanted):
        if tp not in known:
            raise AdminError(f"partition {tp_str(tp)} does not exist", Errors.UNKNOWN_TOPIC_OR_PARTITION)
    return await clamp(brokers, wanted)


async def clamp(brokers: Brokers, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Kafka's checkOffsetsRange: an offset past the end goes to the end, one before the start
    to the start."""
    starts = await brokers.offsets(wanted, EARLIEST)
    ends = await brokers.offsets(wanted, LATEST)
    return {tp: min(max(off, starts[tp]), ends[tp]) for tp, off in wanted.items()}


async def commit(brokers: Brokers, group: str, plan: dict[TopicPartition, int]) -> None:
    if not plan:
        return
    resp = await brokers.to_coordinator(group, offset_commit_request(group, plan))
    for tp, p in partition_results(resp):
        if p.error_code:
            raise broker_error(f"cannot commit the offset of group '{group}' for {tp_str(tp)}", p.error_code)


# ---------------------------------------------------------------- --delete, --delete-offsets
async def delete_action(brokers: Brokers, a: argparse.Namespace) -> None:
    groups = [g for g, _ in await list_groups(brokers)] if a.all_groups else list(dict.fromkeys(a.group))
    await delete_groups(brokers, groups, "consumer groups", "Group")


async def delete_groups(brokers: Brokers, groups: list[str], kind: str, one: str) -> None:
    """DeleteGroups of each group at its coordinator, reported as Kafka's group tools do:
    `kind` names the groups in the summary lines ("consumer groups"), `one` a group in a failure
    line ("Group")."""
    ok, failed = [], []
    for gid in groups:
        resp = await brokers.to_coordinator(gid, DeleteGroupsRequest(groups_names=[gid]))
        code = resp.results[0].error_code
        (failed.append((gid, code)) if code else ok.append(gid))
    if not failed:
        print(f"Deletion of requested {kind} ('{', '.join(ok)}') was successful.")
        return
    for gid, code in failed:
        print(f"* {one} '{gid}' could not be deleted due to: {error_name(code)}: {error_message(code)}")
    if ok:
        print(f"\nThese {kind} were deleted successfully: '{', '.join(ok)}'")
    raise AdminError(f"Deletion of some {kind} failed", failed[0][1])


async def delete_offsets_action(brokers: Brokers, a: argparse.Namespace) -> None:
    gid = a.group[0]
    tps: set[TopicPartition] = set()
    for arg in a.topic:
        if ":" in arg:
            topic, parts = parse_topic_partitions(arg)
            tps.update((topic, p) for p in parts)
        else:
            tps.update(await brokers.partitions_of([arg]))
    R = OffsetDeleteRequest
    by_topic: dict[str, list] = {}
    for t, p in sorted(tps):
        by_topic.setdefault(t, []).append(R.OffsetDeleteRequestPartition(partition_index=p))
    resp = await brokers.to_coordinator(gid, R(group_id=gid, topics=[R.OffsetDeleteRequestTopic(name=t, partitions=ps)
                                                                     for t, ps in by_topic.items()]))
    top = resp.error_code
    if top == Errors.GROUP_ID_NOT_FOUND:
        raise AdminError(f"'{gid}' does not exist.", top)
    if top == Errors.NON_EMPTY_GROUP:
        raise AdminError(f"Deleting offsets of a consumer group '{gid}' is forbidden if the group is not empty.", top)
    if top == Errors.INVALID_GROUP_ID:
        raise AdminError(f"'{gid}' is not valid.", top)
    if top:
        raise broker_error("Encounter some unknown error", top)
    results = {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}
    failed = {tp: code for tp, code in results.items() if code}
    if not failed:
        print(f"Request succeed for deleting offsets with topic {', '.join(a.topic)} group {gid}")
    rows = [[t, p, f"Error: :{error_message(code)}" if code else "Successful"]
            for (t, p), code in sorted(results.items(), key=lambda kv: kv[0][0] + str(kv[0][1]))]
    print(table([30, 15, 15], [["TOPIC", "PARTITION", "STATUS"], *rows]))
    if failed:
        raise AdminError("Encounter some partition level error, see the details above", next(iter(failed.values())))


# ---------------------------------------------------------------- arguments
def parse_datetime(value: str) -> int:
    """Kafka's 'YYYY-MM-DDTHH:mm:SS.sss' with an optional zone (Z, +hh:mm); local time without one."""
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Error parsing timestamp '{value[:40]}': expected 'YYYY-MM-DDTHH:mm:SS.sss' with an optional zone") from None
    return int(dt.timestamp() * 1000)


def parse_duration(value: str) -> int:
    """ISO-8601 PnDTnHnMnS -> milliseconds."""
    m = DURATION.fullmatch(value)
    if not m or not any(m.groups()[1:]):
        raise argparse.ArgumentTypeError(f"Error parsing duration '{value[:40]}': expected PnDTnHnMnS")
    sign, d, h, mi, s = m.groups()
    ms = int((int(d or 0) * 86400 + int(h or 0) * 3600 + int(mi or 0) * 60 + float(s or 0)) * 1000)
    return -ms if sign else ms


def build_parser() -> ToolArgumentParser:
    ap = ToolArgumentParser(prog="kafka-consumer-groups.sh", description="List, describe, delete consumer groups "
                            "and reset or delete their offsets.")
    ap.add_argument("--bootstrap-server", required=True, metavar="HOST:PORT[,...]", help="brokers to connect to")
    ap.add_argument("--group", action="append", help="the consumer group (repeatable)")
    ap.add_argument("--all-groups", action="store_true", help="every consumer group")
    ap.add_argument("--topic", action="append", help="a topic, or TOPIC:P,P (reset-offsets, delete-offsets)")
    ap.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for (reset-offsets)")
    for action, text in (("list", "list all consumer groups"), ("describe", "describe groups and their lag"),
                         ("delete", "delete groups"), ("reset-offsets", "reset the offsets of inactive groups"),
                         ("delete-offsets", "delete the offsets of a group")):
        ap.add_argument(f"--{action}", action="store_true", help=text)
    ap.add_argument("--members", action="store_true", help="with --describe: the group's members")
    ap.add_argument("--verbose", action="store_true",
                    help="with --members: each member's partitions (and epochs); with --state: the group's epochs")
    ap.add_argument("--offsets", action="store_true", help="with --describe: offsets and lag (the default)")
    ap.add_argument("--state", nargs="?", const="", default=None, metavar="S,S",
                    help="with --describe: the group's state; with --list: states (filtered by S,S)")
    ap.add_argument("--type", nargs="?", const="", default=None, metavar="T,T", help="with --list: group types")
    ap.add_argument("--dry-run", action="store_true", help="show the new offsets only (the default)")
    ap.add_argument("--execute", action="store_true", help="commit the new offsets")
    ap.add_argument("--export", action="store_true", help="print the new offsets as CSV")
    scen = ap.add_mutually_exclusive_group()
    scen.add_argument("--to-earliest", action="store_true", help="to the earliest offset")
    scen.add_argument("--to-latest", action="store_true", help="to the latest offset")
    scen.add_argument("--to-current", action="store_true", help="to the committed offset")
    scen.add_argument("--to-offset", type=ranged_int(0, INT64[1]), help="to this offset")
    scen.add_argument("--shift-by", type=ranged_int(*INT64), help="the committed offset plus N (may be negative)")
    scen.add_argument("--to-datetime", type=parse_datetime, metavar="YYYY-MM-DDTHH:mm:SS.sss",
                      help="to the first offset at or after this time")
    scen.add_argument("--by-duration", type=parse_duration, metavar="PnDTnHnMnS",
                      help="to the first offset at or after now minus this duration")
    scen.add_argument("--from-file", metavar="CSV",
                      help="to the offsets of a CSV file (topic,partition,offset or group,topic,partition,offset "
                      "lines, as --export writes them)")
    ap.add_argument("--timeout", type=ranged_int(1, 2**31 - 1), default=5000, metavar="MS",
                    help="how long to wait for the cluster (ms, default 5000)")
    return ap


def check_args(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    actions = [x for x in ("list", "describe", "delete", "reset_offsets", "delete_offsets") if getattr(a, x)]
    if len(actions) != 1:
        ap.error("Command must include exactly one action: --list, --describe, --delete, --reset-offsets, "
                 "--delete-offsets")
    if a.group and a.all_groups:
        ap.error("Option --group can't be used with --all-groups")
    if (a.group or a.all_groups) and a.list:
        ap.error("Option --group/--all-groups can't be used with --list")
    if a.topic and not (a.reset_offsets or a.delete_offsets):
        ap.error("Option --topic is only allowed with --reset-offsets and --delete-offsets")
    if (a.members or a.offsets or a.verbose) and not a.describe:
        ap.error("Options --members, --offsets and --verbose are only allowed with --describe")
    if a.type is not None and not a.list:
        ap.error("Option --type is only allowed with --list")
    if a.state is not None and not (a.list or a.describe):
        ap.error("Option --state is only allowed with --describe and --list")
    scenario = (a.to_earliest or a.to_latest or a.to_current or a.to_offset is not None or a.shift_by is not None
                or a.to_datetime is not None or a.by_duration is not None or a.from_file is not None)
    if (scenario or a.all_topics or a.dry_run or a.execute or a.export) and not a.reset_offsets:
        ap.error("reset scenarios, --all-topics, --dry-run, --execute and --export are only allowed with "
                 "--reset-offsets")
    if a.describe:
        if not (a.group or a.all_groups):
            ap.error("Option --describe takes one of these options: --all-groups, --group")
        if sum((a.members, a.offsets, a.state is not None)) > 1:
            ap.error("Option --describe takes at most one of these options: --members, --offsets, --state")
        if a.state:
            ap.error("Option --describe does not take a value for --state")
        if a.verbose and not (a.members or a.state is not None):
            ap.error("Option --verbose is only allowed with --members or --state")
    if a.delete and not (a.group or a.all_groups):
        ap.error("Option --delete takes one of these options: --all-groups, --group")
    if a.delete_offsets and (not a.group or not a.topic or len(a.group) != 1):
        ap.error("Option --delete-offsets takes the following options: --group (one), --topic")
    if a.reset_offsets:
        if a.dry_run and a.execute:
            ap.error("Option --reset-offsets only accepts one of --execute and --dry-run")
        if not (a.group or a.all_groups):
            ap.error("Option --reset-offsets takes one of these options: --all-groups, --group")
        if not scenario:
            ap.error("Option --reset-offsets requires one of the following scenarios: --to-datetime, --by-duration, "
                     "--to-earliest, --to-latest, --shift-by, --from-file, --to-current, --to-offset")
        if a.topic and a.all_topics or (a.from_file is None and not (a.topic or a.all_topics)):
            ap.error("One of the reset scopes should be defined: --all-topics, --topic.")
        if not (a.dry_run or a.execute):
            print("WARN: No action will be performed as the --execute option is missing. "
                  "Add --dry-run to keep this behaviour without the warning.", file=sys.stderr)


async def run(a: argparse.Namespace) -> None:
    action = (list_action if a.list else describe_action if a.describe else delete_action if a.delete
              else reset_action if a.reset_offsets else delete_offsets_action)
    if a.from_file is not None:  # a bad file fails the same way with or without a cluster
        a.reset_plan = parse_reset_plan(a.from_file, a.group[0] if a.group and len(a.group) == 1 else None)
    async with admin_for(a, a.timeout / 1000) as admin, Brokers(admin) as brokers:
        await action(brokers, a)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_tool_args(argv)
    check_args(ap, a)
    return run_tool(run(a))


if __name__ == "__main__":
    sys.exit(main())
