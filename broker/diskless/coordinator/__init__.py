"""The diskless coordinator (KIP-1164's topic-based coordinator): coordinator.py and the parts it
is built from. Nothing here imports the broker side of the diskless package (partition.py,
coordinator_client.py, wal.py, reader.py, ...): that side calls in, never the reverse."""
