"""A consumer's Fetch request, as Strata's own readers send it (the ordered consumer, the console
consumer, the Spark source's range reader): no fetch session, topics by name, each partition
from its position."""

from __future__ import annotations

from collections.abc import Mapping

from protocol.generated.fetch import FetchRequest

FETCH_VERSION = 12  # topic names (not ids), last stable offset, aborted transactions, preferred_read_replica


def fetch_request(positions: Mapping[tuple[str, int], int], *, isolation_level: int, max_bytes: int,
                  partition_max_bytes: int, max_wait_ms: int = 500) -> FetchRequest:
    R = FetchRequest
    topics: dict[str, list] = {}
    for (t, p), offset in positions.items():
        topics.setdefault(t, []).append(R.FetchPartition(
            partition=p, current_leader_epoch=-1, fetch_offset=offset, last_fetched_epoch=-1, log_start_offset=-1,
            partition_max_bytes=partition_max_bytes))
    return R(replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
             isolation_level=isolation_level, session_id=0, session_epoch=-1,
             topics=[R.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
             forgotten_topics_data=[], rack_id="")
