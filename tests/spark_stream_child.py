"""A streaming query in a process of its own, for a test to kill -9 mid-stream.

    python -m tests.spark_stream_child URLS QUEUE GROUP CHECKPOINT OUT MAX_PER_TRIGGER

Reads QUEUE (group GROUP) into parquet at OUT until it is killed; the token,
if any, comes from RAFTQ_TOKEN.
"""

import sys

from tests.sparkutil import start_session


def main(urls, queue, group, checkpoint, out, max_per_trigger) -> None:
    spark = start_session("local[2]", "raftq-stream-child")
    query = (spark.readStream.format("raftq").option("url", urls).option("queue", queue)
             .option("group", group).option("maxMessagesPerTrigger", max_per_trigger).load()
             .writeStream.format("parquet").option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start(out))
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:])
