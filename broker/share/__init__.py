"""Share groups' data side (KIP-932): the share-partitions a partition leader keeps for each share
group reading it (partition.py), the share sessions of ShareFetch and ShareAcknowledge
(sessions.py), and the service the handlers call (service.py)."""
