"""Codec throughput: Strata's generated codecs beside kio on the same bytes.

Cases: a Produce request carrying 1 MiB of record batches,
a Fetch response of 100 partitions, a Metadata response of 1,000 partitions. Each input is
built with our codecs, decoded by kio into its own objects, then both libraries encode and
decode the same message in a timed loop. Prints a table; asserts nothing about speed.

    .venv/bin/python bench/codec.py [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kio.serial import entity_reader, entity_writer  # noqa: E402

from protocol.generated.fetch import FetchResponse  # noqa: E402
from protocol.generated.metadata import MetadataResponse  # noqa: E402
from protocol.generated.produce import ProduceRequest  # noqa: E402
from protocol.records import Record, encode_batch  # noqa: E402


def produce_1mib():
    batch = encode_batch([Record(value=os.urandom(1000), key=b"k%d" % i) for i in range(64)])  # ~65 KB
    P = ProduceRequest.PartitionProduceData
    parts = [P(index=i, records=batch) for i in range(16)]
    msg = ProduceRequest(
        acks=-1, timeout_ms=30000, topic_data=[ProduceRequest.TopicProduceData(name="bench", partition_data=parts)]
    )
    return "Produce v9 request, 16 x 64 KiB batches", msg, 9, "kio.schema.produce.v9.request", "ProduceRequest"


def fetch_100():
    batch = encode_batch([Record(value=os.urandom(100), key=b"k%d" % i) for i in range(10)])  # ~1.3 KB
    FR = FetchResponse
    topics = [
        FR.FetchableTopicResponse(
            topic=f"topic-{t}",
            partitions=[
                FR.PartitionData(
                    partition_index=p, high_watermark=1000, last_stable_offset=1000, log_start_offset=0, records=batch
                )
                for p in range(10)
            ],
        )
        for t in range(10)
    ]
    msg = FR(responses=topics, session_id=1)
    return "Fetch v12 response, 100 partitions", msg, 12, "kio.schema.fetch.v12.response", "FetchResponse"


def metadata_1000():
    MR = MetadataResponse
    brokers = [
        MR.MetadataResponseBroker(node_id=i, host=f"broker-{i}.example", port=9092, rack=f"r{i}") for i in range(3)
    ]
    topics = [
        MR.MetadataResponseTopic(
            name=f"topic-{t}",
            topic_id=uuid.uuid4(),
            partitions=[
                MR.MetadataResponsePartition(
                    partition_index=p, leader_id=p % 3, leader_epoch=5, replica_nodes=[0, 1, 2], isr_nodes=[0, 1, 2]
                )
                for p in range(100)
            ],
        )
        for t in range(10)
    ]
    msg = MR(brokers=brokers, cluster_id="bench", controller_id=0, topics=topics)
    return "Metadata v12 response, 1,000 partitions", msg, 12, "kio.schema.metadata.v12.response", "MetadataResponse"


def rate(fn, seconds: float) -> float:
    fn()
    n = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        fn()
        n += 1
        now = time.perf_counter()
        if now >= deadline:
            return n / (now - start)


def measure(case, seconds: float) -> list[tuple]:
    title, msg, version, kio_mod, kio_name = case()
    data = msg.encode(version)
    cls = type(msg)
    kio_cls = getattr(__import__(kio_mod, fromlist=[kio_name]), kio_name)
    kread, kwrite = entity_reader(kio_cls), entity_writer(kio_cls)
    kobj = kread(memoryview(data), 0)[0]

    def kio_encode() -> bytes:
        buf = io.BytesIO()
        kwrite(buf, kobj)
        return buf.getvalue()

    assert kio_encode() == data, "kio must encode the same bytes"
    mb = len(data) / 1e6
    rows = []
    for lib, enc, dec in (
        ("strata", lambda: msg.encode(version), lambda: cls.decode(data, version)),
        ("kio", kio_encode, lambda: kread(memoryview(data), 0)),
    ):
        e, d = rate(enc, seconds), rate(dec, seconds)
        rows.append((title, lib, len(data), e, e * mb, d, d * mb))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    args = ap.parse_args()
    rows = [row for case in (produce_1mib, fetch_100, metadata_1000) for row in measure(case, args.seconds)]
    print(f"{'case':42} {'codec':7} {'bytes':>9} {'enc/s':>9} {'enc MB/s':>9} {'dec/s':>9} {'dec MB/s':>9}")
    for title, lib, size, e, emb, d, dmb in rows:
        print(f"{title:42} {lib:7} {size:9d} {e:9.0f} {emb:9.1f} {d:9.0f} {dmb:9.1f}")


if __name__ == "__main__":
    main()
