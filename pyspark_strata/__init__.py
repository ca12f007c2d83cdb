"""Found by PySpark on its own: an installed top-level `pyspark_<name>` module exposing
`DefaultSource` registers the data source `strata`, so `spark.read.format("strata")` works with no
`spark.dataSource.register` call."""

from connector.spark_source import StrataDataSource as DefaultSource

__all__ = ["DefaultSource"]
