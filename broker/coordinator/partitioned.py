"""What the group and transaction coordinators share: state kept in the partitions of one internal
topic, coordinated by whichever broker leads each partition.

A partition this broker comes to lead is loaded (its log read in an executor, once the broker's
metadata has caught up) and answers COORDINATOR_LOAD_IN_PROGRESS meanwhile; one it stops leading
is unloaded. Writes are appended to the partition leader's log at once (before any await, so the
log order is the decision order) and reported when the high watermark passes them (acks=all),
bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

import structlog

from broker.coordinator import metadata_caught_up, wall_clock_ms
from broker.storage.errors import StorageError
from broker.storage.log import AppendOrigin
from protocol.errors import Errors, ProtocolError
from protocol.records import Record, decode_batches, encode_batch

if TYPE_CHECKING:
    from broker.ports import LocalReplicas, MetadataView
    from broker.replication.partition import Partition
    from broker.storage.log import Log
    from protocol.records import DecodedBatch

log = structlog.get_logger(__name__)


def log_batches(lg: Log, max_bytes: int) -> Iterator[DecodedBatch]:
    """Every record batch of a coordinator partition's log, from its start to its end as it was when
    the scan began (a load reads with this, in an executor)."""
    offset, end = lg.log_start_offset, lg.log_end_offset
    while offset < end:
        info = lg.read(offset, max_bytes, max_offset=end)
        data = b"".join(bytes(part) for part in info.records)
        batches = decode_batches(data) if data else []
        if not batches:
            return
        for b in batches:
            yield b
            offset = b.header.base_offset + b.header.last_offset_delta + 1


def state_write_error(code: int) -> int:
    """What a client hears when a coordinator's state write failed with `code` (Kafka maps group
    metadata writes and transaction log writes alike)."""
    if code in (0, Errors.NOT_COORDINATOR):
        return code
    if code in (Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.NOT_ENOUGH_REPLICAS,
                Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND, Errors.REQUEST_TIMED_OUT):
        return Errors.COORDINATOR_NOT_AVAILABLE
    if code in (Errors.NOT_LEADER_OR_FOLLOWER, Errors.KAFKA_STORAGE_ERROR):
        return Errors.NOT_COORDINATOR
    return Errors.UNKNOWN_SERVER_ERROR


class CoordinatorPartition:
    """One partition of the internal topic that this broker leads."""

    def __init__(self, index: int, epoch: int) -> None:
        self.index = index
        self.epoch = epoch  # the partition's leader epoch (the transaction coordinator's epoch)
        self.loading = True
        self.load_task: asyncio.Task | None = None


P = TypeVar("P", bound=CoordinatorPartition)


class PartitionedCoordinator(Generic[P]):
    topic: ClassVar[str]
    event: ClassVar[str]  # prefix of the log events: "group", "txn"
    # Kafka's transaction coordinator reloads a partition it leads again under a new epoch
    # (another broker may have led it meanwhile); its group coordinator keeps what it has.
    reload_on_new_epoch: ClassVar[bool] = False

    def __init__(self, replicas: LocalReplicas, metadata: MetadataView, default_partitions: int,
                 load_buffer_size: int, write_timeout_ms: int) -> None:
        """`replicas`: leadership changes and the state partitions; `metadata`: the image (the
        topic's partition count) and whether it has caught up with the controller."""
        self.replicas = replicas
        self.metadata = metadata
        self.active = True
        self._partitions: dict[int, P] = {}
        self._tasks: set[asyncio.Task] = set()
        # a write's `done` -> (its high watermark future, its timeout)
        self._pending_writes: dict[asyncio.Future, tuple[asyncio.Future, asyncio.TimerHandle]] = {}
        self._create_task: asyncio.Task | None = None
        self._loop = asyncio.get_running_loop()
        self._default_partitions = default_partitions
        self._load_buffer_size = load_buffer_size
        self._write_timeout_s = write_timeout_ms / 1000
        self._periodic: list[tuple[int, Callable[[], Any], str]] = []  # _every's work, run from start()
        self._started = False

    def _watch_leadership(self) -> None:
        """Register with the replica manager and load what this broker already leads (the
        subclass calls this last in its __init__)."""
        self.replicas.leadership_listeners.append(self.on_leadership)
        for (topic, _), p in list(self.replicas.partitions.items()):
            if topic == self.topic and p.is_leader:
                self.on_leadership(p, True)

    # ------------------------------------------------------------------ to be provided
    def _new_partition(self, index: int, epoch: int) -> P:
        raise NotImplementedError

    @staticmethod
    def _read_partition(lg: Log, max_bytes: int) -> Any:
        """Read a partition's log (runs in an executor)."""
        raise NotImplementedError

    def _apply_loaded(self, ps: P, loaded: Any, started: float) -> None:
        """Take in what _read_partition found; ends with ps.loading = False."""
        raise NotImplementedError

    def _forget(self, ps: P) -> None:
        """Drop a partition's in-memory state (it is unloaded)."""
        raise NotImplementedError

    async def _create_topic(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        self.active = False
        for ps in list(self._partitions.values()):
            self._unload(ps)
        self._partitions.clear()
        for t in list(self._tasks):
            t.cancel()
        for done, (replicated, timer) in list(self._pending_writes.items()):
            replicated.cancel()
            timer.cancel()
            if not done.done():
                done.set_result(Errors.NOT_COORDINATOR)
        self._pending_writes.clear()
        try:
            self.replicas.leadership_listeners.remove(self.on_leadership)
        except ValueError:
            pass

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _timer(self, delay_ms: int, fn: Callable, *args: Any) -> asyncio.TimerHandle:
        return self._loop.call_later(max(delay_ms, 0) / 1000, fn, *args)

    def _every(self, interval_ms: int, fn: Callable[[], Any], failed_event: str) -> None:
        """Run `fn` every `interval_ms` from start() for as long as the coordinator lives."""
        self._periodic.append((interval_ms, fn, failed_event))
        if self._started:
            self._spawn(self._periodically(interval_ms, fn, failed_event))

    def start(self) -> None:
        """Start the periodic work (the constructor only builds: Broker.start() starts things)."""
        if not self._started:
            self._started = True
            for interval_ms, fn, failed_event in self._periodic:
                self._spawn(self._periodically(interval_ms, fn, failed_event))

    @staticmethod
    async def _periodically(interval_ms: int, fn: Callable[[], Any], failed_event: str) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                fn()
            except Exception:
                log.exception(failed_event)

    def ensure_topic(self) -> None:
        """Create the internal topic (forwarded CreateTopics) unless already under way."""
        if self._create_task is not None and not self._create_task.done():
            return
        self._create_task = self._spawn(self._create_topic())

    # ------------------------------------------------------------------ partitions
    def num_partitions(self) -> int:
        t = self.metadata.image.topic(self.topic)
        if t is not None and t.partitions:
            return len(t.partitions)
        return self._default_partitions

    def on_leadership(self, p: Partition, is_leader: bool) -> None:
        """ReplicaManager listener: load a partition we now lead, unload one we no longer lead."""
        if p.topic != self.topic:
            return
        if is_leader:
            ps = self._partitions.get(p.index)
            if ps is not None and (ps.epoch == p.leader_epoch or not self.reload_on_new_epoch):
                ps.epoch = p.leader_epoch
                return
            if ps is not None:
                self._partitions.pop(p.index)
                self._unload(ps)
            if not self.active:
                return
            ps = self._partitions[p.index] = self._new_partition(p.index, p.leader_epoch)
            log.info(f"{self.event}_partition_loading", partition=p.index, epoch=p.leader_epoch)
            ps.load_task = self._spawn(self._load(ps, p))
        else:
            ps = self._partitions.pop(p.index, None)
            if ps is not None:
                log.info(f"{self.event}_partition_unloading", partition=p.index)
                self._unload(ps)

    def _owns(self, ps: P) -> bool:
        return self.active and self._partitions.get(ps.index) is ps

    async def _load(self, ps: P, p: Partition) -> None:
        await metadata_caught_up(self.metadata)  # not on a restarted broker's stale view of leadership
        if not self._owns(ps):
            return
        started = time.monotonic()
        try:
            loaded = await self._loop.run_in_executor(None, self._read_partition, p.log, self._load_buffer_size)
        except asyncio.CancelledError:
            raise
        except (StorageError, ProtocolError, OSError) as e:
            log.error(f"{self.event}_partition_load_failed", partition=ps.index, error=str(e))
            if self._partitions.get(ps.index) is ps:
                del self._partitions[ps.index]  # answered NOT_COORDINATOR from now on
            return
        if self._owns(ps):
            self._apply_loaded(ps, loaded, started)

    def _unload(self, ps: P) -> None:
        if ps.load_task is not None and not ps.load_task.done():
            ps.load_task.cancel()
        self._forget(ps)

    def _partition_status(self, key: str) -> tuple[int, P | None]:
        """(0, partition) when this broker coordinates `key` and has it loaded, else the error."""
        if not self.active:
            return Errors.COORDINATOR_NOT_AVAILABLE, None
        ps = self._partitions.get(self.partition_for(key))
        if ps is None:
            return Errors.NOT_COORDINATOR, None
        if ps.loading:
            return Errors.COORDINATOR_LOAD_IN_PROGRESS, None
        return 0, ps

    def partition_for(self, key: str) -> int:
        raise NotImplementedError

    def is_loading(self) -> bool:
        return any(ps.loading for ps in self._partitions.values())

    # ------------------------------------------------------------------ writes
    def _append(self, ps: P, records: Sequence[tuple[bytes | None, bytes | None]],
                producer: tuple[int, int] | None = None) -> tuple[int, int, asyncio.Future]:
        """Append (key, value or None) records to `ps` now, before any await. Returns (error, first
        offset, done): `done` resolves to 0 once the high watermark passes the batch, or to
        Kafka's append error why not (NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS,
        REQUEST_TIMED_OUT, a storage error; NOT_COORDINATOR when the coordinator stops).
        `producer` (id, epoch): a transactional batch of that producer."""
        done = self._loop.create_future()

        def failed(code: int) -> tuple[int, int, asyncio.Future]:
            done.set_result(code)
            return code, -1, done

        p = self.replicas.get(self.topic, ps.index)
        if not self._owns(ps) or ps.loading or p is None or not p.is_leader or p.leader_epoch != ps.epoch:
            return failed(Errors.NOT_LEADER_OR_FOLLOWER)
        try:
            min_isr = int(self.replicas.topic_config(self.topic).get("min.insync.replicas", "1"))
        except (ValueError, KeyError):
            min_isr = 1
        if len(p.isr) < min_isr:
            return failed(Errors.NOT_ENOUGH_REPLICAS)
        now = wall_clock_ms()
        txn: dict[str, Any] = {}
        if producer is not None:
            txn = {"producer_id": producer[0], "producer_epoch": producer[1], "base_sequence": 0,
                   "transactional": True}
        batch = encode_batch([Record(key=k, value=v, timestamp=now) for k, v in records], base_timestamp=now, **txn)
        try:
            info = p.log.append_as_leader(batch, p.leader_epoch, now, origin=AppendOrigin.COORDINATOR)
        except StorageError as e:
            log.warning(f"{self.event}_append_failed", partition=ps.index, error=str(e))
            return failed(e.error_code)
        p.notify_appended()
        p.maybe_advance_high_watermark()

        # Callbacks, not a task per write: `done` resolves in the loop turn the HW passes the batch.
        replicated = p.high_watermark_future(info.last_offset + 1)

        def settle(ok: bool) -> None:
            timer.cancel()
            self._pending_writes.pop(done, None)
            if not done.done():
                done.set_result(0 if ok else Errors.REQUEST_TIMED_OUT if p.is_leader else Errors.NOT_LEADER_OR_FOLLOWER)

        def expire() -> None:
            replicated.cancel()
            settle(False)

        timer = self._loop.call_later(self._write_timeout_s, expire)
        replicated.add_done_callback(lambda f: None if f.cancelled() else settle(f.result()))
        self._pending_writes[done] = (replicated, timer)
        return 0, info.first_offset, done
