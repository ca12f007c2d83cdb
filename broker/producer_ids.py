"""The broker's producer ids: blocks the controller hands out (AllocateProducerIds, KIP-730), given
to InitProducerId one id at a time. Blocks are unique cluster-wide (the controller logs each one), so
ids are too, across brokers and restarts.

As Kafka's RPCProducerIdManager, the next block is asked for in the background once 90% of the
current one is used, so InitProducerId almost never waits on the controller. When no id is at hand,
the request waits up to WAIT_FOR_BLOCK_S for the block under way, then answers
COORDINATOR_LOAD_IN_PROGRESS (retriable: clients ask again). Failed asks back off RETRY_BACKOFF_S.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import structlog

from protocol.errors import Errors
from protocol.generated.allocate_producer_ids import AllocateProducerIdsRequest

if TYPE_CHECKING:
    from broker.ports import BrokerEpoch, ControllerLink, TaskSpawner

log = structlog.get_logger(__name__)

PREFETCH_FRACTION = 0.9  # Kafka's: ask for the next block when 90% of this one is handed out
WAIT_FOR_BLOCK_S = 10.0  # an InitProducerId waits at most this long for a block
REQUEST_TIMEOUT_S = 30.0
RETRY_BACKOFF_S = 0.5


class ProducerIdsUnavailable(Exception):
    """No producer id can be handed out right now."""

    def __init__(self, message: str, error_code: int = Errors.COORDINATOR_LOAD_IN_PROGRESS) -> None:
        super().__init__(message)
        self.error_code = error_code


class ProducerIdManager:
    def __init__(
        self,
        broker_id: int,
        controller: ControllerLink,
        broker_epoch: BrokerEpoch,
        spawn: TaskSpawner | None = None,
    ) -> None:
        """`controller` takes AllocateProducerIds; `broker_epoch()` is our current registration
        epoch; `spawn(coro)` runs a background task the owner cancels at shutdown."""
        self.broker_id = broker_id
        self._controller = controller
        self._broker_epoch = broker_epoch
        self._spawn = spawn
        self._next = 0  # next id of the current block
        self._end = 0  # one past the current block's last id
        self._prefetch_at = 0
        self._queued: tuple[int, int] | None = None  # (start, end) of the block fetched ahead
        self._highest_end = 0  # blocks must only go up
        self._fetching: asyncio.Future | None = None  # done (True/False) when the ask under way ends
        self._retry_after = 0.0

    @property
    def current_block(self) -> tuple[int, int]:
        """(next id, end) of the block in use."""
        return self._next, self._end

    async def generate(self) -> int:
        """A producer id never handed out before. Raises ProducerIdsUnavailable."""
        deadline = time.monotonic() + WAIT_FOR_BLOCK_S
        while True:
            if self._next >= self._end and self._queued is not None:
                self._next, self._end = self._queued
                self._prefetch_at = self._next + int((self._end - self._next) * PREFETCH_FRACTION)
                self._queued = None
            if self._next < self._end:
                pid = self._next
                self._next += 1
                if self._next >= self._prefetch_at and self._queued is None:
                    self._start_fetch()
                return pid
            fetch = self._start_fetch()
            remaining = deadline - time.monotonic()
            if fetch is None or remaining <= 0:
                raise ProducerIdsUnavailable("no producer id block from the controller yet")
            try:
                ok = await asyncio.wait_for(asyncio.shield(fetch), remaining)
            except TimeoutError:
                raise ProducerIdsUnavailable("the controller has not answered AllocateProducerIds yet") from None
            if not ok and self._queued is None:
                raise ProducerIdsUnavailable("AllocateProducerIds failed")

    def _start_fetch(self) -> asyncio.Future | None:
        """The ask under way, starting one unless backing off after a failure (then None)."""
        if self._fetching is not None:
            return self._fetching
        if time.monotonic() < self._retry_after:
            return None
        loop = asyncio.get_running_loop()
        done = self._fetching = loop.create_future()
        coro = self._fetch(done)
        if self._spawn is not None:
            self._spawn(coro)
        else:
            loop.create_task(coro)
        return done

    async def _fetch(self, done: asyncio.Future) -> None:
        ok = False
        try:
            req = AllocateProducerIdsRequest(broker_id=self.broker_id, broker_epoch=self._broker_epoch())
            # not re-sent by the link: a failed ask backs off and asks again itself
            resp = await asyncio.wait_for(self._controller.request(req, retry=False), REQUEST_TIMEOUT_S)
            start, length = resp.producer_id_start, resp.producer_id_len
            if resp.error_code != 0:
                log.warning("producer_id_block_refused", error_code=resp.error_code)
            elif start < 0 or length <= 0 or start < self._highest_end:
                log.error("producer_id_block_invalid", start=start, length=length, previous_end=self._highest_end)
            else:
                self._queued = (start, start + length)
                self._highest_end = start + length
                ok = True
                log.info("producer_id_block_received", start=start, length=length)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # connection lost, timeout: ask again after the backoff
            log.warning("producer_id_block_request_failed", error=repr(exc))
        finally:
            if not ok:
                self._retry_after = time.monotonic() + RETRY_BACKOFF_S
            self._fetching = None
            if not done.done():
                done.set_result(ok)
