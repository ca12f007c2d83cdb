"""Follower replication: one fetcher per source broker, fetching the partitions this broker
follows from that leader in two lanes (caught up, behind), one Fetch request each at a time.

Each partition's fetch carries its log end offset and the epoch of its last batch; the leader
answers a divergence with DivergingEpoch (KIP-595's scheme, as Kafka's fetchers use), and we
truncate to the last offset both logs agree on before fetching on. Appends are the leader's
bytes as they came, numbered already.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog

from broker.config import BrokerConfig
from broker.replication.partition import Partition
from broker.replication.throttle import Throttle
from broker.storage.errors import StorageError
from metadata.image import Endpoint
from node.client import ClientError, NodeClient
from node.shutdown import stop_task
from node.waits import Eventual
from protocol.errors import Errors
from protocol.generated.fetch import FetchRequest

log = structlog.get_logger(__name__)
BACKOFF_S = 0.2
CATCH_UP_WAIT_MS = 20  # the catch-up lane's max wait
QUIET_S = 1.0  # a catch-up partition that brought little for this long goes back to the tail lane
THREAD_APPEND_BYTES = 64 * 1024  # a Fetch answer with this many record bytes is appended on a thread
APPEND_THREADS = 4  # per broker, shared by its fetchers
Key = tuple[str, int]
_RECONNECT, _BACKOFF = "reconnect", "backoff"  # how a lane's chain of fetches ended


class _Lane:
    """One fetch loop of a ReplicaFetcher, on its own connection to the leader."""

    def __init__(self, name: str, max_wait_ms: int) -> None:
        self.name = name
        self.max_wait_ms = max_wait_ms
        self.client: NodeClient | None = None
        self.in_flight: set[Key] = set()  # partitions of the request under way
        self.wake = asyncio.Event()  # the lane has partitions again
        self.cycle_done = asyncio.Event()  # set whenever a request of this lane is answered
        self.task: asyncio.Task | None = None


class ReplicaFetcher:
    """Fetches, for the partitions whose leader is `leader_id`, what this follower lacks.

    Two lanes, each one Fetch at a time on its own connection (as Kafka's fetcher threads each
    have theirs): the *tail* lane long-polls the partitions that are caught up, the *catch-up*
    lane fetches those that are behind (a fetch filled a quarter of its max bytes). A partition
    is fetched by one lane at a time. Without them, a caught-up partition's fetch rides with
    megabytes of another partition's backlog, and an acks=all write to it waits for whole bulk
    cycles (read, transfer and append of every partition in the response) before its follower
    even asks for it. A partition goes back to the tail lane once its catch-up fetches have brought
    less than 1/32 of its max bytes for a second."""

    def __init__(self, leader_id: int, config: BrokerConfig, leader_endpoint: Callable[[int], Endpoint | None],
                 broker_epoch: Callable[[], int], throttle: Throttle, append_pool: ThreadPoolExecutor) -> None:
        self.leader_id = leader_id
        self.config = config
        self.leader_endpoint = leader_endpoint
        self.broker_epoch = broker_epoch
        self.throttle = throttle
        self.append_pool = append_pool
        self.applying: dict[Key, concurrent.futures.Future] = {}  # partitions being appended on a thread
        self.partitions: dict[Key, Partition] = {}
        wait = config.replica_fetch_wait_max_ms
        self.tail = _Lane("tail", wait)
        # short: a partition handed to this lane waits at most this long for its next fetch
        self.catch_up = _Lane("catch-up", min(wait, CATCH_UP_WAIT_MS))
        self._lane_of: dict[Key, _Lane] = {}
        self._handover: dict[Key, _Lane] = {}  # partitions to move, and to which lane
        self._quiet_since: dict[Key, float] = {}  # catch-up partitions bringing little, since when
        self._stopping = False
        loop = asyncio.get_running_loop()
        for lane in (self.tail, self.catch_up):
            lane.task = loop.create_task(self._run(lane))

    def add(self, p: Partition) -> None:
        key = (p.topic, p.index)
        self.partitions[key] = p
        self._lane_of[key] = self.tail
        self._handover.pop(key, None)
        self.tail.wake.set()

    def remove(self, p: Partition) -> None:
        key = (p.topic, p.index)
        self.partitions.pop(key, None)
        self._lane_of.pop(key, None)
        self._handover.pop(key, None)
        self._quiet_since.pop(key, None)

    async def stop(self) -> None:
        self._stopping = True
        for lane in (self.tail, self.catch_up):
            lane.wake.set()
            if lane.task is not None:
                await stop_task(lane.task)
            if lane.client is not None:
                await lane.client.close()

    async def _connect(self, lane: _Lane) -> NodeClient | None:
        if lane.client is not None and lane.client.connected:
            return lane.client
        ep = self.leader_endpoint(self.leader_id)
        if ep is None:
            return None
        suffix = "" if lane is self.tail else f"-{lane.name}"
        try:
            lane.client = await NodeClient(ep.host, ep.port, client_id=f"replica-fetcher-{self.config.node_id}{suffix}",
                                           timeout=30, security=self.config.inter_broker_security).connect()
            return lane.client
        except ClientError as e:
            log.debug("fetcher_connect_failed", leader=self.leader_id, lane=lane.name, error=str(e))
            return None

    def _max_bytes(self, p: Partition) -> int:
        max_bytes = self.config.replica_fetch_max_bytes
        if self.throttle.applies(p.topic, p.index):
            max_bytes = self.throttle.fetch_size(max_bytes)
        return max_bytes

    def _request(self, version: int, parts: list[Partition], max_wait_ms: int) -> FetchRequest:
        cfg = self.config
        topics: dict[str, FetchRequest.FetchTopic] = {}
        for p in parts:
            t = topics.get(p.topic)
            if t is None:
                t = topics[p.topic] = FetchRequest.FetchTopic(topic=p.topic, topic_id=p.topic_id)
            lg = p.log
            t.partitions.append(
                FetchRequest.FetchPartition(
                    partition=p.index,
                    current_leader_epoch=p.leader_epoch,
                    fetch_offset=lg.log_end_offset,
                    last_fetched_epoch=lg.leader_epoch_cache.latest_epoch(),
                    log_start_offset=lg.log_start_offset,
                    partition_max_bytes=self._max_bytes(p),
                )
            )
        req = FetchRequest(
            max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max(cfg.replica_fetch_max_bytes, 1 << 20) * 10,
            isolation_level=0, session_id=0, session_epoch=-1, topics=list(topics.values()),
        )
        if version >= 15:
            req.replica_state = FetchRequest.ReplicaState(replica_id=cfg.node_id, replica_epoch=self.broker_epoch())
        else:
            req.replica_id = cfg.node_id
        return req

    async def _parts_for(self, lane: _Lane) -> list[Partition]:
        """The partitions `lane` fetches next: its own, and those handed to it that the other
        lane no longer fetches (the tail lane waits out the catch-up lane's request for them;
        the catch-up lane skips a partition in the tail lane's long poll, and takes it later)."""
        other = self.catch_up if lane is self.tail else self.tail
        for key, dest in list(self._handover.items()):
            if dest is lane and (lane is self.tail or key not in other.in_flight):
                self._lane_of[key] = lane
                del self._handover[key]
                log.info("replica_fetch_lane", topic=key[0], partition=key[1], leader=self.leader_id, lane=lane.name)
        mine = [k for k, ln in self._lane_of.items() if ln is lane]
        if lane is self.tail and any(k in other.in_flight for k in mine):
            other.cycle_done.clear()
            await other.cycle_done.wait()  # a catch-up request: answered within its short wait
        # a partition the tail lane hands over waits for the catch-up lane's next request (a
        # short wait); one the catch-up lane hands over is fetched by it until the tail takes it
        return [self.partitions[k] for k in mine if k in self.partitions and k not in other.in_flight
                and not (lane is self.tail and self._handover.get(k) is other)]

    async def _run(self, lane: _Lane) -> None:
        while not self._stopping:
            parts = await self._parts_for(lane)
            if not parts:
                lane.wake.clear()
                await lane.wake.wait()
                continue
            pause = self.throttle.pause()
            if pause:
                parts = [p for p in parts if not self.throttle.applies(p.topic, p.index)]
                if not parts:
                    await asyncio.sleep(pause)
                    continue
            client = await self._connect(lane)
            if client is None:
                await asyncio.sleep(BACKOFF_S)
                continue
            try:
                version = client.version_for(FetchRequest.API_KEY)
            except ClientError as e:
                log.debug("follower_fetch_failed", leader=self.leader_id, lane=lane.name, error=str(e))
                await client.close()
                await asyncio.sleep(BACKOFF_S)
                continue
            chain = asyncio.get_running_loop().create_future()
            self._send(lane, client, version, parts, chain)
            outcome = await chain
            if outcome == _RECONNECT:
                await client.close()
            if outcome in (_RECONNECT, _BACKOFF):
                await asyncio.sleep(BACKOFF_S)

    def _send(self, lane: _Lane, client: NodeClient, version: int, parts: list[Partition],
              chain: asyncio.Future) -> None:
        """One Fetch of `lane`. Its answer is applied in the connection's read callback, and the
        next Fetch goes out from there while the lane's partitions stay as they are: a follower's
        acks=all round trip (answer in, appended, next Fetch out) then costs no loop step here.
        `chain` gets how the chain ended, and the lane's task takes over."""
        lane.in_flight = {(p.topic, p.index) for p in parts}
        request = self._request(version, parts, lane.max_wait_ms)
        try:
            answer = client.send_nowait(request, version, timeout=30)
        except ClientError as e:
            self._ended(lane, chain, _RECONNECT, e)
            return
        if answer is None:  # cannot go out at once (socket buffer full, re-authentication due)
            asyncio.get_running_loop().create_task(self._send_later(lane, client, version, request, parts, chain))
            return
        answer.on_done(lambda ev: self._answered(lane, client, version, parts, ev, chain))

    async def _send_later(self, lane: _Lane, client: NodeClient, version: int, request: FetchRequest,
                          parts: list[Partition], chain: asyncio.Future) -> None:
        answer = Eventual()
        try:
            answer.set_result(await client.request(request, version, timeout=30))
        except ClientError as e:
            answer.set_exception(e)
        self._answered(lane, client, version, parts, answer, chain)

    def _answered(self, lane: _Lane, client: NodeClient, version: int, parts: list[Partition], answer: Eventual,
                  chain: asyncio.Future) -> None:
        try:
            resp = answer.result()
        except ClientError as e:
            self._ended(lane, chain, _RECONNECT, e)
            return
        if resp.error_code:
            self._ended(lane, chain, _BACKOFF)
            return
        try:
            plan = self._plan(version, parts, resp)
            if sum(len(pd.records) for _, pd in plan if pd.records) >= THREAD_APPEND_BYTES:
                # a file write can block for tens of milliseconds (ext4 under writeback): a large
                # one goes to a thread, and the loop serves the other lanes and clients meanwhile
                applying = self.append_pool.submit(self._handle_all, plan)
                for p, _ in plan:
                    self.applying[(p.topic, p.index)] = applying
                done = asyncio.wrap_future(applying)
                done.add_done_callback(lambda f: self._appended(lane, client, version, plan, f, chain))
                return
            appended = self._handle_all(plan)
        except Exception:  # a bug must not leave the lane waiting for a chain that ended
            log.exception("follower_fetch_apply_failed", leader=self.leader_id, lane=lane.name)
            self._ended(lane, chain, _BACKOFF)
            return
        self._next(lane, client, version, plan, appended, chain)

    def _appended(self, lane: _Lane, client: NodeClient, version: int, plan: list, done: asyncio.Future,
                  chain: asyncio.Future) -> None:
        for p, _ in plan:
            key = (p.topic, p.index)
            if (applying := self.applying.get(key)) is not None and applying.done():  # not a later one's
                del self.applying[key]
        if done.cancelled():
            self._ended(lane, chain, _BACKOFF)
            return
        if (exc := done.exception()) is not None:
            log.error("follower_fetch_apply_failed", leader=self.leader_id, lane=lane.name, exc_info=exc)
            self._ended(lane, chain, _BACKOFF)
            return
        self._next(lane, client, version, plan, done.result(), chain)

    def _next(self, lane: _Lane, client: NodeClient, version: int, plan: list, appended: list[int | None],
              chain: asyncio.Future) -> None:
        """After a Fetch answer is applied: count it against the throttle, sort its partitions into
        lanes, send the lane's next Fetch."""
        for (p, pd), nbytes in zip(plan, appended, strict=True):
            if nbytes:
                self.throttle.record(p.topic, p.index, nbytes)
            self._sort(lane, p, len(pd.records) if pd.records else 0)
        backoff = None in appended
        self._cycle_done(lane)
        stop = backoff or self._stopping or chain.done() or not client.connected
        nxt = None if stop else self._parts_now(lane)
        if nxt is not None:
            self._send(lane, client, version, nxt, chain)
        elif not chain.done():
            chain.set_result(_BACKOFF if backoff else None)

    def _ended(self, lane: _Lane, chain: asyncio.Future, outcome: str, error: Exception | None = None) -> None:
        if error is not None:
            log.debug("follower_fetch_failed", leader=self.leader_id, lane=lane.name, error=str(error))
        self._cycle_done(lane)
        if not chain.done():
            chain.set_result(outcome)

    def _parts_now(self, lane: _Lane) -> list[Partition] | None:
        """The lane's next partitions when nothing needs the lane's task: no lane moves pending,
        no throttle pause, none of them in the other lane's request. None otherwise."""
        if self._handover or self.throttle.pause():
            return None
        other = self.catch_up if lane is self.tail else self.tail
        mine = [k for k, ln in self._lane_of.items() if ln is lane]
        if not mine or any(k in other.in_flight for k in mine):
            return None
        return [self.partitions[k] for k in mine if k in self.partitions]

    def _plan(self, version: int, parts: list[Partition], resp) -> list[tuple[Partition, Any]]:
        """A Fetch answer's partition results paired with the partitions to apply them to."""
        plan = []
        by_key = {(p.topic, p.index): p for p in parts}
        by_id = {(p.topic_id, p.index): p for p in parts}
        for t in resp.responses:
            for pd in t.partitions:
                p = by_id.get((t.topic_id, pd.partition_index)) if version >= 13 else by_key.get((t.topic, pd.partition_index))
                if p is None or self.partitions.get((p.topic, p.index)) is not p or p.swapping:
                    continue  # no longer ours to follow from this leader, or moving dirs: fetched again
                plan.append((p, pd))
        return plan

    def _handle_all(self, plan: list[tuple[Partition, Any]]) -> list[int | None]:
        """Apply each result to its partition's log (on the loop, or on an append thread: this
        touches the logs only, which have their own lock): the bytes each appended, None for one
        that asks for a backoff."""
        return [self._handle(p, pd) for p, pd in plan]

    def _cycle_done(self, lane: _Lane) -> None:
        lane.in_flight = set()
        lane.cycle_done.set()
        if any(dest is not lane for dest in self._handover.values()):
            (self.catch_up if lane is self.tail else self.tail).wake.set()

    def _sort(self, lane: _Lane, p: Partition, fetched: int) -> None:
        """Which lane fetches `p` next, from what its fetch in `lane` brought."""
        key = (p.topic, p.index)
        max_bytes = self._max_bytes(p)
        if lane is self.tail:
            want = self.catch_up if fetched >= max_bytes // 4 else self.tail
        elif fetched >= max_bytes // 32:
            self._quiet_since.pop(key, None)
            want = self.catch_up
        else:  # back to the tail lane once it has brought little for a while, not at one pause
            now = time.monotonic()
            want = self.tail if now - self._quiet_since.setdefault(key, now) >= QUIET_S else self.catch_up
        if want is lane:
            self._handover.pop(key, None)
        elif self._lane_of.get(key) is lane:
            self._handover[key] = want
            self._quiet_since.pop(key, None)

    def _handle(self, p: Partition, pd) -> int | None:
        """Apply one partition's fetch result: the bytes appended, None to ask for a backoff."""
        lg = p.log
        if pd.error_code == Errors.OFFSET_OUT_OF_RANGE:
            return 0 if self._out_of_range(p, pd) else None
        if pd.error_code:
            log.debug("follower_fetch_partition_error", topic=p.topic, partition=p.index, error_code=pd.error_code)
            return None
        de = pd.diverging_epoch
        if de is not None and de.epoch >= 0:
            self._truncate_diverged(p, de.epoch, de.end_offset)
            return 0
        appended = 0
        hw_before = lg.high_watermark
        try:
            if pd.records:
                appended = lg.append_as_follower(pd.records).bytes
            if pd.log_start_offset > lg.log_start_offset:
                lg.update_high_watermark(min(pd.high_watermark, lg.log_end_offset))
                if pd.log_start_offset <= lg.high_watermark:
                    lg.delete_records_before(pd.log_start_offset)
            lg.update_high_watermark(min(pd.high_watermark, lg.log_end_offset))
        except StorageError as e:
            log.warning("follower_append_failed", topic=p.topic, partition=p.index, error=str(e))
            return None
        p.caught_up_at = time.monotonic()
        if appended or lg.high_watermark != hw_before:
            # long polls parked on this follower (KIP-392 consumers, the diskless materializer)
            # wake now, as Kafka completes delayed fetches when a follower's high watermark moves
            p.notify_data()
        return appended

    def _truncate_diverged(self, p: Partition, leader_epoch: int, leader_end: int) -> None:
        lg = p.log
        epoch, end = lg.leader_epoch_cache.end_offset_for(leader_epoch, lg.log_end_offset)
        target = min(leader_end, end) if epoch >= 0 else min(leader_end, lg.log_end_offset)
        if target < lg.log_end_offset:
            log.info("follower_truncated", topic=p.topic, partition=p.index, from_offset=lg.log_end_offset,
                     to_offset=target, leader_epoch=leader_epoch)
        # even with no record to drop: our epochs starting at the log end go, or the next fetch
        # carries the same last epoch and gets the same answer, forever
        lg.truncate_to(target)

    def _out_of_range(self, p: Partition, pd) -> bool:
        lg = p.log
        if pd.log_start_offset >= 0 and lg.log_end_offset < pd.log_start_offset:
            log.info("follower_reset_to_leader_start", topic=p.topic, partition=p.index, offset=pd.log_start_offset)
            lg.truncate_fully_and_start_at(pd.log_start_offset)
            return True
        if pd.high_watermark >= 0 and lg.log_end_offset > pd.high_watermark:
            # ahead of a leader that lost data it never committed: keep only the committed part
            log.info("follower_truncated", topic=p.topic, partition=p.index, from_offset=lg.log_end_offset,
                     to_offset=pd.high_watermark, reason="ahead_of_leader")
            lg.truncate_to(pd.high_watermark)
            return True
        return False


class ReplicaFetcherManager:
    """Which fetcher follows which partition: one per leader broker."""

    def __init__(self, config: BrokerConfig, leader_endpoint: Callable[[int], Endpoint | None],
                 broker_epoch: Callable[[], int], throttle: Throttle) -> None:
        self.config = config
        self.leader_endpoint = leader_endpoint
        self.broker_epoch = broker_epoch
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self.throttle = throttle
        self.append_pool = ThreadPoolExecutor(max_workers=APPEND_THREADS, thread_name_prefix="follower-append")
        self._following: dict[tuple[str, int], int] = {}

    def follow(self, p: Partition, leader_id: int) -> None:
        key = (p.topic, p.index)
        old = self._following.get(key)
        if old == leader_id and key in self.fetchers.get(leader_id, _EMPTY).partitions:
            return
        self.unfollow(p)
        f = self.fetchers.get(leader_id)
        if f is None:
            f = self.fetchers[leader_id] = ReplicaFetcher(leader_id, self.config, self.leader_endpoint,
                                                          self.broker_epoch, self.throttle, self.append_pool)
        f.add(p)
        self._following[key] = leader_id

    def settle(self, p: Partition) -> None:
        """Wait for an append of `p` under way on a thread (blocking: at most one write). Called
        before its role changes: an old leader's batch must not land after it became leader or
        started following another (as Kafka's fetcher removal waits for the fetch being processed)."""
        key = (p.topic, p.index)
        f = self.fetchers.get(self._following.get(key, -1))
        applying = f.applying.get(key) if f is not None else None
        if applying is not None and not applying.done():
            log.debug("follower_append_settle", topic=p.topic, partition=p.index)
            concurrent.futures.wait([applying])

    def unfollow(self, p: Partition) -> None:
        old = self._following.pop((p.topic, p.index), None)
        if old is not None and old in self.fetchers:
            self.fetchers[old].remove(p)

    async def stop(self) -> None:
        for f in list(self.fetchers.values()):
            await f.stop()
        self.fetchers.clear()
        await asyncio.to_thread(self.append_pool.shutdown)  # appends under way finish first


class _Empty:
    partitions: dict = {}


_EMPTY = _Empty()
