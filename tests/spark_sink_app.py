"""A streaming query that tests/test_spark_sink.py runs as its own process group, so that the test
can SIGKILL the driver, its JVM and its Python workers at once, the way a lost driver ends:
`python -m tests.spark_sink_app BOOTSTRAP INPUT_DIR CHECKPOINT TOPIC [TASKS]`.

JSON files of {"id": n} in INPUT_DIR, one file per micro-batch, become records key=str(n),
value=b"v<n>" in TOPIC, through the `strata` sink (exactly once), with Trigger.AvailableNow.
With TASKS, each micro-batch is repartitioned into that many tasks before the sink.
The environment's STRATA_SINK_TEST_CRASH names the crash point (connector/spark_sink.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    bootstrap, input_dir, checkpoint, topic = sys.argv[1:5]
    tasks = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["STRATA_SINK_TEST_PGID"] = str(os.getpgid(0))  # what a crash point kills (the JVM inherits it)
    from tests.spark_local import local_session

    scratch = Path(checkpoint).parent / "spark-scratch"
    scratch.mkdir(exist_ok=True)
    spark = local_session("strata-sink-app", scratch)
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.readStream.format("json").schema("id long").option("maxFilesPerTrigger", "1").load(input_dir)
    if tasks:
        df = df.repartition(tasks)
    q = (df.selectExpr("CAST(id AS STRING) AS key", "CONCAT('v', CAST(id AS STRING)) AS value")
         .writeStream.format("strata").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    q.awaitTermination(600)
    if q.exception() is not None:
        print(f"query failed: {q.exception()}", file=sys.stderr, flush=True)
        sys.exit(1)
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
