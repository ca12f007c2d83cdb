"""Reading diskless partitions: DisklessFindBatches says which byte ranges of which WAL files hold
the batches from an offset on; the ranges are read through a bounded in-memory block cache
(`diskless.fetch.cache.bytes`), and each batch gets its assigned base offset patched into its
header (outside the CRC, so nothing else changes).

The cache holds fixed-size blocks of objects (WAL files never change once written), evicted least
recently used; one read fetches every missing block of a batch range with one ranged get per run
of adjacent blocks (coalesced), and concurrent readers of one block share its fetch: a reader
that waits checks that the block covers its range (the fetch stops at its reader's end), and no
reader's cancellation reaches another.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from broker.diskless.batches import BatchRow
from broker.diskless.config import DEFAULT_CACHE_BYTES
from broker.diskless.object_store import ObjectStore
from protocol.records.batch import set_base_offset

BLOCK_SIZE = 1024 * 1024


class BlockCache:
    def __init__(self, store: ObjectStore, capacity: int = DEFAULT_CACHE_BYTES, block_size: int = BLOCK_SIZE) -> None:
        self.store = store
        self.capacity = max(capacity, block_size)
        self.block_size = block_size
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._size = 0
        self._inflight: dict[tuple[str, int], asyncio.Future[bytes]] = {}
        self.hits = self.misses = 0

    def _put(self, key: tuple[str, int], data: bytes) -> None:
        old = self._blocks.pop(key, None)
        if old is not None:
            self._size -= len(old)
        self._blocks[key] = data
        self._size += len(data)
        while self._size > self.capacity and self._blocks:
            _, evicted = self._blocks.popitem(last=False)
            self._size -= len(evicted)

    async def read(self, object_key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object (the range is known to exist)."""
        bs = self.block_size
        first, last = start // bs, (end - 1) // bs
        have: dict[int, bytes] = {}
        missing: list[int] = []
        waits: list[tuple[int, asyncio.Future[bytes]]] = []
        for i in range(first, last + 1):
            block = self._blocks.get((object_key, i))
            # a block cached short (read when the object's end was not needed) may not cover us
            if block is not None and i * bs + len(block) >= min(end, (i + 1) * bs):
                self._blocks.move_to_end((object_key, i))
                have[i] = block
                self.hits += 1
            elif (object_key, i) in self._inflight:
                waits.append((i, self._inflight[(object_key, i)]))
            else:
                missing.append(i)
                self.misses += 1
        loop = asyncio.get_running_loop()
        runs: list[list[int]] = []
        for i in missing:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        futs = {i: loop.create_future() for i in missing}
        for i, f in futs.items():
            self._inflight[(object_key, i)] = f
        try:
            for run in runs:
                lo = run[0] * bs
                hi = min((run[-1] + 1) * bs, end) if run[-1] == last else (run[-1] + 1) * bs
                data = await self.store.get_range(object_key, lo, hi)
                for i in run:
                    block = data[(i - run[0]) * bs:(i - run[0] + 1) * bs]
                    have[i] = block
                    self._put((object_key, i), block)
                    futs[i].set_result(block)
        except BaseException as e:
            for f in futs.values():
                if f.done():
                    continue
                if isinstance(e, Exception):
                    f.set_exception(e)
                    f.exception()  # retrieved: the readers sharing it see it through their await
                else:
                    # this read was cancelled (its client went away): a reader sharing the fetch
                    # must not be cancelled with it (its Fetch would never be answered); an empty
                    # block covers nothing, so it fetches the block itself
                    f.set_result(b"")
            raise
        finally:
            for i in futs:
                self._inflight.pop((object_key, i), None)
        for i, f in waits:
            # shielded: a waiter cancelled (its client went away) must not cancel the fetch the
            # fetching read and the other waiters share
            block = await asyncio.shield(f)
            need = min(end, (i + 1) * bs)
            if i * bs + len(block) < need:  # another reader's fetch, cut short at its own end (or cancelled)
                block = await self.store.get_range(object_key, i * bs, need if i == last else (i + 1) * bs)
                self._put((object_key, i), block)
            have[i] = block
        joined = b"".join(have[i] for i in range(first, last + 1))
        offset = start - first * bs
        return joined[offset:offset + (end - start)]


async def read_batches(cache: BlockCache, rows: list[BatchRow]) -> bytes:
    """The batches `rows` name, in order, with their assigned base offsets patched in. Adjacent
    batches of one object are read as one range."""
    ranges: list[tuple[str, int, int, list[BatchRow]]] = []
    for r in rows:
        if ranges and ranges[-1][0] == r.object_key and ranges[-1][2] == r.byte_offset:
            key, lo, _, members = ranges[-1]
            members.append(r)
            ranges[-1] = (key, lo, r.byte_offset + r.byte_size, members)
        else:
            ranges.append((r.object_key, r.byte_offset, r.byte_offset + r.byte_size, [r]))
    parts = await asyncio.gather(*(cache.read(key, lo, hi) for key, lo, hi, _ in ranges))
    out = bytearray()
    for (_, lo, _, members), data in zip(ranges, parts):
        base = len(out)
        out += data
        for r in members:
            set_base_offset(out, base + r.byte_offset - lo, r.base_offset)
    return bytes(out)

