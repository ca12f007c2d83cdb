"""Share groups on diskless topics: the side of the broker a member talks to.

KIP-932 keeps a share-partition on its partition's leader, and a share consumer fetches from the
broker Metadata names leader. A diskless partition (KIP-1164) is served by every broker, and
Metadata names a gateway in the client's rack as its leader, so members of one share group reach
the partition through different brokers; their records must still be handed out by one
share-partition. The share-partition therefore lives on the partition's leader in the metadata
image (the holder: moved by the controller as any leader, its state in __share_group_state as for
classic topics), and any other broker serves the member's share session itself, reads the records
from the diskless partition itself (no record crosses to the holder and back, which would undo the
gateways' point: KIP-1164, "Reducing multi-DC commit operations"), and forwards to the holder only
what changes the share-partition's state (Strata's SharePartitionForward, 1932): the member's
acknowledgements, the release of its records when its session ends, and the acquisition, which
names the bounds of the batches read (offsets, markers, aborted transactions) and gets back the
offset ranges acquired. A ShareFetch's acknowledgements ride on its first acquisition call.

Where to read is the holder's to say (the first available record, else the window's end): each
answer carries it, kept here per (group, partition) as the offset of the next read. A read at a
stale offset costs one more round: the holder acquires only from batches holding its next fetch
offset, else answers where to read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import structlog

from broker.share.partition import Acquired
from node.client import ClientError
from node.logging import RateLimitedLog
from protocol.errors import Errors
from protocol.generated.share_partition_forward import SharePartitionForwardRequest

if TYPE_CHECKING:
    from broker.replication.peers import PeerClients

log = structlog.get_logger(__name__)
# every member's fetch asks again while a holder is away (a few times a second): a few lines say so
limited = RateLimitedLog(log, burst=10, interval_s=10.0)

Key = tuple[str, str, int]  # (group, topic, partition)
F = SharePartitionForwardRequest
REQUEST_TIMEOUT_S = 10.0
# an acquisition that found nothing is retried a few times when the holder names another offset
READ_ROUNDS = 3
# the holder being away (killed, not yet replaced in the image, its image behind ours) is not the
# member's error: the fetch answers nothing and the next one asks again
PASSING = frozenset({Errors.NOT_LEADER_OR_FOLLOWER, Errors.FENCED_LEADER_EPOCH, Errors.LEADER_NOT_AVAILABLE,
                     Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                     Errors.NOT_COORDINATOR, Errors.REQUEST_TIMED_OUT})


@dataclass(slots=True)
class ReadBatches:
    """A read of a partition for a share-partition: its batches (header, bytes) from the one
    holding the offset read at, the base offsets of batches of aborted transactions
    (read_committed; None: not asked) and the log start offset (-1: unknown)."""

    error: int
    batches: list[tuple[Any, memoryview]]
    aborted: set[int] | None = None
    log_start: int = -1
    below_start: bool = False  # the offset read at was deleted: the window moves to log_start


@dataclass(frozen=True, slots=True)
class Holder:
    """Where a diskless partition's share-partition lives: the broker and its leader epoch."""

    broker: int
    leader_epoch: int
    topic_id: UUID


