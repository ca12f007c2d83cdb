"""Partitions as Produce, Fetch and ListOffsets see them: one interface (interface.py) that a local
chunk replica (local.py), an inactive chunk (chunk_views.py) and a diskless partition
(broker/diskless/partition.py) implement. The router (router.py) is the one place that tells
which serves a request."""
