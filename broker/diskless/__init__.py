"""Diskless topics (KIP-1164): a partition's batches live in WAL files on object storage, and a
diskless coordinator, materialized in SQLite from the `__diskless_metadata` topic, says which
batch is where.

Two sides, imports one way:

- `coordinator/`: the diskless coordinator (state, view, materializer, snapshots, retention, the
  files' lifecycle). It imports only what both sides share.
- the broker side, which uses it: the diskless partition and service (partition.py), the
  coordinator client (coordinator_client.py), the WAL writer (wal.py), the read path
  (reader.py), the file cleaner (file_cleaner.py), the orphan scan (orphans.py) and produce
  gateways (gateways.py).
- shared by both: config.py, batches.py (what the two say about batches) and object_store.py.
"""
