"""The broker's metrics: per-topic traffic counters kept on the request path, and gauges read
from the replica manager and log dirs when /metrics is scraped (node/metrics.py serves them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.storage.log import FLUSH_TIMES_MS
from node.file_sender import STATS as SEND_STATS
from node.metrics import Family

if TYPE_CHECKING:
    from broker.replication.isr import IsrManager
    from broker.replication.replica_manager import ReplicaManager


class TopicCounters:
    __slots__ = ("messages_in", "bytes_in", "bytes_out")

    def __init__(self) -> None:
        self.messages_in = 0
        self.bytes_in = 0
        self.bytes_out = 0


class TopicStats:
    """Kafka's BrokerTopicStats: counted per topic per batch (one dict lookup per partition of a
    request), summed over topics at scrape time for the broker-wide series."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicCounters] = {}
        self.replication_bytes_out = 0  # follower fetches (Kafka's ReplicationBytesOutPerSec)

    def of(self, topic: str) -> TopicCounters:
        c = self.topics.get(topic)
        if c is None:
            c = self.topics[topic] = TopicCounters()
        return c

    def produced(self, topic: str, messages: int, size: int) -> None:
        c = self.of(topic)
        c.messages_in += messages
        c.bytes_in += size

    def fetched(self, topic: str | None, size: int, replica_id: int) -> None:
        if replica_id >= 0:
            self.replication_bytes_out += size
        elif topic:
            self.of(topic).bytes_out += size

    def families(self) -> list[Family]:
        prefix = "kafka_server_brokertopicmetrics_"
        fams = {
            "messages_in": Family(prefix + "messagesin_total", "counter", "Records appended as leader."),
            "bytes_in": Family(prefix + "bytesin_total", "counter", "Record batch bytes appended as leader."),
            "bytes_out": Family(prefix + "bytesout_total", "counter", "Record bytes sent to consumers."),
        }
        for topic, c in sorted(self.topics.items()):
            for attr, f in fams.items():
                f.add(getattr(c, attr), {"topic": topic})
        for attr, f in fams.items():  # the broker-wide series, as Kafka's JMX bean without a topic
            f.add(sum(getattr(c, attr) for c in self.topics.values()))
        repl = Family(prefix + "replicationbytesout_total", "counter", "Record bytes sent to followers.")
        return [*fams.values(), repl.add(self.replication_bytes_out)]


class ChunkReadCounts:
    """Consumer reads of inactive chunks (broker/replication/chunk_reads.py): served from a local
    chunk replica, redirected to another replica (KIP-392), or read from one on the client's behalf."""

    def __init__(self) -> None:
        self.reads: dict[tuple[str, int, int], list[int]] = {}  # (topic, partition, chunk start) -> [reads, bytes]
        self.redirects = 0
        self.proxied_reads = 0
        self.proxied_bytes = 0

    def served(self, topic: str, partition: int, chunk_start: int, size: int) -> None:
        c = self.reads.get((topic, partition, chunk_start))
        if c is None:
            c = self.reads[(topic, partition, chunk_start)] = [0, 0]
        c[0] += 1
        c[1] += size

    def proxied(self, size: int) -> None:
        self.proxied_reads += 1
        self.proxied_bytes += size

    def families(self) -> list[Family]:
        reads = Family("strata_chunk_replica_reads_total", "counter", "Consumer reads served from a local chunk replica.")
        read_bytes = Family("strata_chunk_replica_read_bytes_total", "counter",
                            "Record bytes served from a local chunk replica.")
        for (topic, index, start), (n, size) in sorted(self.reads.items()):
            labels = {"topic": topic, "partition": str(index), "chunk_start": str(start)}
            reads.add(n, labels)
            read_bytes.add(size, labels)
        return [
            reads, read_bytes,
            Family("strata_chunk_redirects_total", "counter",
                   "Consumer fetches of an old chunk redirected to a replica holding it (preferred_read_replica).")
            .add(self.redirects),
            Family("strata_chunk_proxied_reads_total", "counter",
                   "Old-chunk reads this broker made on a client's behalf from another replica.").add(self.proxied_reads),
            Family("strata_chunk_proxied_read_bytes_total", "counter", "Record bytes of those proxied reads.")
            .add(self.proxied_bytes),
        ]


