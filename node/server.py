"""The framed request server both process kinds run.

Each connection reads size-prefixed frames and starts a task per request at once, so a client
that pipelines is not held back by one slow request (a long-polling Fetch, an acks=all Produce
waiting on replication); responses still go back in request order, as Kafka clients require.
Tasks start in arrival order and run until their first await in that order, so a handler that
appends before awaiting keeps the client's order of writes.

A handler returns the response as bytes-like parts (without the size prefix), or None when the
request gets no response (acks=0). Malformed input closes only that connection, logged once.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
from collections.abc import Awaitable, Callable

import structlog

from protocol.errors import ProtocolError
from protocol.framing import DEFAULT_MAX_FRAME, FrameReader, frame

log = structlog.get_logger(__name__)

Handler = Callable[[bytes, "Connection"], Awaitable[list | None]]

# Requests one connection may have in flight before we stop reading from it (Kafka clients
# default to at most 5 in flight; tools and followers pipeline more).
MAX_IN_FLIGHT = 100
_conn_ids = itertools.count(1)


class Connection(asyncio.Protocol):
    def __init__(self, handler: Handler, max_frame: int, server: FramedServer) -> None:
        self.handler = handler
        self.reader = FrameReader(max_frame)
        self.server = server
        self.id = next(_conn_ids)
        self.peer = "?"
        self.transport: asyncio.Transport | None = None
        self.pending: collections.deque[asyncio.Task] = collections.deque()
        self.closed = False
        self.reading = True

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except ProtocolError as e:
            self.abort("bad_frame", e)
            return
        for f in frames:
            task = asyncio.get_running_loop().create_task(self._run(f))
            self.pending.append(task)
            task.add_done_callback(self._flush)
        if len(self.pending) >= MAX_IN_FLIGHT and self.reading and self.transport:
            self.transport.pause_reading()
            self.reading = False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and self.reader.pending:
            # The peer went away in the middle of a frame (a truncated request): say so once.
            log.warning("connection_closed_mid_frame", peer=self.peer, pending_bytes=self.reader.pending)
        self.closed = True
        self.server.connections.discard(self)
        for t in self.pending:
            t.cancel()
        self.pending.clear()

    # ---- internals
    async def _run(self, f: bytes) -> list | None:
        return await self.handler(f, self)

    def _flush(self, _task: asyncio.Task) -> None:
        while self.pending and self.pending[0].done():
            task = self.pending.popleft()
            if self.closed:
                continue
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is not None:
                self.abort("request_failed", exc)
                return
            parts = task.result()
            if parts is not None and self.transport is not None:
                self.transport.writelines(frame(parts))
        if not self.reading and len(self.pending) < MAX_IN_FLIGHT // 2 and self.transport and not self.closed:
            self.transport.resume_reading()
            self.reading = True

    def abort(self, why: str, exc: BaseException) -> None:
        """Close this connection only, logging the reason once."""
        if self.closed:
            return
        self.closed = True
        if isinstance(exc, ProtocolError):
            log.warning(why, peer=self.peer, error=str(exc))
        else:
            log.error(why, peer=self.peer, error=repr(exc), exc_info=exc)
        if self.transport is not None:
            self.transport.abort()

    # ---- quota muting (minimal; the admission rework provides the full one)
    _muted_until: float = 0.0

    def mute_for(self, seconds: float) -> None:
        """Stop reading from this connection for `seconds` (a throttled client, KIP-219)."""
        if self.closed or self.transport is None or seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        if until <= self._muted_until:
            return
        self._muted_until = until
        if self.reading:
            self.transport.pause_reading()
        loop.call_later(seconds, self._unmute, until)

    def _unmute(self, until: float) -> None:
        if self.closed or self.transport is None or until != self._muted_until:
            return
        self._muted_until = 0.0
        if self.reading:  # else the in-flight limit holds it paused and resumes it
            self.transport.resume_reading()


class FramedServer:
    def __init__(self, handler: Handler, *, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.handler = handler
        self.max_frame = max_frame
        self.connections: set[Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: Connection(self.handler, self.max_frame, self), host, port, reuse_address=True, backlog=1024
        )
        return self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
        if self._server is not None:
            # uvloop's wait_closed can wait on a connection caught mid-accept; every connection
            # was aborted above, so a bounded wait is enough.
            # (asyncio.wait, not wait_for: wait_for would wait for the cancelled waiter too)
            waiter = asyncio.ensure_future(self._server.wait_closed())
            done, _ = await asyncio.wait({waiter}, timeout=2.0)
            if not done:
                waiter.cancel()
                log.warning("server_close_slow", connections=len(self.connections))
