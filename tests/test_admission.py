"""Fair admission: one busy connection does not starve the others.

A client pipelining 1,000 Produce requests on one connection is served one request at a time
(Kafka's muting), so a second connection's Metadata request is started behind at most one of
them and answered long before the 1,000th; the 1,000 are still answered in order and appended in
order. And while a bulk producer saturates the broker, a consumer group's heartbeats and a
transaction's EndTxn keep within their timeouts.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from node.client import NodeClient
from protocol.generated.metadata import MetadataRequest
from protocol.generated.produce import ProduceRequest
from protocol.records import Record, encode_batch
from tools.cluster import Cluster

# timing- or CPU-sensitive: runs after the parallel part of `make test`, alone
pytestmark = pytest.mark.serial

PIPELINED = 1000


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)


def produce_request(topic: str, value: bytes) -> ProduceRequest:
    batch = encode_batch([Record(value=value)], base_offset=0)
    return ProduceRequest(
        acks=1,
        timeout_ms=30000,
        topic_data=[ProduceRequest.TopicProduceData(
            name=topic, partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
        )],
    )


def test_second_connection_is_served_while_one_pipelines_1000_produces(cluster_factory) -> None:
    c: Cluster = cluster_factory(brokers=1)
    topic = f"pipelined-{uuid.uuid4().hex[:8]}"
    create_topic(c.bootstrap, topic)

    async def run() -> tuple[int, int, list[int], list[int]]:
        async with NodeClient(c.host, c.broker_port(1)) as busy, NodeClient(c.host, c.broker_port(1)) as other:
            answered: list[int] = []  # produce responses in the order they arrived

            async def one(i: int) -> int:
                resp = await busy.request(produce_request(topic, bytes([i % 256]) * 32768), timeout=120)
                pr = resp.responses[0].partition_responses[0]
                assert pr.error_code == 0, pr
                answered.append(i)
                return pr.base_offset

            # all 1,000 written to the one connection at once, in order (a task starts writing
            # when it first runs; tasks run in creation order)
            tasks = [asyncio.ensure_future(one(i)) for i in range(PIPELINED)]
            while len(answered) < 3:  # the broker is busy with the pipeline
                await asyncio.sleep(0.001)
            sent_at = len(answered)
            meta = await other.request(MetadataRequest(topics=[MetadataRequest.MetadataRequestTopic(name=topic)]), 9)
            answered_at = len(answered)
            assert meta.topics[0].error_code == 0
            offsets = await asyncio.gather(*tasks)
            return sent_at, answered_at, offsets, answered

    sent_at, answered_at, offsets, order = asyncio.run(run())
    print(f"metadata sent after {sent_at} produce answers, answered after {answered_at}")
    assert answered_at < PIPELINED, "the Metadata request waited for the whole pipeline"
    # Served one request at a time and in turn: Metadata waits behind at most one produce of the
    # busy connection (plus what was on its way to us); the old model started up to 100 ahead of it.
    assert answered_at - sent_at < 50, (sent_at, answered_at)
    assert order == list(range(PIPELINED)), "responses came back out of request order"
    assert offsets == sorted(offsets) and len(set(offsets)) == PIPELINED, "appends were not in request order"


BULK = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Producer
    bootstrap, topic, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "log_level": 3})
    value = b"x" * 1024
    end = time.monotonic() + seconds
    sent = 0
    while time.monotonic() < end:
        try:
            p.produce(topic, value)
            sent += 1
        except BufferError:
            p.poll(0.005)
        p.poll(0)
    p.flush(60)
    print(sent)
""")