def collect(replicas: ReplicaManager, isr: IsrManager, topic_stats: TopicStats,
            chunk_reads: ChunkReadCounts) -> list[Family]:
    """Everything the broker exposes besides request metrics."""
    fams = topic_stats.families()
    rm = replicas
    under = offline = leaders = 0
    for p in list(rm.partitions.values()):
        info = p.info
        if info is None or info.leader != rm.node_id:
            continue
        leaders += 1
        if len(info.isr) < len(info.replicas):
            under += 1
    offline = len(rm.offline)
    g = "kafka_server_replicamanager_"
    fams += [
        Family(g + "underreplicatedpartitions", "gauge", "Partitions led here whose ISR is smaller than their replicas.")
        .add(under),
        Family(g + "offlinereplicacount", "gauge", "Replicas here whose log dir is offline.").add(offline),
        Family(g + "leadercount", "gauge", "Partitions led by this broker.").add(leaders),
        Family(g + "partitioncount", "gauge", "Replicas of active chunks hosted here.").add(len(rm.partitions)),
    ]
    fams += [
        Family(g + "isrshrinks_total", "counter", "ISR shrinks committed for partitions led here.")
        .add(isr.changes.get("shrink", 0)),
        Family(g + "isrexpands_total", "counter", "ISR expands committed for partitions led here.")
        .add(isr.changes.get("expand", 0)),
    ]
    flush = Family("kafka_log_logflushstats_logflushrateandtimems", "histogram",
                   "Time in ms of the log flushes (fsyncs) after segment rolls.")
    FLUSH_TIMES_MS.add_to(flush, {})
    fams.append(flush)
    fams += _log_dirs(rm)
    fams += chunk_reads.families()
    fams += [
        Family("strata_fetch_sendfile_bytes_total", "counter",
               "Record bytes of Fetch answers sent with os.sendfile (plaintext listeners, zero copy).")
        .add(SEND_STATS.sendfile_bytes),
        Family("strata_fetch_region_read_bytes_total", "counter",
               "Record bytes of large Fetch reads read into the process to be sent (TLS listeners).")
        .add(SEND_STATS.read_bytes),
    ]
    return fams


def _log_dirs(rm: ReplicaManager) -> list[Family]:
    online = Family("strata_log_dir_online", "gauge", "1 while the log dir serves, 0 once a disk error took it offline.")
    size = Family("strata_log_dir_bytes", "gauge", "Bytes of the chunk replicas' segments in the log dir.")
    replicas = Family("strata_chunk_replica_bytes", "gauge", "Bytes of one chunk replica's segments.")
    for d in rm.log_dirs:
        labels = {"dir": str(d.path)}
        online.add(1 if d.online else 0, labels)
        if not d.online:
            continue
        total = 0
        for (topic, index, start), lg in rm.replicas_in(d):
            n = lg.size_bytes
            total += n
            replicas.add(n, {"topic": topic, "partition": str(index), "chunk_start": str(start), "dir": str(d.path)})
        size.add(total, labels)
    moves = list(rm.mover.moves.values())
    mv = "strata_replica_moves_"
    return [
        online, size, replicas,
        Family(mv + "in_flight", "gauge", "Replica moves between log dirs under way.").add(len(moves)),
        Family(mv + "copied_bytes", "gauge", "Bytes copied so far by the moves under way.")
        .add(sum(m.copied_bytes for m in moves)),
        Family(mv + "total_bytes", "gauge", "Bytes the moves under way copy in all.")
        .add(sum(m.total_bytes for m in moves)),
        Family(mv + "completed_total", "counter", "Replica moves between log dirs completed.").add(rm.mover.completed),
        Family(mv + "moved_bytes_total", "counter", "Bytes copied by the completed moves (rate(): the move rate).")
        .add(rm.mover.completed_bytes),
    ]
