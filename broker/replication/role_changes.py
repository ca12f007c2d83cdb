"""The log lines of replicas changing role (leader, follower) as a metadata delta is applied.

Kafka logs one line a partition. A delta of a few partitions still does; a bulk one (a restart,
or a fence or unfence of this broker, gives thousands at once) logs one summary line, with the
first partitions named, and the per-partition lines at debug: 20,000 lines cost the event loop
about half a second at a restart and tell an operator nothing a count does not.
"""

from __future__ import annotations

from typing import Any

import structlog

from broker.replication.partition import Partition

log = structlog.get_logger(__name__)

BULK = 100  # partitions in a delta beyond which the lines are summed up
NAMED = 5  # partitions named in a summary line, per role


class RoleChanges:
    def __init__(self, partitions_in_delta: int = 0) -> None:
        self.bulk = partitions_in_delta > BULK
        self.counts = {"leader": 0, "follower": 0}
        self.named: dict[str, list[str]] = {"leader": [], "follower": []}

    def record(self, p: Partition, change: str | None) -> None:
        """`change` as Partition.update returned it."""
        if change is None:
            return
        info = p.info
        assert info is not None
        if change == "leader":
            fields: dict[str, Any] = {"epoch": info.leader_epoch, "isr": list(info.isr),
                                      "log_end_offset": p.log.log_end_offset}
        else:
            fields = {"leader": info.leader, "epoch": info.leader_epoch}
        if not self.bulk:
            log.info(f"became_{change}", topic=p.topic, partition=p.index, **fields)
            return
        log.debug(f"became_{change}", topic=p.topic, partition=p.index, **fields)
        self.counts[change] += 1
        if len(self.named[change]) < NAMED:
            self.named[change].append(f"{p.topic}-{p.index}")

    def summary(self, metadata_offset: int) -> None:
        """One line for a bulk delta's changes (none if it changed no role)."""
        if self.bulk and any(self.counts.values()):
            log.info("replica_roles_changed", became_leader=self.counts["leader"],
                     became_follower=self.counts["follower"], first_leaders=self.named["leader"],
                     first_followers=self.named["follower"], metadata_offset=metadata_offset)
