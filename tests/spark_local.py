"""The local Spark session the tests use: two local cores, loopback only, no UI, and the JVM's
scratch files (spark-*, blockmgr-*, the lz4 library it unpacks, its perf data) in the test's own
dir, not /tmp, where a driver killed in a crash window would leave them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def local_session(app_name: str, scratch: Path) -> Any:
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(scratch))
        .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch} -XX:-UsePerfData")
        .getOrCreate()
    )
