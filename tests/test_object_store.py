"""Both object stores against the one interface: the local directory store and S3 (a real
SeaweedFS server on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.diskless.coordinator.snapshots import SnapshotError, SnapshotStore
from broker.diskless.object_store import (
    LocalObjectStore,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    S3ObjectStore,
    StoreLocation,
    new_object_key,
    open_object_store,
)
from tests.s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3, s3_server  # noqa: F401


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "objects")
    else:
        server: SeaweedS3 = request.getfixturevalue("s3_server")
        yield S3ObjectStore(server.bucket, endpoint=server.endpoint, region="us-east-1",
                            access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)


def test_interface(store: ObjectStore) -> None:
    async def run() -> None:
        key = new_object_key("wal")
        assert key.startswith("wal/") and len(key) == 4 + 36
        data = bytes(range(256)) * 40
        await store.put(key, data)
        assert await store.get(key) == data
        assert await store.get_range(key, 10, 300) == data[10:300]
        assert await store.get_range(key, len(data) - 5, len(data) + 100) == data[-5:]
        # conditional create: the first wins, the second sees the object and leaves it alone
        other = new_object_key("wal")
        assert await store.create(other, b"first") is True
        assert await store.create(other, b"second") is False
        assert await store.get(other) == b"first"
        await store.put("elsewhere/x", b"!")
        listed = await store.list("wal/")
        assert [o.key for o in listed] == sorted([key, other])
        assert {o.key: o.size for o in listed} == {key: len(data), other: 5}
        assert all(o.last_modified_ms > 1_600_000_000_000 for o in listed)
        await store.delete(key)
        await store.delete(key)  # a missing key: no error (S3's rule)
        with pytest.raises(ObjectNotFound):
            await store.get(key)
        assert [o.key for o in await store.list("wal/")] == [other]
        await store.close()

    asyncio.run(run())


def test_store_down_is_a_store_error(tmp_path: Path) -> None:
    """An unreachable S3 endpoint is an ObjectStoreError (producers get a retriable error)."""
    from tools.cluster import free_ports

    (port,) = free_ports(1)
    s3 = S3ObjectStore("b", endpoint=f"http://127.0.0.1:{port}", region="us-east-1",
                       access_key_id="a", secret_access_key="b")

    async def run() -> None:
        with pytest.raises(ObjectStoreError):
            await asyncio.wait_for(s3.put("wal/x", b"data"), 60)

    asyncio.run(run())


def test_urls(tmp_path: Path) -> None:
    loc = open_object_store(f"file://{tmp_path}/d")
    assert isinstance(loc.store, LocalObjectStore) and loc.prefix == "wal"
    loc = open_object_store("s3://bucket/some/prefix", endpoint="http://127.0.0.1:1", region="r")
    assert isinstance(loc.store, S3ObjectStore) and loc.prefix == "some/prefix"
    for bad in ("file://relative", "s3:///nobucket", "gs://x/y"):
        with pytest.raises(ValueError):
            open_object_store(bad)
    with pytest.raises(ObjectStoreError):
        asyncio.run(LocalObjectStore(tmp_path).put("../escape", b""))


def test_block_cache_reads_and_evicts(tmp_path: Path) -> None:
    """Ranged reads through the block cache: any range equals the object's bytes, blocks are
    shared between reads, a block cached short is completed when a later read needs more, and
    the cache stays within its capacity."""
    from broker.diskless.reader import BlockCache

    store = LocalObjectStore(tmp_path / "objects")
    data = bytes(i % 251 for i in range(10_000))

    async def run() -> None:
        await store.put("wal/a", data)
        cache = BlockCache(store, capacity=4096, block_size=1024)
        assert await cache.read("wal/a", 10, 500) == data[10:500]  # block 0 cached short (500 bytes)
        assert await cache.read("wal/a", 400, 900) == data[400:900]  # needs more of block 0: re-read
        assert await cache.read("wal/a", 100, 800) == data[100:800]
        assert cache.hits >= 1
        assert await cache.read("wal/a", 1000, 9000) == data[1000:9000]
        assert cache._size <= 4096
        assert await cache.read("wal/a", 9990, 10_000) == data[9990:]
        reads = await asyncio.gather(*(cache.read("wal/a", 2048 + i, 3000) for i in range(5)))
        assert reads == [data[2048 + i:3000] for i in range(5)]
        # concurrent reads sharing a block in flight that the first one fetches only up to its end
        fresh = BlockCache(store, capacity=4096, block_size=1024)
        both = await asyncio.gather(fresh.read("wal/a", 5000, 5100), fresh.read("wal/a", 5050, 5900))
        assert both == [data[5000:5100], data[5050:5900]]

    asyncio.run(run())


class GatedStore(LocalObjectStore):
    """A local store whose ranged reads wait for `gate` (an object store slow to answer), after
    a random pause of up to `jitter` seconds."""

    def __init__(self, root: Path, jitter: float = 0.0) -> None:
        super().__init__(root)
        self.gate = asyncio.Event()
        self.gate.set()
        self.jitter = jitter
        self.rnd = random.Random(0)

    async def get_range(self, key: str, start: int, end: int) -> bytes:
        await self.gate.wait()
        await asyncio.sleep(self.rnd.random() * self.jitter)
        return await super().get_range(key, start, end)


def test_block_cache_read_sharing_a_cancelled_fetch(tmp_path: Path) -> None:
    """A read waiting on a block another read is fetching is not cancelled with it (that read's
    client went away): it fetches the block itself and answers."""
    from broker.diskless.reader import BlockCache

    store = GatedStore(tmp_path / "objects")
    data = bytes(i % 251 for i in range(4000))

    async def run() -> None:
        await store.put("wal/a", data)
        cache = BlockCache(store, capacity=1 << 20, block_size=1024)
        store.gate.clear()
        first = asyncio.ensure_future(cache.read("wal/a", 0, 600))
        await asyncio.sleep(0.01)  # its fetch of block 0 is in flight
        second = asyncio.ensure_future(cache.read("wal/a", 100, 2500))
        await asyncio.sleep(0.01)  # waiting on that fetch
        first.cancel()
        store.gate.set()
        assert await asyncio.wait_for(second, 5) == data[100:2500]
        assert first.cancelled()

    asyncio.run(run())


def test_read_batches_with_concurrent_and_cancelled_readers(tmp_path: Path) -> None:
    """Fetches of one WAL file through one block cache, many at once over a slow store, some
    cancelled on the way: every read that answers holds exactly its batches with their base
    offsets patched in (a short block once failed the patch with struct.error)."""
    from broker.diskless.batches import BatchRow
    from broker.diskless.reader import BlockCache, read_batches

    seed = 33
    rnd = random.Random(seed)
    store = GatedStore(tmp_path / "objects", jitter=0.003)
    files: dict[str, tuple[bytes, list[BatchRow]]] = {}
    for f in range(3):
        key, data, rows = f"wal/{f}", bytearray(), []
        for b in range(rnd.randrange(20, 60)):
            size = rnd.randrange(61, 700)
            rows.append(BatchRow(b, key, 2, len(data), size, 0, 0, 0, 0, 0))
            data += bytes(rnd.randrange(256) for _ in range(size))
        files[key] = (bytes(data), rows)

    def expected(key: str, rows: list[BatchRow], base: int) -> bytes:
        data = files[key][0]
        return b"".join(base.to_bytes(8, "big") + data[r.byte_offset + 8:r.byte_offset + r.byte_size]
                        for r in rows)

    async def run() -> None:
        for key, (data, _) in files.items():
            await store.put(key, data)
        cache = BlockCache(store, capacity=16 * 1024, block_size=1024)

        async def fetch() -> None:
            key = rnd.choice(list(files))
            rows = files[key][1]
            i = rnd.randrange(len(rows))
            base = rnd.randrange(1 << 40)
            asked = [BatchRow(r.batch_id, r.object_key, 2, r.byte_offset, r.byte_size, base, 0, 0, 0, 0)
                     for r in rows[i:i + rnd.randrange(1, 8)]]
            read = asyncio.ensure_future(read_batches(cache, asked))
            if rnd.random() < 0.2:
                await asyncio.sleep(rnd.random() * 0.003)
                read.cancel()
            try:
                got = await read
            except asyncio.CancelledError:
                assert read.cancelled(), f"seed {seed}: a read not cancelled was cancelled"
                return
            assert got == expected(key, asked, base), f"seed {seed}"

        await asyncio.wait_for(asyncio.gather(*(fetch() for _ in range(400))), 60)

    asyncio.run(run())


def test_snapshot_store(store: ObjectStore, tmp_path: Path) -> None:
    """Coordinator snapshots (docs/concepts/diskless.md): stored per topic id and partition, listed
    by applied offset, the two newest kept, outside the WAL prefix."""

    async def get(snaps: SnapshotStore, tid: str, index: int, offset: int) -> bytes:
        dest = tmp_path / f"{tid}-{index}-{offset}"
        await snaps.download(tid, index, offset, dest)
        return dest.read_bytes()

    async def run() -> None:
        snaps = SnapshotStore(StoreLocation(store, "wal"))
        tid = "7f5e1c2a-0000-4000-8000-000000000001"
        await store.put(new_object_key("wal"), b"a wal file")
        for offset in (1200, 90, 30000):
            await snaps.put(tid, 0, offset, f"db at {offset}".encode())
        await snaps.put(tid, 1, 5, b"another partition")
        assert await snaps.offsets(tid, 0) == [90, 1200, 30000]
        assert await get(snaps, tid, 0, 1200) == b"db at 1200"
        await snaps.prune(tid, 0)
        assert await snaps.offsets(tid, 0) == [1200, 30000]
        assert await snaps.offsets(tid, 1) == [5]
        with pytest.raises(SnapshotError):
            await get(snaps, tid, 0, 90)
        # a listing of WAL files (the orphan scan's) never sees a snapshot
        assert all(not o.key.startswith("diskless-snapshots") for o in await store.list("wal/"))
        await store.close()

    asyncio.run(run())