def test_heartbeats_and_end_txn_keep_their_timeouts_under_bulk_load(cluster_factory) -> None:
    c: Cluster = cluster_factory(brokers=1, broker_overrides={"offsets.topic.replication.factor": 1,
                                                              "transaction.state.log.replication.factor": 1,
                                                              "transaction.state.log.min.isr": 1,
                                                              "loop.lag.log.interval.ms": 1000})
    bulk_topic, group_topic, txn_topic = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("bulk", "grp", "txn"))
    for t in (bulk_topic, group_topic, txn_topic):
        create_topic(c.bootstrap, t, 2)

    # a consumer group member with tight timeouts: a heartbeat late by more than the session
    # timeout would get it evicted and the partitions revoked
    events: list[str] = []
    consumer = Consumer({
        "bootstrap.servers": c.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}", "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest", "enable.auto.commit": True,
        "auto.commit.interval.ms": 500, "log_level": 3,
    })
    consumer.subscribe([group_topic], on_assign=lambda _c, ps: events.append(f"assign {len(ps)}"),
                       on_revoke=lambda _c, ps: events.append(f"revoke {len(ps)}"))
    deadline = time.monotonic() + 30
    while not events and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert events == ["assign 2"], events

    txp = Producer({"bootstrap.servers": c.bootstrap, "transactional.id": f"t-{uuid.uuid4().hex[:6]}",
                    "transaction.timeout.ms": 10000, "log_level": 3})
    txp.init_transactions(30)

    stop = threading.Event()

    def keep_polling() -> None:
        while not stop.is_set():
            consumer.poll(0.1)

    poller = threading.Thread(target=keep_polling, daemon=True)
    poller.start()
    bulk = subprocess.Popen([sys.executable, "-c", BULK, c.bootstrap, bulk_topic, "9"],
                            stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(2)  # the bulk producer is up to speed
        commits = 0
        end = time.monotonic() + 6
        while time.monotonic() < end:
            txp.begin_transaction()
            for i in range(10):
                txp.produce(txn_topic, f"v{i}".encode())
            txp.commit_transaction(10)  # raises if EndTxn does not complete within 10 s
            commits += 1
        sent = int(bulk.communicate(timeout=90)[0].strip() or 0)
    finally:
        stop.set()
        poller.join(10)
        if bulk.poll() is None:
            bulk.kill()
            bulk.wait()
    seen = list(events)
    consumer.close()
    txp.flush(5)
    del txp  # librdkafka's handle would go on reconnecting to the stopped broker
    print(f"bulk producer sent {sent} records; {commits} transactions committed; group events {seen}")
    assert sent > 10000, "the bulk producer did not load the broker"
    assert commits >= 3
    assert seen == ["assign 2"], f"the group rebalanced under load: {seen}"
    # the loop-lag gauge reported while the broker was loaded
    lag = [ln for ln in c.log_path(1).read_text(errors="replace").splitlines() if "event='loop_lag'" in ln]
    assert len(lag) >= 5 and "p99_ms=" in lag[-1], lag[-3:]
    print(lag[-1])


def test_mute_for_holds_one_connection_only() -> None:
    """Connection.mute_for (KIP-219's channel muting, for client quotas): the muted connection's
    next request waits out the mute, another connection is served meanwhile, order is kept.
    A real FramedServer on a real socket, with a handler that echoes and mutes after request 1."""
    from node.server import FramedServer

    async def run() -> None:
        loop = asyncio.get_running_loop()
        handled: list[tuple[int, float]] = []

        async def handler(f: bytes, conn) -> list:
            handled.append((f[0], loop.time()))
            if f[0] == 1:
                conn.mute_for(0.5)
            return [bytes(f)]

        server = FramedServer(handler)
        port = await server.start("127.0.0.1", 0)
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"\0\0\0\x01\x01" + b"\0\0\0\x01\x02")  # requests 1 and 2, pipelined
            assert await r1.readexactly(5) == b"\0\0\0\x01\x01"
            muted_at = loop.time()
            w2.write(b"\0\0\0\x01\x03")
            assert await r2.readexactly(5) == b"\0\0\0\x01\x03"
            assert await r1.readexactly(5) == b"\0\0\0\x01\x02"
            order = [n for n, _ in handled]
            assert order == [1, 3, 2], order
            assert handled[2][1] - muted_at >= 0.45, "request 2 started before the mute ended"
            for w in (w1, w2):
                w.close()
        finally:
            await server.stop()

    asyncio.run(run())


def test_request_memory_budget_never_stalls_a_lone_pipelining_client() -> None:
    """queued.max.request.bytes smaller than two requests: a client pipelining 20 of them is still
    served, one at a time (a reservation waits for released memory, never for itself)."""
    from node.server import ConnectionLimits, FramedServer

    async def run() -> None:
        async def handler(f: bytes, conn) -> list:
            await asyncio.sleep(0.001)
            return [bytes(f[:1])]

        server = FramedServer(handler, limits=ConnectionLimits(queued_max_request_bytes=500))
        port = await server.start("127.0.0.1", 0)
        try:
            r, w = await asyncio.open_connection("127.0.0.1", port)
            async def send() -> None:  # each request in two pieces: partial frames wait for memory
                for i in range(20):
                    w.write(b"\0\0\x03\x20" + bytes([i]) * 400)
                    await asyncio.sleep(0.002)
                    w.write(bytes([i]) * 400)

            sender = asyncio.ensure_future(send())
            got = [(await asyncio.wait_for(r.readexactly(5), 10))[4] for _ in range(20)]
            await sender
            assert got == list(range(20))
            assert server.held_bytes == 0, server.held_bytes
            w.close()
        finally:
            await server.stop()

    asyncio.run(run())


