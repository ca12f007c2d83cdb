"""Replication: the ReplicaManager applies metadata deltas to local chunk replicas; partitions
track leadership, followers and the high watermark."""
