"""raftq as a Spark source and sink (PySpark's Python Data Source API, Spark >= 4.2).

    import raftq.spark
    raftq.spark.register(spark)
    spark.read.format("raftq").option("url", "http://n1:8001,http://n2:8001").option("queue", "events").load()

Installing ``raftq[spark]`` also makes Spark find the source by itself (the
top-level module ``pyspark_raftq``).  docs/spark.md has the schema, every
option and the exactly-once design.

Modules: ``options`` (parsing, one-line errors), ``schema``, ``ranges``
(seq ranges, partitions, replica reads), ``readers`` (batch and streaming
planning), ``writer`` (staged, exactly-once sink), ``source`` (the DataSource).
"""

from .source import RaftqDataSource


def register(spark) -> None:
    """Make `spark.read/readStream/write/writeStream.format("raftq")` available in this session."""
    spark.dataSource.register(RaftqDataSource)


__all__ = ["RaftqDataSource", "register"]
