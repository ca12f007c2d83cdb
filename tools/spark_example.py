"""`make spark-example`: the quickstart's Spark walk-through, end to end on this machine.

Starts a local cluster (1 controller, 3 brokers, in a temp dir), writes page views to a topic,
moves the partition's active chunk to other brokers with kafka-chunks.sh (so the old views sit in
an inactive chunk served by its replicas), writes more, and prints a Spark aggregate read with
`spark.read.format("strata")`. Then the pipeline the other way: a streaming query reads the page
views, counts them per page and writes the counts to a second topic with the `strata` sink
(exactly once, Trigger.AvailableNow); the counts are read back from that topic. Everything stops
at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.cluster import Cluster

TOPIC = "page-views"
COUNTS = "page-view-counts"
PAGES = ["/", "/docs", "/pricing", "/blog", "/signup"]


def produce(bootstrap: str, first: int, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    for i in range(first, first + n):
        p.produce(TOPIC, key=PAGES[i % len(PAGES)].encode(), value=json.dumps({"view": i}).encode())
    if p.flush(60):
        raise SystemExit("some page views were not acknowledged")


def tool(name: str, *args: str) -> str:
    exe = Path(sys.executable).with_name(name)
    out = subprocess.run([str(exe), *args], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{name} failed: {out.stderr.strip()}")
    return out.stdout


def main() -> None:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="strata-example-") as tmp, Cluster(Path(tmp), verbose=False) as c:
        print("started a cluster: 1 controller, 3 brokers", flush=True)
        bootstrap = c.bootstrap
        tool("kafka-topics.sh", "--bootstrap-server", bootstrap, "--create", "--topic", TOPIC,
             "--replica-assignment", "1")
        produce(bootstrap, 0, 50_000)
        print("50,000 page views written to broker 1; creating a new chunk on broker 2 ...", flush=True)
        spec = Path(tmp) / "chunk.json"
        spec.write_text(json.dumps({"partitions": [{"topic": TOPIC, "partition": 0, "replicas": [2]}]}))
        tool("kafka-chunks.sh", "create", "--bootstrap-server", bootstrap, "--create-chunk-json-file", str(spec))
        produce(bootstrap, 50_000, 50_000)
        print(tool("kafka-topics.sh", "--bootstrap-server", bootstrap, "--describe", "--topic", TOPIC), flush=True)

        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master("local[2]").appName("strata-example")
                 .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        started = time.monotonic()
        views = (spark.read.format("strata")
                 .option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", TOPIC)
                 .load())
        views.selectExpr("CAST(key AS STRING) AS page").groupBy("page").count().orderBy("page").show()
        print(f"read {views.count():,} page views in {time.monotonic() - started:.1f}s", flush=True)

        tool("kafka-topics.sh", "--bootstrap-server", bootstrap, "--create", "--topic", COUNTS,
             "--partitions", "1", "--replication-factor", "3")
        started = time.monotonic()
        query = (spark.readStream.format("strata")
                 .option("kafka.bootstrap.servers", bootstrap)
                 .option("subscribe", TOPIC)
                 .option("startingOffsets", "earliest")
                 .load()
                 .selectExpr("CAST(key AS STRING) AS page").groupBy("page").count()
                 .selectExpr("page AS key", "CAST(count AS STRING) AS value")
                 .writeStream.format("strata")                  # was: .format("kafka")
                 .option("kafka.bootstrap.servers", bootstrap)
                 .option("topic", COUNTS)
                 .option("checkpointLocation", str(Path(tmp) / "checkpoint"))
                 .outputMode("complete")
                 .trigger(availableNow=True)
                 .start())
        query.awaitTermination()
        print(f"streaming query wrote the counts to {COUNTS} in {time.monotonic() - started:.1f}s", flush=True)
        counts = (spark.read.format("strata")
                  .option("kafka.bootstrap.servers", bootstrap)
                  .option("subscribe", COUNTS)
                  .load()
                  .selectExpr("CAST(key AS STRING) AS page", "CAST(value AS STRING) AS views"))
        counts.orderBy("page").show()
        spark.stop()


if __name__ == "__main__":
    main()
