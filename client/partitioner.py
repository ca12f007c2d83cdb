"""Which partition a key goes to: Kafka's murmur2 of the key, spread by linear hashing over the
topic's undeleted_partition_count.

Kafka's `murmur2(key) % count` moves keys between partitions that exist both before and after a
change (6 -> 4 moves keys from partition 3 to partition 1), which KIP-253's leader-epoch maps
cannot order: they only say when new partitions may start and when kept partitions may go past
the records the marked ones still hold. Linear hashing moves a key only into a new partition when
the count grows and only out of a marked partition when it shrinks, for any counts, and at a
power-of-two count it is exactly Kafka's modulo.
"""

from __future__ import annotations


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (seed 0x9747b28c), as a signed 32-bit int."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[i * 4 : i * 4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    rest = length % 4
    if rest:
        tail = data[n4 * 4 :]
        if rest == 3:
            h ^= tail[2] << 16
        if rest >= 2:
            h ^= tail[1] << 8
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, count: int) -> int:
    """Linear hashing over Kafka's positive murmur2: buckets below `count` of the next power of two."""
    if count < 1:
        raise ValueError(f"partition count {count} must be at least 1")
    h = murmur2(key) & 0x7FFFFFFF
    size = 1
    while size < count:
        size <<= 1
    p = h % size
    return p if p < count else h % (size >> 1)