def test_large_requests_wait_while_the_loop_is_late_small_ones_do_not() -> None:
    """admission.lag.target.ms: while something keeps the event loop late, a connection's large
    requests are held back (muted a few times the lag) and a small request from another
    connection goes ahead of them; a loop that stays late paces the large requests but serves
    every one; on a loop that is not late none is held back."""
    from node.loop_lag import LagAdmission
    from node.server import FramedServer

    big = 70 * 1024

    async def serve(stall: bool) -> tuple[list[int], int]:
        loop = asyncio.get_running_loop()
        handled: list[int] = []

        async def handler(f: bytes, conn) -> list:
            handled.append(len(f))
            return [bytes(f[:1])]

        admission = LagAdmission(target_ms=1)
        admission.start()
        stalling = True

        def hog() -> None:  # another process holding the CPU, as the loop sees it: 8 ms late
            if stalling:
                time.sleep(0.008)
                loop.call_later(0.002, hog)

        if stall:
            hog()
        server = FramedServer(handler, admission=admission)
        port = await server.start("127.0.0.1", 0)
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"".join(big.to_bytes(4, "big") + b"\x01" * big for _ in range(10)))
            await asyncio.wait_for(r1.readexactly(5), 10)  # the first large one is handled
            w2.write(b"\0\0\0\x01\x02")
            assert await asyncio.wait_for(r2.readexactly(5), 10) == b"\0\0\0\x01\x02"
            for _ in range(9):  # still late all along: each large request waits (100 ms at most), then runs
                await asyncio.wait_for(r1.readexactly(5), 10)
            for w in (w1, w2):
                w.close()
        finally:
            stalling = False
            admission.stop()
            await server.stop()
        return handled, admission.delayed

    handled, delayed = asyncio.run(serve(stall=True))
    assert delayed >= 5, f"{delayed} large requests held back while the loop ran 8 ms late"
    assert handled.index(1) < 9, f"the small request waited behind the large ones: {handled}"
    assert len(handled) == 11
    handled, delayed = asyncio.run(serve(stall=False))
    assert delayed == 0, f"{delayed} large requests held back on a loop that was not late"
    assert len(handled) == 11


def test_a_loop_that_waits_for_a_cpu_keeps_large_requests_paced_longer() -> None:
    """The admission's lag estimate decays slowly while the loop thread waits for a CPU (measured
    from /proc/thread-self/schedstat): here a busy loop shares one CPU with a busy process, a real
    run queue. The same loop with a CPU to itself keeps the fast decay."""
    from node.loop_lag import LagAdmission, RunQueueWait

    probe = RunQueueWait()
    readable = probe.share() is not None
    probe.close()
    if not readable:
        pytest.skip("this kernel has no /proc/thread-self/schedstat: admission goes by the lag alone")
    cpu = min(os.sched_getaffinity(0))

    def measure(hog: bool) -> tuple[float, float]:
        """(the loop thread's CPU wait share, the lag's decay per probe)"""
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
        mask = os.sched_getaffinity(0)

        async def run() -> tuple[float, float]:
            loop = asyncio.get_running_loop()
            admission = LagAdmission(target_ms=1)
            admission.start()
            busy_until = loop.time() + 1.5

            def work() -> None:  # the loop busy too, in 1 ms steps: it wants the CPU all along
                end = time.perf_counter() + 0.001
                while time.perf_counter() < end:
                    pass
                if loop.time() < busy_until:
                    loop.call_soon(work)

            work()
            await asyncio.sleep(1.5)
            admission.stop()
            return admission.cpu_wait, admission.decay()

        try:
            if spinner is not None:
                os.sched_setaffinity(spinner.pid, {cpu})
            os.sched_setaffinity(0, {cpu})  # this thread only: the loop's
            return asyncio.run(run())
        finally:
            os.sched_setaffinity(0, mask)
            if spinner is not None:
                spinner.kill()
                spinner.wait()

    wait, decay = measure(hog=True)
    assert wait >= LagAdmission.CONTENDED, f"sharing a CPU with a busy process, the loop waited only {wait:.0%}"
    assert decay == LagAdmission.SLOW_DECAY
    busy_before = os.getloadavg()[0]
    alone, decay = measure(hog=False)
    assert alone < wait, f"without the busy process the loop waited {alone:.0%}, with it {wait:.0%}"
    if busy_before < 1.0 and os.getloadavg()[0] < 1.0:
        # "alone" only means a CPU to itself when nothing else on the machine wants one (other
        # processes' tests share the CPU under the same run queue)
        assert alone < LagAdmission.UNCONTENDED, f"with a CPU to itself the loop waited {alone:.0%} of the time"
        assert decay == LagAdmission.FAST_DECAY
    else:
        print(f"load average {busy_before:.1f}: the uncontended case is checked only relative to the contended one")


def test_the_lag_probe_parks_while_no_request_comes() -> None:
    """An idle broker wakes for no probe of its own: after IDLE_PARK_PROBES quiet probes the
    admission's timer parks, and the next request re-arms it (and is not held back)."""
    from node.loop_lag import LagAdmission

    async def run() -> tuple[bool, bool, float, bool]:
        admission = LagAdmission(target_ms=1)
        admission.PROBE_S = 0.001  # park within a second in this test
        admission.start()
        await asyncio.sleep(0.001 * LagAdmission.IDLE_PARK_PROBES * 3)
        parked = admission._timer is None
        hold = admission.hold_for(1 << 20, 0.0)
        rearmed = admission._timer is not None
        admission.stop()
        return parked, rearmed, hold, admission._timer is None

    parked, rearmed, hold, stopped = asyncio.run(run())
    assert parked, "the probe kept running with no request to admit"
    assert rearmed and hold == 0.0, "a request after the quiet spell re-arms the probe and starts at once"
    assert stopped
