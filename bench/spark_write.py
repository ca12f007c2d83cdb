"""Spark writes through the `strata` sink beside a plain confluent-kafka producer writing the same
rows, in one run.

Workload (Strata only; tools.cluster.Cluster in a temp dir, 3 brokers, logs on disk)
  plain producer  one confluent-kafka Producer in this process: --records rows, key = the row
                  number as a string, value --size bytes, into a new 3-partition topic (RF 3);
                  acks=all, idempotent, linger.ms=5, batch.size=1000000. Timed from the first
                  produce() to flush().
  spark sink      `df.write.format("strata")` of the same rows (built by spark.range, so making
                  them costs Spark, not Python), local[2], --tasks tasks, the sink's defaults
                  (acks=all, idempotent) and the same linger.ms and batch.size; timed from save()
                  to its return, so it includes planning and the tasks' start.
  spark sink EO   the same with exactlyOnce=true (a transaction per task, ended by the driver).
rows/s = records / seconds; the table prints the median of --runs runs, runs interleaved, and
the sink's share of the plain producer's rows/s. It asserts nothing.

    .venv/bin/python bench/spark_write.py [--records 2000000] [--size 100] [--runs 3] [--tasks 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tools.cluster import Cluster  # noqa: E402

PRODUCER = {"acks": "all", "enable.idempotence": True, "linger.ms": 5, "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000}


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def create(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(30)


def plain(bootstrap: str, topic: str, n: int, size: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    pad = b"x" * max(0, size - 12)
    t = time.monotonic()
    for i in range(n):
        while True:
            try:
                p.produce(topic, b"%012d" % i + pad, b"%d" % i)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(300):
        raise SystemExit(f"{topic}: records not acknowledged")
    return n / (time.monotonic() - t)


def spark_sink(spark, bootstrap: str, topic: str, n: int, size: int, tasks: int, exactly_once: bool) -> float:
    df = spark.range(0, n, numPartitions=tasks).selectExpr(
        "CAST(id AS STRING) AS key", f"CONCAT(lpad(CAST(id AS STRING), 12, '0'), repeat('x', {max(0, size - 12)})) AS value")
    w = (df.write.format("strata").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
         .option("kafka.linger.ms", "5").option("kafka.batch.size", "1000000")
         .option("kafka.queue.buffering.max.messages", "1000000"))
    if exactly_once:
        w = w.option("exactlyOnce", "true")
    t = time.monotonic()
    w.mode("append").save()
    return n / (time.monotonic() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=2)
    a = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="strata-bench-spark-write-") as tmp, Cluster(Path(tmp), verbose=False) as c:
        bs = c.bootstrap
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("strata-bench-write")
                 .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        create(bs, "warm")
        spark_sink(spark, bs, "warm", 1000, a.size, a.tasks, False)  # the JVM and Python workers start here
        results: dict[str, list[float]] = {}
        for run in range(a.runs):
            for label in ("plain", "sink", "sink EO"):
                topic = f"{label.replace(' ', '-')}-{run}"
                create(bs, topic)
                if label == "plain":
                    rate = plain(bs, topic, a.records, a.size)
                else:
                    rate = spark_sink(spark, bs, topic, a.records, a.size, a.tasks, label == "sink EO")
                results.setdefault(label, []).append(rate)
                say(f"  run {run + 1} {label}: {rate:,.0f} rows/s")
        spark.stop()
        base = statistics.median(results["plain"])
        print(f"\nWrites of {a.records:,} rows x {a.size} B into 3 partitions (RF 3, acks=all), "
              f"local[2] with {a.tasks} tasks, median of {a.runs}")
        print(f"{'writer':<34}{'rows/s':>12}{'of plain':>10}")
        for label, name in (("plain", "confluent-kafka Producer"), ("sink", "Spark strata sink"),
                            ("sink EO", "Spark strata sink, exactlyOnce")):
            med = statistics.median(results[label])
            print(f"{name:<34}{med:>12,.0f}{med / base:>10.0%}")


if __name__ == "__main__":
    main()
