"""The cluster id check every quorum request passes first (Vote, BeginQuorumEpoch,
EndQuorumEpoch, Fetch, FetchSnapshot: KIP-595), and the log line a refusal leaves.

A refusal is logged with both ids, since two voters formatted with different ids otherwise only
lose elections forever; once per peer and API per interval, as the peer retries every few
hundred milliseconds."""

from __future__ import annotations

import time

import structlog

log = structlog.get_logger(__name__)

LOG_INTERVAL_S = 30.0


class ClusterIdCheck:
    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: dict[tuple[str, int], float] = {}
        self.refused = 0

    def refuses(self, api: str, peer: int, theirs: str | None, ours: str) -> bool:
        """True (and logged, rate-limited) when a request names a cluster id other than ours;
        a request without one (an older version) is served, as Kafka does."""
        if theirs is None or theirs == ours:
            return False
        self.refused += 1
        now = time.monotonic()
        key = (api, peer)
        if now - self._last.get(key, -self.interval_s) >= self.interval_s:
            self._last[key] = now
            log.error("raft_request_refused", error="INCONSISTENT_CLUSTER_ID", api=api, peer=peer,
                      peer_cluster_id=theirs, cluster_id=ours, refused_total=self.refused,
                      hint="every voter must be formatted with one cluster.id (kafka-storage.sh format -t ID)")
        return True
