"""Partitions as Produce, Fetch and ListOffsets see them: one interface (interface.py) that a local
chunk replica (local.py) and a diskless partition (broker/diskless/partition.py) implement.
broker/apis/leadership.py's serving_partition is the one place that tells which is which."""
