"""Produce gateways (KIP-1164, "Reducing multi-DC commit operations"): for each diskless
coordinator, the brokers of each rack that producers in that rack are sent to for the
coordinator's partitions. A broker then holds in its WAL files only the partitions of the
coordinators it is a gateway for, so committing a file takes few commit requests (one when the
cluster has enough brokers).

KIP-1164's count, max(1, n_brokers / n_coordinators / n_racks) gateways per coordinator per rack,
comes out of dealing each rack's brokers round-robin over the coordinators. Co-located
coordinators (led by the same broker) are dealt as one group, so their gateways are co-located
too: a gateway's file then needs one commit request per coordinator *broker* it serves. A
coordinator's own broker is the gateway of its group in its rack (its commit is a call, not a
request). "Rack" is `broker.rack` (brokers without one share the rack None); "DC" in KIP-1164 is a
diskless coordinator, one partition of `__diskless_metadata`.

Pure functions over the metadata image's facts: every broker computes the same table.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

Rack = str | None


def gateway_table(broker_racks: Mapping[int, Rack],
                  coordinator_leaders: Mapping[int, int]) -> dict[tuple[Rack, int], list[int]]:
    """(rack, coordinator) -> its gateway brokers in that rack (sorted), for every rack with a
    live broker. `broker_racks`: live broker id -> rack; `coordinator_leaders`: coordinator
    (metadata partition) -> the broker leading it, -1 when none."""
    # a group: the coordinators one broker leads (a leaderless coordinator is a group alone)
    groups: dict[int, list[int]] = {}
    for index, leader in sorted(coordinator_leaders.items()):
        groups.setdefault(leader if leader >= 0 else -1 - index, []).append(index)
    order = sorted(groups)
    racks: dict[Rack, list[int]] = {}
    for b in sorted(broker_racks):
        racks.setdefault(broker_racks[b], []).append(b)
    table: dict[tuple[Rack, int], list[int]] = {}
    for rack, brokers in racks.items():
        load = dict.fromkeys(brokers, 0)
        gateways: dict[int, list[int]] = {g: [] for g in order}
        # a coordinator's broker serves its own group in its rack
        for g in order:
            if g in load:
                gateways[g].append(g)
                load[g] += 1
        # every other group takes the least loaded broker of the rack
        for g in order:
            if not gateways[g]:
                b = min(brokers, key=lambda x: (load[x], x))
                gateways[g].append(b)
                load[b] += 1
        # brokers left over join the group with the fewest gateways
        for b in brokers:
            if load[b] == 0 and order:
                g = min(order, key=lambda x: (len(gateways[x]), order.index(x)))
                gateways[g].append(b)
                load[b] += 1
        for g in order:
            for index in groups[g]:
                table[(rack, index)] = sorted(gateways[g])
    return table


def client_rack(racks: list[Rack], wanted: Rack, client_id: str) -> Rack:
    """The rack whose gateways serve a client: its own when a live broker has it, else one chosen
    by a stable hash of the client id (so clients without a rack spread over the racks)."""
    if wanted in racks:
        return wanted
    ordered = sorted(racks, key=lambda r: (r is None, r or ""))
    return ordered[zlib.crc32(client_id.encode()) % len(ordered)]


def pick(gateways: list[int], client_id: str) -> list[int]:
    """The gateways in the order a client should use them: one chosen by a stable hash of the
    client id (clients spread over a coordinator's gateways), then the others."""
    first = gateways[zlib.crc32(client_id.encode()) % len(gateways)]
    return [first, *(g for g in gateways if g != first)]
