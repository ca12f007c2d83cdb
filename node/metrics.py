"""Prometheus metrics of a node: the text exposition format and its HTTP endpoint.

Cheap on the hot path: counters are plain attributes of objects made once, latencies go into a
fixed-bucket histogram (one bisect per request); everything else (gauges, label sets, the text)
is computed when /metrics is scraped. Names follow the JMX exporter's convention for Kafka's
metrics (``kafka_server_brokertopicmetrics_messagesin_total``); Strata's own start ``strata_``.

`metrics.listener` (``http://HOST:PORT``; unset: no endpoint) is served from the event loop by a
minimal HTTP/1.x handler: GET /metrics only, 404 for any other path, 405 for any other method.
"""

from __future__ import annotations

import asyncio
import bisect
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from node.config import ConfigError
from node.waits import Eventual
from protocol.generated import REQUESTS

if TYPE_CHECKING:
    from node.server import Handler

log = structlog.get_logger(__name__)

# request latency buckets in ms (Kafka's request metrics are in ms)
LATENCY_BUCKETS_MS = (0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
MAX_REQUEST_HEAD = 8192  # an HTTP request head larger than this is refused
READ_TIMEOUT_S = 5.0


@dataclass
class Family:
    """One metric family: its samples are (suffix, labels, value)."""

    name: str
    type: str  # counter, gauge, histogram, summary
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, labels: dict[str, str] | None = None, suffix: str = "") -> Family:
        self.samples.append((suffix, labels or {}, value))
        return self


Collector = Callable[[], Iterable[Family]]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and abs(v) < 2**53):
        return str(int(v))
    return repr(float(v))


def exposition(families: Iterable[Family]) -> str:
    """Prometheus text format 0.0.4."""
    out: list[str] = []
    for f in families:
        base = f.name[:-len("_total")] if f.type == "counter" and f.name.endswith("_total") else f.name
        out.append(f"# HELP {base} {f.help}")
        out.append(f"# TYPE {base} {f.type}")
        for suffix, labels, value in f.samples:
            name = f.name + suffix
            if labels:
                inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                out.append(f"{name}{{{inner}}} {_number(value)}")
            else:
                out.append(f"{name} {_number(value)}")
    return "\n".join(out) + "\n"


