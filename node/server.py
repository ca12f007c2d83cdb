"""The framed request server both process kinds run, with Kafka's admission model.

Admission (Kafka's SocketServer: a connection is muted after a request is read until its response
is sent; KIP-219 mutes it further while a client is throttled):
- **Bounded in flight per connection.** At most `max_in_flight` requests of a connection are
  being handled (the broker's client listener: 1, as Kafka). Requests read beyond that wait in the
  connection's queue, and once one complete request waits there, reading stops
  (`pause_reading`: the client's further requests stay in its socket, TCP pushes back). Reading
  ahead of one request overlaps the next request's transfer with the current one's handling.
- **Round robin across connections.** A connection with a request it may start joins the tail of
  a ready queue; requests start one per connection in that order, at most
  `NORMAL_STARTS_PER_TICK` per event-loop step (the rest in the next step), so a new connection's
  request waits behind at most one request per busy connection. A connection rejoins at the tail
  after its response is handed to the transport (and the transport is not over its write-buffer
  high-water mark: a slow reader is not fed more work than it takes away). Within the step's
  budget a request starts from the read callback that completed it: its task runs in the step
  right after the reads; when no connection waits for its turn, a request starts at once.
- **Held back while the loop is late** (`admission.lag.target.ms`, node/loop_lag.LagAdmission):
  a client request of 64 KiB or more (a bulk produce) whose turn comes while the event loop runs
  later than the target mutes its connection for a few times the lag and waits its turn again,
  for at most 100 ms in all: a loop that stays late paces large requests, never stops them.
  A saturating producer then cannot keep the loop busy with megabytes while small requests and
  replication wait behind them and behind the other processes holding the CPU.
- **Control plane first.** The handler may classify a request as control plane (the broker:
  follower fetches, group and transaction coordinator requests); such a request starts as soon
  as it is read, ahead of any client request waiting for its turn and outside the budget.
- A connection's responses go back in request order, and its requests start in arrival order
  (each runs until its first await before the next starts), so a handler that appends before
  awaiting keeps the client's order of writes.
- **Released requests.** A handler whose writes are ordered already and whose answer only waits
  (a diskless Produce waiting for its shared WAL file) may call `release()`: it stops counting
  against `max_in_flight`, so the connection's next request starts, while the answers still go
  back in order. At most `MAX_RELEASED` per connection (the clients' 5 in-flight requests):
  without it, each of librdkafka's pipelined produce requests waits a whole WAL interval behind
  the one before.
- **Memory** (`queued.max.request.bytes`): bytes of requests being read, queued or handled are
  counted against one budget per server. A frame whose 4-byte size has been read reserves its full
  size; when the budget is spent, the connection stops reading until memory is released (as
  Kafka's non-strict memory pool: one reservation may overshoot, so a request larger than the
  budget still gets through alone).
- **Connection limits** (`max.connections`, `max.connections.per.ip` and its overrides): a
  connection over a limit is closed as soon as it is accepted. **Idle connections**
  (`connections.max.idle.ms`, nothing read or written and nothing in flight) are closed.

A handler returns the response as bytes-like parts (without the size prefix), or None when the
request gets no response (acks=0), or an Eventual of either: the answer is written when it is
set, from the call that sets it (still in request order). Malformed input closes only that connection, logged
(rate-limited: an abusive peer cannot flood the log).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import functools
import itertools
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from node.config import ConfigError, NodeConfig
from node.file_sender import FileSender
from node.logging import RateLimitedLog
from node.loop_lag import LagAdmission
from node.sasl import PASS_ON, Authenticator
from node.security import ANONYMOUS, ListenerSecurity
from node.waits import READ_SLICE, Eventual, read_next_step
from protocol.errors import ProtocolError
from protocol.file_region import RegionParts
from protocol.framing import DEFAULT_MAX_FRAME, FrameReader, frame, frame_joined

log = structlog.get_logger(__name__)
limited = RateLimitedLog(log)

# the answer: its parts, None (no answer), or an Eventual settled with either later
Handler = Callable[[bytes, "Connection"], Awaitable[list | Eventual | None]]
Classifier = Callable[[bytes], bool]

INT_MAX = 2**31 - 1
# Client requests the pump starts before it lets the loop read sockets again (and so start any
# control-plane request that arrived meanwhile). Small: each may be a 1 MB produce.
NORMAL_STARTS_PER_TICK = 4
ACCEPTS_PER_WAKEUP = 64  # bounded, so a connection storm cannot hold the loop
MAX_RELEASED = 5  # released requests per connection (max.in.flight.requests.per.connection)
ACCEPT_RETRY_S = 0.1  # pause after an accept failed for lack of descriptors or memory
TLS_HANDSHAKE_TIMEOUT_S = 10.0
_conn_ids = itertools.count(1)


@dataclass(frozen=True)
class ConnectionLimits:
    """Kafka's per-listener connection settings (defaults are Kafka's, except where noted)."""

    max_in_flight: int = 1  # Kafka's muting: one request of a connection at a time
    max_connections: int = INT_MAX
    max_connections_per_ip: int = INT_MAX
    per_ip_overrides: dict[str, int] = field(default_factory=dict)
    idle_ms: int | None = 600_000  # connections.max.idle.ms; None: never closed for idleness
    # queued.max.request.bytes; 0 or less is unbounded (Kafka's default -1; the broker sets 500 MiB)
    queued_max_request_bytes: int = -1

    def limit_for(self, ip: str) -> int:
        return self.per_ip_overrides.get(ip, self.max_connections_per_ip)

    @classmethod
    def from_config(cls, cfg: NodeConfig, **defaults: int) -> ConnectionLimits:
        """Kafka's keys; `defaults` replaces Kafka's default of a key (by field name)."""
        def read(key: str, name: str, kafka_default: int, least: int) -> int:
            value = cfg.int(key, defaults.get(name, kafka_default))
            if value < least:
                raise ConfigError(f"{key}: {value} is below {least}")
            return value

        per_ip = read("max.connections.per.ip", "max_connections_per_ip", INT_MAX, 0)
        overrides = parse_ip_overrides(cfg.str("max.connections.per.ip.overrides", ""))
        if per_ip == 0 and not overrides:
            raise ConfigError("max.connections.per.ip.overrides must be set when max.connections.per.ip is 0")
        return cls(
            max_connections=read("max.connections", "max_connections", INT_MAX, 0),
            max_connections_per_ip=per_ip,
            per_ip_overrides=overrides,
            idle_ms=read("connections.max.idle.ms", "idle_ms", 600_000, 1),
            queued_max_request_bytes=read("queued.max.request.bytes", "queued_max_request_bytes", -1, -1),
        )


def certificate_principal(cert: dict) -> str:
    """A client certificate's subject as an RFC 2253 name, most specific first (Kafka's default
    principal for SSL: ``CN=client,OU=dev,O=strata``)."""
    rdns = [",".join(f"{k}={v}" for k, v in rdn) for rdn in cert.get("subject", ())]
    short = {"commonName": "CN", "organizationalUnitName": "OU", "organizationName": "O", "localityName": "L",
             "stateOrProvinceName": "ST", "countryName": "C", "domainComponent": "DC"}
    for long, abbrev in short.items():
        rdns = [r.replace(f"{long}=", f"{abbrev}=") for r in rdns]
    return ",".join(reversed(rdns))


def parse_ip_overrides(value: str) -> dict[str, int]:
    """max.connections.per.ip.overrides: ``host:count,host:count`` (host names are resolved once)."""
    out: dict[str, int] = {}
    for item in filter(None, (x.strip() for x in value.split(","))):
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.isdigit():
            raise ConfigError(f"max.connections.per.ip.overrides: {item!r} is not HOST:COUNT")
        try:
            ip = socket.gethostbyname(host.strip("[]"))
        except OSError:
            raise ConfigError(f"max.connections.per.ip.overrides: cannot resolve {host!r}") from None
        out[ip] = int(count)
    return out


class Connection(asyncio.Protocol):
    def __init__(self, server: FramedServer) -> None:
        self.server = server
        # made in the loop (its protocol factory): asyncio.get_running_loop() checks the process id,
        # a syscall, on every call, and the request path would call it several times a request
        self.loop = asyncio.get_running_loop()
        self.handler = server.handler
        self.reader = FrameReader(server.max_frame)
        self.id = next(_conn_ids)
        self.peer = "?"
        self.ip = "?"
        # (name, version) from ApiVersions v3+ (KIP-511): part of a KIP-714 client's identity
        self.client_software = ("", "")
        self.transport: asyncio.Transport | None = None
        # (frame, control, size, the loop time its bytes were read)
        self.queue: collections.deque[tuple[bytes, bool, int, float]] = collections.deque()
        self.pending: collections.deque[tuple[asyncio.Task, int]] = collections.deque()  # (task, size)
        # their sizes summed as they change (a client pipelining 20,000 ListOffsets made a sum per frame quadratic)
        self.queued_bytes = 0
        self.pending_bytes = 0
        self.released: set[asyncio.Task] = set()  # pending tasks that no longer count as in flight
        self.answers: dict[asyncio.Task, list | None] = {}  # pending tasks' answers not yet written
        self.deferred: set[asyncio.Task] = set()  # pending tasks done, their answer still to come (Eventual)
        self.closed = False
        self.registered = False
        self.reading = True
        self.write_paused = False
        self.muted_until = 0.0
        self.in_ready = False
        self.held_back = 0.0  # seconds the next request has waited for loop lag (LagAdmission)
        self.last_active = 0.0
        self.request_read_at = 0.0  # of the request whose handler is starting (see _serve)
        self.request_control = False
        # bytes this connection holds against the server's budget: queued and in-flight frames
        # plus the reservation for the frame being read
        self.held = 0
        self.partial_reserved = 0
        self.waiting_for_memory = False
        # Kafka's principal: a SASL user, a client certificate's subject, else ANONYMOUS
        self.principal = ANONYMOUS
        self.listener = server.listener_name
        # None on PLAINTEXT and SSL listeners: the request path's only cost is this check
        self.auth: Authenticator | None = None
        # answers holding FileRegions (node/file_sender.py), made on the first; `sending` while
        # its queue holds answers: later answers queue behind them and no request starts
        self.sender: FileSender | None = None
        self.sending = False
        self.sock_fd: int | None = None  # a plaintext socket's descriptor, for os.sendfile
        self._close_callbacks: list[Callable[[], None]] | None = None

    # ---- public
    def mute_for(self, seconds: float) -> None:
        """Stop reading from and starting requests of this connection for `seconds` (KIP-219:
        a throttled client's channel is muted after its response for the throttle time). The
        in-flight bound applies again afterwards."""
        if self.closed or seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        if until <= self.muted_until:
            return
        self.muted_until = until
        self._update_reading()
        loop.call_at(until, self._unmute)

    def release(self) -> None:
        """Called by the running handler: its writes are ordered, its answer only waits; the
        connection may start its next request (the answers still go back in order)."""
        task = asyncio.current_task()
        if (self.closed or task is None or task in self.released or len(self.released) >= MAX_RELEASED
                or not any(t is task for t, _ in self.pending)):
            return
        self.released.add(task)
        self._maybe_ready()
        self._update_reading()

    def on_close(self, callback: Callable[[], None]) -> None:
        """Call `callback` once, when the connection is lost (at once if it already was)."""
        if self.closed:
            callback()
        elif self._close_callbacks is None:
            self._close_callbacks = [callback]
        else:
            self._close_callbacks.append(callback)

    @property
    def in_flight(self) -> int:
        return len(self.pending) - len(self.released)

    @property
    def muted(self) -> bool:
        return self.muted_until > 0.0

    # ---- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if peer:
            self.ip = peer[0]
            self.peer = f"{peer[0]}:{peer[1]}"
        security = self.server.security
        if security is not None:
            cert = transport.get_extra_info("peercert") if security.ssl is not None else None
            if cert:
                self.principal = "User:" + certificate_principal(cert)
            if security.sasl is not None:
                self.auth = Authenticator(security.sasl, self.peer, security.name)
        if self.server.ssl is None:
            sock = transport.get_extra_info("socket")
            self.sock_fd = sock.fileno() if sock is not None else None
        self.last_active = self.loop.time()
        self.server.admit(self)
        self.registered = True

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.last_active = now = self.loop.time()
        try:
            frames = self.reader.feed(data)
        except ProtocolError as e:
            self.abort("bad_frame", e)
            return
        classify = self.server.classify
        for f in frames:
            size = len(f) + 4
            control = classify(f) if classify is not None else False
            self.queue.append((f, control, size, now))
            self.queued_bytes += size
        if frames:
            self.partial_reserved = 0  # the reserved frame is complete: now counted as queued
        self._account()
        self._maybe_ready()
        self._update_reading()
        if self.reading and self.reader.pending >= READ_SLICE and self.transport is not None:
            read_next_step(self.transport, lambda: self.reading and not self.closed)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._maybe_ready()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed and self.reader.pending:
            # The peer went away in the middle of a frame (a truncated request): say so.
            limited.warning("connection_closed_mid_frame", peer=self.peer, pending_bytes=self.reader.pending)
        self.closed = True
        self._drop_sender()
        for t, _ in self.pending:
            t.cancel()
        self.pending.clear()
        self.released.clear()
        self.answers.clear()
        self.deferred.clear()
        self.queue.clear()
        self.queued_bytes = self.pending_bytes = 0
        if self.registered:
            self.registered = False
            self.server.forget(self)
        callbacks, self._close_callbacks = self._close_callbacks, None
        for callback in callbacks or ():
            callback()

    # ---- admission
    def can_start(self) -> bool:
        # in_flight and muted spelled out: this runs several times a request
        return (
            bool(self.queue)
            and len(self.pending) - len(self.released) < self.server.limits.max_in_flight
            and not self.closed
            and self.muted_until <= 0.0
            and not self.write_paused
            and not self.sending
        )

    def start_next(self) -> None:
        f, control, size, read_at = self.queue.popleft()
        box: list[asyncio.Task] = []  # the task, for _serve to know itself without current_task()
        task = self.loop.create_task(self._serve(f, control, read_at, box))
        box.append(task)
        self.queued_bytes -= size
        self.pending.append((task, size))
        self.pending_bytes += size
        task.add_done_callback(self._flush)  # a failed or cancelled request

    async def _serve(self, f: bytes, control: bool, read_at: float, box: list[asyncio.Task]) -> None:
        # The answer goes out from the request's own task, not from a done callback a loop
        # step later (a step that, on a busy loop, waits behind other connections' I/O).
        # What the handler may read before its first await (the request metrics do): when its
        # request was read off the socket and whether it is control-plane traffic.
        self.request_read_at, self.request_control = read_at, control
        auth = self.auth
        if auth is not None and auth.intercepts(f):
            parts = auth.handle(f)
            if auth.principal is not None:
                self.principal = auth.principal
            if parts is PASS_ON:
                parts = await self.handler(f, self)
        else:
            parts = await self.handler(f, self)
        task = box[0]  # this coroutine runs as its own task
        if isinstance(parts, Eventual) and not parts.done():
            # answered later, by whatever settles it (an acks=all Produce: the follower's Fetch
            # moving the high watermark), in that call; the answers behind it wait their turn
            self.deferred.add(task)
            parts.on_done(lambda ev: self._answer_later(task, ev))
            return
        if isinstance(parts, Eventual):
            parts = parts.result()
        if not self.closed and any(t is task for t, _ in self.pending):
            self.answers[task] = parts  # type: ignore[assignment]
            self._flush()
        if auth is not None and auth.failed and not self.closed:
            # authentication failed: the answer (if any) is written, then the connection closes
            self.closed = True
            self._drop_sender()
            if self.transport is not None:
                self.transport.close()

    def _answer_later(self, task: asyncio.Task, ev: Eventual) -> None:
        self.deferred.discard(task)
        if self.closed or not any(t is task for t, _ in self.pending):
            return
        try:
            self.answers[task] = ev.result()
        except Exception as e:
            self.abort("request_failed", e)
            return
        self._flush()

    def _maybe_ready(self) -> None:
        if not self.in_ready and self.can_start():
            self.in_ready = True
            self.server.ready(self, self.queue[0][1])

    def _update_reading(self) -> None:
        if self.transport is None or self.closed:
            return
        bound = self.server.limits.max_in_flight
        in_flight = len(self.pending) - len(self.released)
        queued = len(self.queue)
        # read ahead of the bound by one request, no further
        want = (
            self.muted_until <= 0.0
            and not self.waiting_for_memory
            and queued + in_flight <= bound
            and not (queued and in_flight >= bound)
        )
        if want != self.reading:
            self.reading = want
            if want:
                self.transport.resume_reading()
            else:
                self.transport.pause_reading()

    def _unmute(self) -> None:
        if self.closed or not self.muted:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self.muted_until:
            # a later mute_for moved the deadline, or the timer fired early (uvloop's timers tick
            # in milliseconds): wait out the rest, never stay muted with no timer pending
            loop.call_at(self.muted_until, self._unmute)
            return
        self.muted_until = 0.0
        self._update_reading()
        self._maybe_ready()

    def _account(self) -> None:
        """Recount this connection's bytes against the server's budget."""
        queued = self.queued_bytes
        in_flight = self.pending_bytes
        want = self.reader.incomplete_size
        partial = self.reader.pending
        if want is None:
            self.partial_reserved = 0
        elif not self.partial_reserved and not self.waiting_for_memory:
            # a new frame's size is known: reserve all of it, or stop reading until memory frees
            # (waiters are granted in turn by the server, never here)
            if self.server.memory_available():
                self.partial_reserved = want
            else:
                self.server.wait_for_memory(self)
        reserved = self.partial_reserved
        held = (partial if partial > reserved else reserved) + queued + in_flight
        self.server.add_held(held - self.held)
        self.held = held

    def grant_memory(self) -> None:
        """The server has memory again: reserve the waiting frame and read on."""
        self.waiting_for_memory = False
        want = self.reader.incomplete_size
        if want is not None:
            self.partial_reserved = want
        self._account()
        self._update_reading()

    def _flush(self, _task: asyncio.Task | None = None) -> None:
        released = False
        while self.pending:
            task = self.pending[0][0]
            answered = task in self.answers
            if not answered and (not task.done() or task in self.deferred):
                break
            self.pending_bytes -= self.pending.popleft()[1]
            self.released.discard(task)
            released = True
            if answered:
                parts = self.answers.pop(task)
            elif self.closed or task.cancelled():
                continue
            elif (exc := task.exception()) is not None:
                self.abort("request_failed", exc)
                return
            else:
                continue  # answered and written already
            if parts is not None and self.transport is not None and not self.closed:
                if type(parts) is RegionParts or self.sending:
                    self._send_regions(frame(parts))
                else:
                    self.transport.writelines(frame_joined(parts))
                self.last_active = self.loop.time()
        if released and not self.closed:
            self._account()
            self.server.memory_released()
            self._maybe_ready()
            self._update_reading()

    def _send_regions(self, framed: list) -> None:
        sender = self.sender
        if sender is None:
            assert self.transport is not None
            sender = self.sender = FileSender(self.transport, self.sock_fd, self._sent_regions,
                                              lambda e: self.abort("send_failed", e))
        self.sending = True
        sender.send(framed)

    def _sent_regions(self) -> None:
        """The region path's queue is empty: the transport writes again, requests may start."""
        self.sending = False
        self.last_active = self.loop.time()
        if not self.closed:
            self._maybe_ready()

    def _drop_sender(self) -> None:
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        self.sending = False

    def abort(self, why: str, exc: BaseException) -> None:
        """Close this connection only, logging the reason (rate-limited for peer errors)."""
        if self.closed:
            return
        self._drop_sender()
        if isinstance(exc, ProtocolError):
            limited.warning(why, peer=self.peer, error=str(exc))
        else:
            log.error(why, peer=self.peer, error=repr(exc), exc_info=exc)
        if self.transport is not None:
            self.transport.abort()  # connection_lost follows and releases everything
        self.closed = True


class FramedServer:
    def __init__(
        self,
        handler: Handler,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        limits: ConnectionLimits | None = None,
        classify: Classifier | None = None,
        security: ListenerSecurity | None = None,
        connection_rate: Callable[[str], float | None] | None = None,
        admission: LagAdmission | None = None,
    ) -> None:
        self.handler = handler
        self.admission = admission
        # an IP's connection_creation_rate quota (connections/s), None for none (KIP-612)
        self.connection_rate = connection_rate
        self._ip_tokens: dict[str, tuple[float, float]] = {}  # ip -> (tokens, when)
        self.listener_name = security.name if security is not None else None
        # None: PLAINTEXT (no TLS, no SASL, every connection ANONYMOUS)
        self.security = security if security is not None and security.protocol != "PLAINTEXT" else None
        self.ssl = security.ssl if security is not None else None
        self.max_frame = max_frame
        self.limits = limits or ConnectionLimits()
        self.classify = classify
        self.connections: set[Connection] = set()
        self.per_ip: collections.Counter[str] = collections.Counter()
        self.held_bytes = 0
        self._ready: collections.deque[Connection] = collections.deque()
        self._started = 0  # client requests started in this loop step
        self._memory_waiters: collections.deque[Connection] = collections.deque()
        self._pump_scheduled = False
        self._listener: socket.socket | None = None
        self._accepting = 0  # accepted sockets whose Connection is not made yet
        self._setup: set[asyncio.Task] = set()
        self._idle_task: asyncio.Task | None = None

    async def start(self, host: str, port: int) -> int:
        # Our own accept loop (not loop.create_server): libuv answers an accept failing with
        # EMFILE by silently accepting and closing the waiting connections; here the failure is
        # logged and accepting pauses briefly (the connections wait in the backlog), and a
        # connection over a limit is closed before a protocol is built for it.
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(1024)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listener = sock
        loop.add_reader(sock.fileno(), self._accept)
        if self.limits.idle_ms is not None:
            self._idle_task = loop.create_task(self._close_idle())
        return sock.getsockname()[1]

    def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._listener is not None
        for _ in range(ACCEPTS_PER_WAKEUP):
            try:
                sock, addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:
                # EMFILE/ENFILE/ENOBUFS/ENOMEM: out of descriptors or memory. Pause accepting
                # (as asyncio does) so the loop does not spin on a ready listener.
                limited.warning("accept_failed", errno=errno.errorcode.get(e.errno or 0, e.errno), error=e.strerror,
                                connections=len(self.connections), retry_in_s=ACCEPT_RETRY_S)
                loop.remove_reader(self._listener.fileno())
                loop.call_later(ACCEPT_RETRY_S, self._resume_accepting)
                return
            ip = addr[0]
            refused = self.refusal(ip)
            if refused is not None:
                limited.warning("connection_refused", reason=refused, peer=f"{ip}:{addr[1]}")
                sock.close()
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.per_ip[ip] += 1  # counted from accept: a burst cannot overshoot the limits
            self._accepting += 1
            if self.ssl is not None:
                setup = loop.connect_accepted_socket(lambda: Connection(self), sock, ssl=self.ssl,
                                                     ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
            else:
                setup = loop.connect_accepted_socket(lambda: Connection(self), sock)
            task = loop.create_task(setup)
            task.peer = f"{ip}:{addr[1]}"  # type: ignore[attr-defined]
            self._setup.add(task)
            task.add_done_callback(functools.partial(self._set_up, ip=ip))

    def _set_up(self, task: asyncio.Task, ip: str) -> None:
        self._setup.discard(task)
        self._accepting -= 1
        if task.cancelled() or task.exception() is not None:
            self._drop_ip(ip)
            exc = None if task.cancelled() else task.exception()
            where = {"peer": getattr(task, "peer", ip), "listener": self.security.name if self.security else None}
            if isinstance(exc, ConnectionError):
                # gone before a TLS byte came (a port probe): nothing to report
                log.debug("tls_handshake_aborted", error=repr(exc), **where)
            elif exc is not None:
                # a TLS handshake that failed: a plaintext client, a bad or missing certificate
                limited.warning("tls_handshake_failed", error=repr(exc), **where)

    def _resume_accepting(self) -> None:
        if self._listener is not None:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept)

    # ---- connection limits
    def refusal(self, ip: str) -> str | None:
        """Why a new connection from `ip` is refused, or None (max.connections, per ip)."""
        if len(self.connections) + self._accepting >= self.limits.max_connections:
            return f"max.connections={self.limits.max_connections} reached"
        limit = self.limits.limit_for(ip)
        if self.per_ip[ip] >= limit:
            return f"max.connections.per.ip={limit} reached for {ip}"
        rate = self.connection_rate(ip) if self.connection_rate is not None else None
        if rate is not None and not self._take_connection_token(ip, rate):
            return f"connection_creation_rate={rate:g}/s exceeded for {ip}"
        return None

    def _take_connection_token(self, ip: str, rate: float) -> bool:
        """A token bucket per IP holding up to a second of the rate (at least one connection)."""
        now = time.monotonic()
        cap = max(rate, 1.0)
        tokens, when = self._ip_tokens.get(ip, (cap, now))
        tokens = min(cap, tokens + (now - when) * rate)
        if len(self._ip_tokens) > 100_000:  # many IPs come and go: forget the full buckets
            self._ip_tokens = {k: v for k, v in self._ip_tokens.items() if v[0] < cap}
        if tokens < 1.0:
            self._ip_tokens[ip] = (tokens, now)
            return False
        self._ip_tokens[ip] = (tokens - 1.0, now)
        return True

    def admit(self, conn: Connection) -> None:
        self.connections.add(conn)

    def _drop_ip(self, ip: str) -> None:
        self.per_ip[ip] -= 1
        if self.per_ip[ip] <= 0:
            del self.per_ip[ip]

    def forget(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self._drop_ip(conn.ip)
        self.add_held(-conn.held)
        conn.held = 0
        if conn.waiting_for_memory:
            conn.waiting_for_memory = False
            self._memory_waiters.remove(conn)
        self.memory_released()

    async def _close_idle(self) -> None:
        assert self.limits.idle_ms is not None
        idle_s = self.limits.idle_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(max(idle_s / 10, 0.05), 30.0))
            now = loop.time()
            stale = [
                c for c in self.connections
                if now - c.last_active > idle_s and not c.pending and not c.queue and c.transport is not None
            ]
            for c in stale:
                c.closed = True
                c.transport.abort()  # type: ignore[union-attr]
            if stale:
                log.info("connections_idle_closed", count=len(stale), idle_ms=self.limits.idle_ms)

    # ---- memory (queued.max.request.bytes)
    def add_held(self, delta: int) -> None:
        self.held_bytes += delta

    def memory_available(self) -> bool:
        cap = self.limits.queued_max_request_bytes
        return cap <= 0 or self.held_bytes < cap  # as Kafka: 0 or less is unbounded

    def wait_for_memory(self, conn: Connection) -> None:
        if not conn.waiting_for_memory:
            conn.waiting_for_memory = True
            self._memory_waiters.append(conn)
            limited.warning("request_memory_full", queued_max_request_bytes=self.limits.queued_max_request_bytes,
                            held_bytes=self.held_bytes, waiting=len(self._memory_waiters))

    def memory_released(self) -> None:
        while self._memory_waiters and self.memory_available():
            self._memory_waiters.popleft().grant_memory()

    # ---- round robin
    def ready(self, conn: Connection, control: bool) -> None:
        if control or not self._ready:
            # control plane first, ahead of every client request waiting; or no connection
            # waits for its turn (several requests read in one step all start at once)
            self._start_one(conn)
            return
        self._ready.append(conn)
        self._start_ready()

    def _start_ready(self) -> None:
        # Client requests start in turn, at most NORMAL_STARTS_PER_TICK per loop step (each may be
        # a 1 MB produce). Within that budget a request starts from the read callback itself, so
        # its task runs in the step right after the reads, not one step later from the pump.
        while self._ready and self._started < NORMAL_STARTS_PER_TICK:
            self._started += 1
            self._start_one(self._ready.popleft())
        if (self._started or self._ready) and not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """A new loop step: a new budget of client starts."""
        self._pump_scheduled = False
        self._started = 0
        self._start_ready()

    def _start_one(self, conn: Connection) -> None:
        conn.in_ready = False
        if self.admission is not None and conn.queue and not conn.queue[0][1]:
            hold = self.admission.hold_for(conn.queue[0][2], conn.held_back)
            if hold:
                conn.held_back += hold
                conn.mute_for(hold)  # its unmute makes it ready again, at the tail
                return
        if conn.can_start():
            conn.held_back = 0.0
            conn.start_next()
            conn._maybe_ready()  # a deeper pipeline rejoins at the tail: one request per turn
            conn._update_reading()

    async def stop(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        for t in list(self._setup):
            t.cancel()
        for c in list(self.connections):
            if c.transport is not None:
                c.transport.abort()
        await asyncio.sleep(0)  # let connection_lost run for the aborted transports
