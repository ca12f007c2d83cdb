"""Spark batch reads through the `strata` source: a topic chunked over 3 brokers beside the same
data unchunked, and a diskless topic read straight from S3 beside the same read through the
brokers, in one run, at one or more value sizes.

Workload (Strata only; tools.cluster.Cluster in a temp dir, 3 brokers, logs on disk), per value
size of --sizes (--megabytes of values, or --records, each; a size's topics are written just
before they are read)
  unchunked   topic `flat-<size>`: 1 partition, replication factor 3 (brokers 1, 2, 3), written
              with confluent-kafka (acks=all, linger.ms=5). Every piece is read from the leader.
  chunked     topic `chunked-<size>`: 1 partition, replication factor 1, written in 3 equal thirds
              with a new chunk between them (kafka-chunks.sh create: broker 1, then 2, then 3), so
              each third sits on its own broker. Pieces of the inactive chunks go to their replicas.
              --diskless-only leaves these two out.
  diskless    topic `diskless-<size>`: 3 partitions, diskless.enable=true, WAL files on SeaweedFS
              (S3), the same records; read twice: "direct" (the driver plans from the diskless
              coordinator's batch index, executors get the byte ranges from S3 themselves) and
              "through brokers" (disklessDirectRead=false: the brokers' Fetch, which reads S3
              through their block cache, 64 MiB per broker: a size's data larger than that is read
              from S3 again on every pass). --skip-diskless leaves it out.
Each read is `spark.read.format("strata") ... .load().count()` (local[2], minPartitions
--min-partitions) plus a pass that decodes every column (`.selectExpr("sum(length(value))")`),
timed from the action to its result; rows/s = records / seconds. "Spark alone" is the same two
actions over a source whose tasks yield ready-made Arrow batches of the same schema and size
(no reading, no decoding): what Spark's Python data source path costs by itself. For the
diskless reads and "Spark alone" it also prints the CPU seconds each kind of process spent in
the two actions (this process's descendants, from /proc: the brokers, SeaweedFS, Spark's JVM, its
Python workers): with 2 cores the reads are CPU-bound, and this says whose CPU. "bytes served" is
per broker, from the read plan (each piece's first-choice broker, records x record bytes): with no
failures that is who served it. --warmup untimed runs of every read come first at each size (the
JVM's JIT and the Python workers warm up); the tables print the median of --runs timed runs, and
a last table the direct read's rows/s over the through-broker read's per size. It asserts nothing.

    .venv/bin/python bench/spark_read.py [--sizes 100,1024,10240] [--megabytes 500 | --records N]
                                         [--runs 3] [--warmup 1] [--min-partitions 6]
                                         [--skip-diskless | --diskless-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition  # noqa: E402

from connector.spark_source import SourceOptions, _Plan  # noqa: E402
from tests.s3_server import ACCESS_KEY, SECRET_KEY, SeaweedS3  # noqa: E402
from tools.cluster import Cluster  # noqa: E402

BIN = Path(sys.executable).parent


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_tool(name: str, *args: str) -> None:
    out = subprocess.run([str(BIN / name), *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{name} {' '.join(args)}: {out.stderr.strip()}")


def produce(bootstrap: str, topic: str, first: int, n: int, size: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
                  "queue.buffering.max.messages": 1_000_000})
    pad = b"x" * max(0, size - 12)
    started, step = time.monotonic(), max(1, n // 10)
    for i in range(first, first + n):
        while True:
            try:
                p.produce(topic, value=b"%012d" % i + pad)
                break
            except BufferError:
                p.poll(0.05)
        if (i - first) % step == step - 1:
            p.poll(0)
            say(f"  {topic}: {i - first + 1:,}/{n:,} records ({time.monotonic() - started:.0f}s)")
    if p.flush(300):
        raise SystemExit(f"{topic}: records not acknowledged")


def create_chunk(bootstrap: str, topic: str, broker: int, tmp: Path) -> None:
    spec = tmp / f"chunk-{topic}-{broker}.json"
    spec.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "replicas": [broker]}]}))
    run_tool("kafka-chunks.sh", "create", "--bootstrap-server", bootstrap, "--create-chunk-json-file", str(spec))


def served_per_broker(bootstrap: str, topic: str, min_partitions: int, record_bytes: int) -> dict[int, int]:
    opts = SourceOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic,
                                "minPartitions": str(min_partitions)}, streaming=False)
    plan = _Plan(opts)
    start = plan.starting()
    end = plan.resolve("latest", -1, "endingOffsets")
    out: dict[int, int] = {}
    for piece in plan.pieces(start, end):
        out[piece.brokers[0]] = out.get(piece.brokers[0], 0) + (piece.end - piece.start) * record_bytes
    return out


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process's descendants, by kind."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, list[str]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stats[int(d)] = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                pass
    kids: dict[int, list[int]] = {}
    for pid, f in stats.items():
        kids.setdefault(int(f[1]), []).append(pid)
    out: dict[str, float] = {}
    todo = list(kids.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo.extend(kids.get(pid, []))
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        kind = ("brokers" if "broker" in cmd and "server.properties" in cmd else "seaweedfs" if "weed" in cmd
                else "spark jvm" if "java" in cmd else "python workers" if "pyspark" in cmd else "other")
        out[kind] = out.get(kind, 0.0) + sum(int(x) for x in stats[pid][11:13]) / tick
    return out


class SparkAlone(DataSource):
    """Tasks that yield one ready-made Arrow batch of the source's schema over and over."""

    @classmethod
    def name(cls) -> str:
        return "spark-alone"

    def schema(self) -> str:
        from connector.arrow_records import SPARK_SCHEMA

        return SPARK_SCHEMA

    def reader(self, schema: object) -> DataSourceReader:
        rows, parts, size = int(self.options["rows"]), int(self.options["parts"]), int(self.options["size"])

        class Reader(DataSourceReader):
            def partitions(self) -> list[InputPartition]:
                return [InputPartition(i) for i in range(parts)]

            def read(self, partition: InputPartition) -> Iterator[Any]:
                import numpy as np
                import pyarrow as pa

                from connector.arrow_records import arrow_schema

                n = max(1, min(50_000, (8 << 20) // max(size, 1)))  # at most about 8 MB a batch, as a read yields
                value = pa.array([b"%012d" % i + b"x" * max(0, size - 12) for i in range(n)], pa.binary())
                batch = pa.RecordBatch.from_arrays([
                    pa.nulls(n, pa.binary()), value, pa.array(["alone"] * n, pa.string()),
                    pa.array(np.zeros(n, np.int32)), pa.array(np.arange(n, dtype=np.int64)),
                    pa.array(np.zeros(n, np.int64), pa.timestamp("us", tz="UTC")), pa.array(np.zeros(n, np.int32)),
                ], schema=arrow_schema(False))
                left = rows // parts + (1 if partition.value < rows % parts else 0)
                while left > 0:
                    yield batch if left >= n else batch.slice(0, left)
                    left -= n

        return Reader()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100", help="value sizes in bytes, comma-separated: one pass per size")
    ap.add_argument("--size", type=int, help="one value size (same as --sizes N)")
    ap.add_argument("--megabytes", type=float, default=500.0, help="value megabytes per size")
    ap.add_argument("--records", type=int, help="records per size (instead of --megabytes)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--min-partitions", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before the timed ones, per size")
    ap.add_argument("--skip-diskless", action="store_true")
    ap.add_argument("--diskless-only", action="store_true", help="leave out the unchunked and chunked topics")
    a = ap.parse_args()
    a.sizes = [a.size] if a.size else [int(s) for s in a.sizes.split(",")]
    if a.skip_diskless and a.diskless_only:
        raise SystemExit("--skip-diskless and --diskless-only leave nothing to read")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="strata-bench-spark-") as tmp:
        s3 = None
        overrides: dict[str, str] = {}
        if not a.skip_diskless:
            say("starting SeaweedFS")
            s3 = SeaweedS3(Path(tmp) / "s3").start()
            os.environ.update(s3.env())
            overrides = {"diskless.storage.url": f"s3://{s3.bucket}/wal", "diskless.storage.s3.endpoint": s3.endpoint,
                         "diskless.storage.s3.region": "us-east-1", "diskless.metadata.topic.num.partitions": "3"}
        try:
            with Cluster(Path(tmp) / "cluster", verbose=False, broker_overrides=overrides,
                         controller_overrides={k: v for k, v in overrides.items() if "metadata.topic" in k}) as c:
                run_all(a, c, Path(tmp), s3)
        finally:
            if s3 is not None:
                s3.stop()


def records_for(a: argparse.Namespace, size: int) -> int:
    return a.records if a.records else max(1, int(a.megabytes * 1e6) // size)


def write_size(a: argparse.Namespace, bs: str, tmp: Path, size: int, diskless: bool) -> None:
    n = records_for(a, size)
    say(f"writing {n:,} records of {size} bytes to each topic")
    if not a.diskless_only:
        run_tool("kafka-topics.sh", "--bootstrap-server", bs, "--create", "--topic", f"flat-{size}",
                 "--replica-assignment", "1:2:3")
        run_tool("kafka-topics.sh", "--bootstrap-server", bs, "--create", "--topic", f"chunked-{size}",
                 "--replica-assignment", "1")
        produce(bs, f"flat-{size}", 0, n, size)
        third = n // 3
        for k, broker in enumerate((1, 2, 3)):
            if broker != 1:
                create_chunk(bs, f"chunked-{size}", broker, tmp)
            produce(bs, f"chunked-{size}", k * third, third if k < 2 else n - 2 * third, size)
    if diskless:
        run_tool("kafka-topics.sh", "--bootstrap-server", bs, "--create", "--topic", f"diskless-{size}",
                 "--partitions", "3", "--replication-factor", "1", "--config", "diskless.enable=true")
        produce(bs, f"diskless-{size}", 0, n, size)


Results = dict[str, list[tuple[float, float, float]]]  # per run: rows/s of count(), of sum(len), of both
Cpu = dict[str, list[dict[str, float]]]
KINDS = ("brokers", "seaweedfs", "spark jvm", "python workers")
NOTES = {"diskless direct": "S3 ranges read by the executors",
         "diskless via brokers": "broker Fetch (S3 via block cache)",
         "Spark alone": "ready-made Arrow batches, nothing read"}


def read_size(a: argparse.Namespace, spark: Any, bs: str, size: int, direct: dict[str, str]) -> tuple[Results, Cpu]:
    """Every read of one size's topics, --runs times, the reads of a run back to back."""
    n_records = records_for(a, size)
    reads: list[tuple[str, str, dict[str, str]]] = []
    if not a.diskless_only:
        reads += [("flat", f"flat-{size}", {}), ("chunked", f"chunked-{size}", {})]
    if direct:
        reads += [("diskless direct", f"diskless-{size}", direct),
                  ("diskless via brokers", f"diskless-{size}", {**direct, "disklessDirectRead": "false"}),
                  ("Spark alone", "", {})]
    results: Results = {}
    cpu: Cpu = {}
    for run in range(-a.warmup, a.runs):  # runs below 0 warm the JVM's JIT and the workers up, untimed
        for label, topic, extra in reads:
            if not topic:
                df = (spark.read.format("spark-alone").option("rows", n_records).option("size", size)
                      .option("parts", a.min_partitions).load())
            else:
                r = (spark.read.format("strata").option("kafka.bootstrap.servers", bs)
                     .option("subscribe", topic).option("minPartitions", str(a.min_partitions)))
                for key, value in extra.items():
                    r = r.option(key, value)
                df = r.load()
            before = cpu_seconds()
            t = time.monotonic()
            n = df.count()
            count_s = time.monotonic() - t
            t = time.monotonic()
            df.selectExpr("sum(length(value))").collect()
            decode_s = time.monotonic() - t
            if n != n_records:
                raise SystemExit(f"{topic}: read {n:,} records, wrote {n_records:,}")
            if run < 0:
                continue
            results.setdefault(label, []).append((n / count_s, n / decode_s, 2 * n / (count_s + decode_s)))
            after = cpu_seconds()
            cpu.setdefault(label, []).append({k: v - before.get(k, 0.0) for k, v in after.items()})
            say(f"  {size} B run {run + 1} {label}: count {n / count_s:,.0f} rows/s, "
                f"sum(length(value)) {n / decode_s:,.0f} rows/s")
    return results, cpu


def med(results: Results, label: str, i: int) -> float:
    return statistics.median(r[i] for r in results[label])


def report_size(a: argparse.Namespace, bs: str, size: int, results: Results, cpu: Cpu) -> None:
    n = records_for(a, size)
    print(f"\nSpark batch read, {n:,} records x {size} B, local[2], minPartitions={a.min_partitions}, "
          f"median of {a.runs}")
    print(f"{'topic':<26}{'count() rows/s':>16}{'sum(len) rows/s':>17}{'sum(len) MB/s':>15}   note")
    for topic, label in (("flat", "unchunked (RF 3, leader)"), ("chunked", "3 chunks on 3 brokers")):
        if topic not in results:
            continue
        per = served_per_broker(bs, f"{topic}-{size}", a.min_partitions, size + 20)  # + framing, roughly
        spread = "bytes served per broker (plan): " + ", ".join(f"b{b}: {v / 1e6:,.0f} MB" for b, v in sorted(per.items()))
        sums = med(results, topic, 1)
        print(f"{label:<26}{med(results, topic, 0):>16,.0f}{sums:>17,.0f}{sums * size / 1e6:>15,.0f}   {spread}")
    if "diskless direct" not in results:
        return
    for label, note in NOTES.items():
        sums = med(results, label, 1)
        print(f"{label:<26}{med(results, label, 0):>16,.0f}{sums:>17,.0f}{sums * size / 1e6:>15,.0f}   {note}")
    print(f"\nCPU seconds in count() + sum(len), {size} B, median of {a.runs}")
    print(f"{'read':<26}" + "".join(f"{k:>16}" for k in (*KINDS, "all")))
    for label in NOTES:
        m = {k: statistics.median(c.get(k, 0.0) for c in cpu[label]) for k in KINDS}
        total = statistics.median(sum(c.get(k, 0.0) for k in KINDS) for c in cpu[label])
        print(f"{label:<26}" + "".join(f"{m[k]:>16.2f}" for k in KINDS) + f"{total:>16.2f}")


def run_all(a: argparse.Namespace, c: Cluster, tmp: Path, s3: SeaweedS3 | None) -> None:
    bs = c.bootstrap
    direct: dict[str, str] = {}
    if s3 is not None:
        direct = {"diskless.storage.url": f"s3://{s3.bucket}/wal", "diskless.storage.s3.endpoint": s3.endpoint,
                  "diskless.storage.s3.region": "us-east-1", "diskless.storage.s3.access.key.id": ACCESS_KEY,
                  "diskless.storage.s3.secret.access.key": SECRET_KEY}

    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("strata-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(SparkAlone)
    done: dict[int, tuple[Results, Cpu]] = {}
    for size in a.sizes:  # each size written just before it is read: the brokers' caches see one size at a time
        write_size(a, bs, tmp, size, bool(direct))
        done[size] = read_size(a, spark, bs, size, direct)
    spark.stop()
    for size, (results, cpu) in done.items():
        report_size(a, bs, size, results, cpu)
    if direct:
        print(f"\nDiskless direct read against the same read through the brokers' Fetch: rows/s of count() and "
              f"sum(len) together, median of {a.runs}; ratios are the median of each run's (the two reads of a run "
              "are back to back); CPU s: the through-broker read's CPU seconds (all kinds) over the direct read's")
        print(f"{'value size':>10}{'records':>12}{'MB':>8}{'direct rows/s':>15}{'brokers rows/s':>16}"
              f"{'both':>9}{'count()':>9}{'sum(len)':>10}{'CPU s':>8}")
        for size, (results, cpu) in done.items():
            n = records_for(a, size)
            d, b = results["diskless direct"], results["diskless via brokers"]
            ratio = [statistics.median(x[i] / y[i] for x, y in zip(d, b)) for i in (2, 0, 1)]
            spent = {label: statistics.median(sum(c.get(k, 0.0) for k in KINDS) for c in cpu[label])
                     for label in ("diskless direct", "diskless via brokers")}
            print(f"{size:>10}{n:>12,}{n * size / 1e6:>8,.0f}{med(results, 'diskless direct', 2):>15,.0f}"
                  f"{med(results, 'diskless via brokers', 2):>16,.0f}{ratio[0]:>8.2f}x{ratio[1]:>8.2f}x{ratio[2]:>9.2f}x"
                  f"{spent['diskless via brokers'] / spent['diskless direct']:>7.2f}x")


if __name__ == "__main__":
    main()
