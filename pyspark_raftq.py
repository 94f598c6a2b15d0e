"""Found by Spark's Python data source lookup (any top-level `pyspark_*` module with a
`DefaultSource`), so `format("raftq")` works without `raftq.spark.register(spark)`."""

from raftq.spark import RaftqDataSource as DefaultSource

__all__ = ["DefaultSource"]