class ShareForwarder:
    def __init__(self, peers: PeerClients) -> None:
        self.peers = peers
        self._next_offsets: dict[Key, int] = {}  # where to read next, as the holder last said
        self._refresh: set[Key] = set()  # share sessions opened since: the next acquisition says so

    def session_opened(self, key: Key) -> None:
        self._refresh.add(key)

    async def _call(self, holder: Holder, req: Any) -> Any | None:
        """The holder's answer; None when it cannot be reached (logged)."""
        try:
            client = await self.peers.get(holder.broker)
            return await client.request(req, 0, timeout=REQUEST_TIMEOUT_S)
        except (TimeoutError, ClientError, OSError) as e:
            limited.warning("share_forward_failed", holder=holder.broker, error=str(e))
            await self.peers.drop(holder.broker)
            return None

    def _request(self, key: Key, holder: Holder, member_id: str, **fields: Any) -> Any:
        return F(group_id=key[0], member_id=member_id, topic_id=holder.topic_id, partition=key[2],
                 leader_epoch=holder.leader_epoch, **fields)

    async def acknowledge(self, key: Key, holder: Holder, member_id: str, batches: list[tuple[int, int, list[int]]],
                          renew: bool, release_all: bool = False) -> int:
        """The member's acknowledgements (and, with `release_all`, the release of what it
        holds), applied by the holder: its error, answered once the holder wrote the state."""
        resp = await self._call(holder, self._request(
            key, holder, member_id, is_renew_ack=renew, release_all=release_all, max_records=0,
            acknowledgement_batches=[F.AcknowledgementBatch(first_offset=f, last_offset=last, acknowledge_types=t)
                                     for f, last, t in batches]))
        if release_all:
            # a session ended: the offset kept for its partitions goes (another member's next
            # acquisition asks the holder afresh), so the map holds only partitions still read
            self.forget(key)
            return resp.error_code if resp is not None else Errors.NOT_LEADER_OR_FOLLOWER
        if resp is None:
            return Errors.NOT_LEADER_OR_FOLLOWER
        if resp.error_code:
            self._next_offsets.pop(key, None)
            return resp.error_code
        if resp.next_fetch_offset >= 0:
            self._next_offsets[key] = resp.next_fetch_offset
        return resp.acknowledge_error_code

    async def acquire(self, key: Key, holder: Holder, member_id: str, max_records: int,
                      read: Callable[[int], Awaitable[ReadBatches]], acks: list[tuple[int, int, list[int]]] | None = None
                      ) -> tuple[int, Acquired | None, int]:
        """(error, what the holder acquired for the member among the batches `read` here, None
        when nothing was; the error of applying `acks`, the member's acknowledgements of this
        ShareFetch, which ride on the first call: one round trip, not two)."""
        offset = self._next_offsets.get(key, -1)
        refresh = key in self._refresh
        self._refresh.discard(key)
        ack_err = 0
        for _ in range(READ_ROUNDS):
            r = ReadBatches(0, []) if offset < 0 else await read(offset)
            if r.error and not acks:
                return r.error, None, ack_err
            aborted = r.aborted or set()
            resp = await self._call(holder, self._request(
                key, holder, member_id, refresh_idle=refresh, max_records=0 if r.error else max_records,
                log_start_offset=r.log_start, acknowledgement_batches=[
                    F.AcknowledgementBatch(first_offset=f, last_offset=last, acknowledge_types=t)
                    for f, last, t in acks or ()],
                batches=[F.ReadBatch(base_offset=h.base_offset, last_offset=h.last_offset, is_control=h.is_control,
                                     is_aborted=h.base_offset in aborted)
                         for h, _ in r.batches]))
            if acks:  # applied (or refused) once, whatever the acquisition gives
                ack_err = (Errors.NOT_LEADER_OR_FOLLOWER if resp is None else
                           resp.error_code or resp.acknowledge_error_code)
                acks = None
            refresh = False
            if r.error:
                return r.error, None, ack_err
            if resp is None or resp.error_code in PASSING:
                self._next_offsets.pop(key, None)
                return 0, None, ack_err
            if resp.error_code:
                return resp.error_code, None, ack_err
            self._next_offsets[key] = resp.next_fetch_offset
            if resp.acquired_records:
                ranges = [(a.first_offset, a.last_offset, a.delivery_count) for a in resp.acquired_records]
                return 0, Acquired([raw for h, raw in r.batches if _overlaps(h.base_offset, h.last_offset, ranges)],
                                   ranges), ack_err
            if resp.next_fetch_offset < 0 or resp.next_fetch_offset == offset:
                return 0, None, ack_err  # nothing to acquire now
            offset = resp.next_fetch_offset  # released records below, or acquired by another member
        return 0, None, ack_err

    def forget(self, key: Key) -> None:
        self._next_offsets.pop(key, None)
        self._refresh.discard(key)

    async def close(self) -> None:
        await self.peers.close()


def _overlaps(first: int, last: int, ranges: list[tuple[int, int, int]]) -> bool:
    return any(f <= last and first <= lst for f, lst, _ in ranges)
