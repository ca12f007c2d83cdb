"""Fetch, through the one partition interface (broker/partitions/): file bytes back to consumers (up to the high watermark, or the last stable offset for
read_committed ones, which also get the aborted transactions overlapping what they receive) and
followers (up to the log end), with long polling (max_wait_ms / min_bytes) and incremental fetch
sessions. Every answer carries the last stable offset; a long poll wakes when the high watermark
moves, which is also when the last stable offset can move (a marker becoming replicated).
The partition router picks what serves each partition: offsets in inactive chunks are answered by
their views (broker/partitions/chunk_views.py), read through the same interface."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from broker.apis.registry import RequestContext, api
from broker.fetch_sessions import FetchSessionError, SessionPartition
from broker.partitions.interface import FetchPosition
from node.waits import Eventual, Suspended, run_now, wait_within
from protocol.errors import Errors
from protocol.generated.fetch import FetchResponse

R = FetchResponse
READ_COMMITTED = 1
SYNC_ANSWER_BYTES = 64 * 1024  # a long poll's answer up to this size goes out in the call that woke it


def _replica_id(req, version: int) -> int:
    if version >= 15 and req.replica_state is not None:
        return req.replica_state.replica_id
    return req.replica_id


@api(1, 4, 17)
async def fetch(ctx: RequestContext, req) -> FetchResponse | Eventual:
    s = ctx.services
    v = ctx.api_version
    by_id = v >= 13
    requested: OrderedDict = OrderedDict()
    for t in req.topics:
        for p in t.partitions:
            key = (t.topic_id if by_id else t.topic, p.partition)
            requested[key] = SessionPartition(
                fetch_offset=p.fetch_offset, max_bytes=p.partition_max_bytes, current_leader_epoch=p.current_leader_epoch,
                last_fetched_epoch=p.last_fetched_epoch,
            )
    forgotten = []
    for t in req.forgotten_topics_data or ():
        for idx in t.partitions:
            forgotten.append((t.topic_id if by_id else t.topic, idx))
    try:
        session, full = s.fetch_sessions.begin(req.session_id, req.session_epoch, requested, forgotten)
    except FetchSessionError as e:
        return R(error_code=e.error_code, session_id=req.session_id)
    parts = session.partitions if session is not None else requested
    replica_id = _replica_id(req, v)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(req.max_wait_ms, 0) / 1000

    def read() -> Coroutine[Any, Any, _Read]:
        return _read(ctx, s.metadata.image, parts, req, replica_id, by_id, full)

    def complete(r: _Read) -> bool:
        return r.total >= req.min_bytes or r.errors or loop.time() >= deadline or not r.wait_on

    while True:
        r = await read()
        if complete(r):
            return _finish(s, session, r)
        if r.at_once:
            return _long_poll(s, session, read, complete, r.wait_on, deadline, replica_id >= 0)
        fut = loop.create_future()
        for p in r.wait_on:
            p.add_data_waiter(fut, replica_id >= 0)
        await wait_within(fut, deadline - loop.time(), False)


def _finish(s, session, r: _Read) -> FetchResponse:
    for sp, pd in r.sent:  # what the client now knows, for the next incremental response
        sp.last_high_watermark, sp.last_log_start, sp.last_stable_offset = (
            pd.high_watermark, pd.log_start_offset, pd.last_stable_offset)
    s.fetch_sessions.finish(session)
    return R(responses=r.topics, session_id=session.id if session is not None else 0)


def _long_poll(s, session, read: Callable[[], Coroutine[Any, Any, _Read]], complete: Callable[[_Read], bool],
               wait_on: list, deadline: float, follower: bool) -> Eventual:
    """The long poll of a Fetch whose partitions all read at once (local replicas): the partition
    that gets data (an append, a high watermark move) reads again in its own call and the answer
    goes out from there. A follower's long poll is then answered in the very step that appended
    the leader's batch, not a loop step later behind other connections' work."""
    loop = asyncio.get_running_loop()
    answer = Eventual()

    def attempt(final: bool) -> None:
        if answer.done():
            return
        try:
            r = run_now(read())
        except Suspended:  # a partition now reads by waiting (it moved): finish in a task
            loop.create_task(_read_then_answer(s, session, read, answer))
            timer.cancel()
            return
        except Exception as e:
            timer.cancel()
            answer.set_exception(e)
            return
        if final or complete(r):
            timer.cancel()
            if r.total > SYNC_ANSWER_BYTES:
                # a large answer (a follower catching up) goes out a step later: the call that
                # brought the data (a bulk append) finishes first, and the work queued behind it
                # does not also wait for a megabyte written to a socket
                loop.call_soon(answer.set_result, _finish(s, session, r))
            else:
                answer.set_result(_finish(s, session, r))
        else:
            park(r.wait_on)

    def park(partitions: list) -> None:
        wake = Eventual()  # one wake for all: the first partition with data settles it
        wake.on_done(lambda _: attempt(False))
        for p in partitions:
            p.add_data_waiter(wake, follower)

    park(wait_on)
    timer = loop.call_later(max(0.0, deadline - loop.time()), attempt, True)
    return answer


async def _read_then_answer(s, session, read, answer: Eventual) -> None:
    # every failure goes to `answer`: the connection reports it (request_failed) and closes
    try:
        r = await read()
    except Exception as e:
        answer.set_exception(e)
    else:
        answer.set_result(_finish(s, session, r))


def _budget(req) -> int:
    return req.max_bytes if req.max_bytes > 0 else 2**31 - 1


@dataclass(slots=True)
class _Read:
    topics: list
    total: int
    wait_on: list  # partitions with nothing to read yet: a long poll waits on them
    errors: bool  # an error, a divergence, a redirect or a proxied read: answer at once
    sent: list  # (session partition, data) of the partitions in the answer
    at_once: bool  # no partition's read waited: the read can be repeated from a synchronous call


async def _read(ctx: RequestContext, image, parts: OrderedDict, req, replica_id: int, by_id: bool,
                full: bool) -> _Read:
    s = ctx.services
    router = s.partitions
    is_follower = replica_id >= 0
    remaining = _budget(req)
    total = 0
    errors = False
    wait_on = []
    by_topic: OrderedDict = OrderedDict()
    sent = []
    read_committed = not is_follower and req.isolation_level == READ_COMMITTED

    def position(sp) -> FetchPosition:
        # what is left of the request's budget, at most the partition's (not min(): on 3.11 each call
        # parses keyword arguments in C, about 1,000 instructions)
        max_bytes = sp.max_bytes if sp.max_bytes < remaining else remaining
        return FetchPosition(fetch_offset=sp.fetch_offset, max_bytes=max_bytes, replica_id=replica_id,
                             last_fetched_epoch=sp.last_fetched_epoch, read_committed=read_committed,
                             min_one_batch=total == 0)

    resolved = []
    waits = False  # whether a read below may wait (then the partitions after it are looked up again)
    for (tkey, idx), sp in parts.items():
        info = image.topics.get(tkey) if by_id else image.topic(tkey)
        pd = R.PartitionData(partition_index=idx, high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, records=b"")
        if info is None:
            p = None
            pd.error_code = Errors.UNKNOWN_TOPIC_ID if by_id else Errors.UNKNOWN_TOPIC_OR_PARTITION
        else:
            # as Kafka: only the leader serves the active chunk, to followers as to consumers; an
            # offset in an inactive chunk is served by that chunk's view
            p, pd.error_code = router.for_fetch(ctx, req, info, idx, sp, replica_id)
            if p is not None:  # all ask at once, then read in order
                waits = p.prepare_read(position(sp)) or waits
        resolved.append((tkey, idx, sp, info, pd, p))
    for tkey, idx, sp, info, pd, p in resolved:
        name = info.name if info is not None else (None if by_id else tkey)
        if p is not None and waits:  # an earlier read may have waited: is this one still served here?
            p, pd.error_code = router.recheck(p, info.name, idx, current_leader_epoch=sp.current_leader_epoch)
        if p is not None:
            ans = await p.read(position(sp))
            pd.error_code = ans.error_code
            pd.high_watermark, pd.last_stable_offset = ans.high_watermark, ans.last_stable_offset
            pd.log_start_offset = ans.log_start_offset
            pd.aborted_transactions = None if ans.aborted_transactions is None else [
                R.AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in ans.aborted_transactions]
            if ans.preferred_read_replica >= 0:
                pd.preferred_read_replica = ans.preferred_read_replica  # KIP-392
            if ans.at_once:
                errors = True
            if ans.diverging is not None:
                pd.diverging_epoch = R.EpochEndOffset(epoch=ans.diverging[0], end_offset=ans.diverging[1])
                errors = True  # answer at once: the follower must truncate before fetching on
            elif ans.size:
                pd.records = ans.records
                s.topic_stats.fetched(name, ans.size, replica_id)
                total += ans.size
                remaining -= ans.size
            elif ans.wait:
                wait_on.append(p)
        if pd.error_code:
            errors = True
        changed = (
            full
            or pd.error_code
            or bool(pd.records)
            or pd.high_watermark != sp.last_high_watermark
            or pd.log_start_offset != sp.last_log_start
            or pd.last_stable_offset != sp.last_stable_offset
            or pd.preferred_read_replica >= 0
        )
        if not changed:
            continue
        sent.append((sp, pd))
        key = name if name is not None else tkey  # a str's hash is cached; a topic id's is Python code
        t = by_topic.get(key)
        if t is None:
            t = by_topic[key] = R.FetchableTopicResponse(topic=name or "", topic_id=info.id if info else tkey)
            if not by_id:
                t.topic_id = R.FetchableTopicResponse().topic_id
        t.partitions.append(pd)
    return _Read(list(by_topic.values()), total, wait_on, errors, sent, at_once=not waits)
