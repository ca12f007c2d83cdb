"""Which replica of an inactive chunk a reader goes to first: the same rule for brokers copying or
proxying a chunk and for the Spark connector planning reads, so readers spread over a chunk's
replicas and each keeps going to the same one."""

from __future__ import annotations

import zlib
from collections.abc import Iterable


def hash_order(candidates: Iterable[int], *key: object) -> list[int]:
    """`candidates` rotated to start at one chosen by a stable hash of `key` (the same in every
    process, unlike Python's hash of a str: Spark plans and reads in different processes)."""
    ids = list(candidates)
    if not ids:
        return []
    i = zlib.crc32(repr(key).encode()) % len(ids)
    return ids[i:] + ids[:i]
