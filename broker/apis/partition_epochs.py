"""PartitionLeaderEpochsForPartitions (KIP-253, Strata key 1253): each partition's
leaderEpochAfterCreation and leaderEpochBeforeDeletion maps, read from this broker's image.
OrderedConsumer turns them into offset thresholds with OffsetForLeaderEpoch."""

from __future__ import annotations

from broker.apis.registry import RequestContext, api
from protocol.errors import Errors
from protocol.generated.partition_leader_epochs_for_partitions import PartitionLeaderEpochsForPartitionsResponse

R = PartitionLeaderEpochsForPartitionsResponse


@api(1253, 0, 0)
async def partition_leader_epochs(ctx: RequestContext, req) -> PartitionLeaderEpochsForPartitionsResponse:
    image = ctx.services.metadata.image
    topics = []
    for t in req.topics:
        info = image.topic(t.name)
        if info is None:
            topics.append(R.PartitionLeaderEpochsTopicResult(
                name=t.name, error_code=Errors.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"Topic '{t.name}' does not exist.", undeleted_partition_count=-1))
            continue
        tr = R.PartitionLeaderEpochsTopicResult(name=t.name, undeleted_partition_count=info.undeleted_partition_count)
        topics.append(tr)
        for idx in sorted(info.partitions) if t.partitions is None else t.partitions:
            p = info.partitions.get(idx)
            pr = R.PartitionLeaderEpochsResult(partition_index=idx)
            tr.partitions.append(pr)
            if p is None:
                pr.error_code = Errors.UNKNOWN_TOPIC_OR_PARTITION
                continue
            pr.leader_epoch_after_creation = [R.LeaderEpochAfterCreationEntry(i, e) for i, e in p.epochs_after_creation]
            pr.leader_epoch_before_deletion = [
                R.LeaderEpochBeforeDeletionEntry(i, e) for i, e in p.epochs_before_deletion
            ]
    return R(topics=topics)
