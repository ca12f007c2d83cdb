"""AlterReplicaLogDirs (34) and DescribeLogDirs (35): KIP-113's ChangeReplicaDir and
DescribeDirs, per chunk replica.

AlterReplicaLogDirs moves each of the partition's chunk replicas on this broker to the dir named
("any" cancels a pending or running move); a replica not here yet gets REPLICA_NOT_AVAILABLE and
is created in that dir once the metadata gives it us. DescribeLogDirs lists every dir (or those
holding the topics asked), an offline one with KAFKA_STORAGE_ERROR, and one entry per chunk
replica (tagged ChunkStartOffset), a `.move` copy as IsFutureKey with the bytes copied so far.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from broker.apis.registry import RequestContext, api
from broker.storage.file_names import LOG_SUFFIX, segment_file_name
from protocol.errors import Errors
from protocol.generated.alter_replica_log_dirs import AlterReplicaLogDirsResponse
from protocol.generated.describe_log_dirs import DescribeLogDirsResponse

if TYPE_CHECKING:
    from broker.replication.log_dir_mover import Move
    from broker.replication.replica_manager import ReplicaManager


@api(34, 1, 2)
async def alter_replica_log_dirs(ctx: RequestContext, req) -> AlterReplicaLogDirsResponse:
    R = AlterReplicaLogDirsResponse
    rm = ctx.services.replicas
    codes: dict[str, dict[int, int]] = {}
    for d in req.dirs:
        for t in d.topics:
            for index in t.partitions:
                codes.setdefault(t.name, {})[index] = rm.alter_log_dir(t.name, index, d.path)
    return R(throttle_time_ms=0, results=[
        R.AlterReplicaLogDirTopicResult(topic_name=name, partitions=[
            R.AlterReplicaLogDirPartitionResult(partition_index=i, error_code=code) for i, code in parts.items()
        ])
        for name, parts in codes.items()
    ])


@api(35, 1, 4)
async def describe_log_dirs(ctx: RequestContext, req) -> DescribeLogDirsResponse:
    R = DescribeLogDirsResponse
    rm = ctx.services.replicas
    wanted = None if req.topics is None else {(t.topic, p) for t in req.topics for p in t.partitions}
    results = []
    for d in rm.log_dirs:
        res = R.DescribeLogDirsResult(error_code=0, log_dir=str(d.path), topics=[], total_bytes=-1, usable_bytes=-1)
        results.append(res)
        if not d.online:
            res.error_code = Errors.KAFKA_STORAGE_ERROR
            continue
        try:
            res.total_bytes, res.usable_bytes = d.usage()
        except OSError:
            pass
        by_topic: dict[str, list] = {}
        for (topic, index, start), lg in rm.replicas_in(d):
            if wanted is None or (topic, index) in wanted:
                lag = max(lg.high_watermark - lg.log_end_offset, 0)
                by_topic.setdefault(topic, []).append(R.DescribeLogDirsPartition(
                    partition_index=index, partition_size=lg.size_bytes, offset_lag=lag, is_future_key=False,
                    chunk_start_offset=start))
        for (topic, index, start), m in list(rm.mover.moves.items()):
            if m.dest is d and (wanted is None or (topic, index) in wanted):
                by_topic.setdefault(topic, []).append(R.DescribeLogDirsPartition(
                    partition_index=index, partition_size=m.copied_bytes, offset_lag=_future_lag(rm, m),
                    is_future_key=True, chunk_start_offset=start))
        res.topics = [R.DescribeLogDirsTopic(name=t, partitions=sorted(ps, key=lambda p: (p.partition_index,
                                                                                            p.chunk_start_offset)))
                      for t, ps in sorted(by_topic.items())]
    return R(throttle_time_ms=0, error_code=0, results=results)


def _future_lag(rm: ReplicaManager, m: Move) -> int:
    """Offsets the `.move` copy trails its source by: from the first segment not yet fully copied."""
    r = rm.replica(m.key)
    if r is None:
        return 0
    lg = r.log
    for base in lg.segment_base_offsets:
        name = segment_file_name(base, LOG_SUFFIX)
        try:
            size = os.stat(lg.dir / name).st_size
        except OSError:
            continue
        if m.state.copied.get(name, 0) < size:
            return max(lg.log_end_offset - base, 0)
    return 0