class Histogram:
    """Fixed buckets: observe() is one bisect and two adds; quantiles are estimated at scrape time."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_MS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def quantile(self, q: float) -> float:
        """Linear interpolation within the bucket holding the q-th observation (as
        Prometheus's histogram_quantile); the last bucket reports its lower bound."""
        if self.count == 0:
            return 0.0
        rank = q * self.count
        seen = 0
        for i, c in enumerate(self.counts):
            if c and seen + c >= rank:
                lo = self.bounds[i - 1] if i > 0 else 0.0
                if i == len(self.bounds):
                    return lo
                return lo + (self.bounds[i] - lo) * (rank - seen) / c
            seen += c
        return self.bounds[-1]

    def add_to(self, family: Family, labels: dict[str, str]) -> None:
        cumulative = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            cumulative += c
            family.add(cumulative, {**labels, "le": _number(bound)}, "_bucket")
        family.add(self.count, {**labels, "le": "+Inf"}, "_bucket")
        family.add(self.sum, labels, "_sum")
        family.add(self.count, labels, "_count")


FETCH = 1
# Kafka's RequestMetrics count a Fetch under "Fetch" and under one of these two as well
FETCH_CONSUMER, FETCH_FOLLOWER = -2, -3
SPLIT_NAMES = {FETCH_CONSUMER: "FetchConsumer", FETCH_FOLLOWER: "FetchFollower"}


def api_name(key: int) -> str:
    """Kafka's request label: Produce, Fetch, FetchConsumer, ..."""
    if key in SPLIT_NAMES:
        return SPLIT_NAMES[key]
    cls = REQUESTS.get(key)
    return cls.NAME.removesuffix("Request") if cls is not None else f"Unknown{key}"


class RequestMetrics:
    """Per API: requests, total time and queue time histograms (Kafka's RequestMetrics).

    Wraps a FramedServer handler: the node's request path is untouched. Queue time is the time
    from the request's bytes being read off the socket (`conn.request_read_at`) to its handler's
    start, as Kafka's RequestQueueTimeMs (from the request channel to a handler thread). With
    `split_fetch` (brokers), a Fetch is also counted as FetchFollower (control-plane: a replica
    id, `conn.request_control`) or FetchConsumer, as Kafka does."""

    def __init__(self, split_fetch: bool = False) -> None:
        self.total: dict[int, Histogram] = {}
        self.queue: dict[int, Histogram] = {}
        self.split_fetch = split_fetch

    def wrap(self, handler: Handler) -> Handler:
        loop_time = asyncio.get_running_loop().time  # the clock of conn.request_read_at
        clock = time.perf_counter
        total, queue = self.total, self.queue
        bounds = LATENCY_BUCKETS_MS
        where = bisect.bisect_left
        split = self.split_fetch

        def pair(key: int) -> tuple[Histogram, Histogram]:
            h = total.get(key)
            if h is None:
                h = total[key] = Histogram()
                queue[key] = Histogram()
            return h, queue[key]

        async def timed(frame: bytes, conn) -> list | Eventual | None:
            # Histogram.observe inlined: this runs for every request (about 1 us in all)
            start = clock()
            key = (frame[0] << 8 | frame[1]) if len(frame) >= 2 else -1
            waited = (loop_time() - conn.request_read_at) * 1000
            kinds = [pair(key)]
            if key == FETCH and split:
                kinds.append(pair(FETCH_FOLLOWER if conn.request_control else FETCH_CONSUMER))
            for _, q in kinds:
                q.counts[where(bounds, waited)] += 1
                q.sum += waited
                q.count += 1

            def done(_: object = None) -> None:
                ms = (clock() - start) * 1000
                for h, _ in kinds:
                    h.counts[where(bounds, ms)] += 1
                    h.sum += ms
                    h.count += 1

            try:
                resp = await handler(frame, conn)
            except BaseException:
                done()
                raise
            if isinstance(resp, Eventual) and not resp.done():
                resp.on_done(done)  # an acks=all Produce: timed until it is answered
            else:
                done()
            return resp

        return timed

    def families(self) -> list[Family]:
        requests = Family("kafka_network_requestmetrics_requests_total", "counter", "Requests handled, by API.")
        total = Family("kafka_network_requestmetrics_totaltimems", "histogram",
                       "Request handling time in ms (from its handler's start to its response), by API.")
        total_q = Family("kafka_network_requestmetrics_totaltimems_quantile", "gauge",
                         "Estimated percentiles of kafka_network_requestmetrics_totaltimems, by API.")
        queue = Family("kafka_network_requestmetrics_requestqueuetimems", "histogram",
                       "Time in ms a request waited before its handler started, by API.")
        for key in sorted(self.total):
            labels = {"request": api_name(key)}
            h = self.total[key]
            requests.add(h.count, labels)
            h.add_to(total, labels)
            for q in (0.5, 0.75, 0.95, 0.99, 0.999):
                total_q.add(round(h.quantile(q), 3), {**labels, "quantile": str(q)})
            self.queue[key].add_to(queue, labels)
        return [requests, total, total_q, queue]


def parse_listener(value: str | None) -> tuple[str, int] | None:
    """metrics.listener: ``http://HOST:PORT`` (port 0: any free port), or unset."""
    if not value:
        return None
    m = re.fullmatch(r"http://(\[[^\]]*\]|[^:/]*):(\d+)/?", value.strip())
    if not m or int(m.group(2)) > 65535:
        raise ConfigError(f"metrics.listener: {value!r} is not http://HOST:PORT")
    return m.group(1).strip("[]") or "0.0.0.0", int(m.group(2))


class MetricsServer:
    """GET /metrics over HTTP/1.x from the event loop; collecting and writing the text is
    done in the loop too (a scrape is a few hundred lines: far below a millisecond of work)."""

    def __init__(self, collectors: list[Collector]) -> None:
        self.collectors = collectors
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task] = set()

    async def start(self, host: str, port: int) -> int:
        try:
            self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_REQUEST_HEAD)
        except OSError as e:
            raise OSError(f"cannot listen on metrics.listener http://{host}:{port}: {e.strerror or e}") from None
        bound = self._server.sockets[0].getsockname()[1]
        log.info("metrics_listening", url=f"http://{host}:{bound}/metrics", port=bound)
        return bound

    def render(self) -> str:
        families: list[Family] = []
        for collect in self.collectors:
            families.extend(collect())
        return exposition(families)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            status, body, ctype = self._answer(head)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            status, body, ctype = "400 Bad Request", "bad request\n", "text/plain"
        except Exception as e:  # a bug in a collector: answer 500, keep serving
            log.exception("metrics_collect_failed")
            status, body, ctype = "500 Internal Server Error", f"{type(e).__name__}\n", "text/plain"
        try:
            data = body.encode()
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + data)
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()
            if task is not None:
                self._clients.discard(task)

    def _answer(self, head: bytes) -> tuple[str, str, str]:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", "bad request\n", "text/plain"
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target != "/metrics":
            return "404 Not Found", "not found: try /metrics\n", "text/plain"
        if method != "GET":
            return "405 Method Not Allowed", "only GET\n", "text/plain"
        return "200 OK", self.render(), "text/plain; version=0.0.4; charset=utf-8"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for t in list(self._clients):
            t.cancel()
