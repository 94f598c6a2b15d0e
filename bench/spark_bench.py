"""Spark connector benchmark on a real 3-node cluster and a local Spark session.

    .venv/bin/python bench/spark_bench.py [--messages 1000000] [--master local[2]]

Figures (the last line is one JSON object with all of them):
- batch_read_msgs_per_s_{1,2,4}p: `spark.read.format("raftq")` of all the
  messages (100-byte bodies) with 1, 2 and 4 partitions, warm session, an
  action that touches every body;
- raw_browse_msgs_per_s: the same range read page by page from the browse
  endpoint by the plain Python client (JSON), in this run; raw_browse_cbor_*
  the same in CBOR, as the connector reads;
- put_batch_msgs_per_s: bench/put_bench.py's batched put load (16 producers,
  100 messages a request), in this run, as the yardstick for writes;
- stream_write_msgs_per_s: a streaming query (Trigger.AvailableNow, 10k
  messages a batch, the nodes' --max-staged-messages-per-producer) copying a queue of --stream-messages into another through
  the exactly-once sink: rows over the query's wall time, reading included;
- stream_lag_p50_s / p90: a producer puts a message every 20 ms stamped with
  its send time; a streaming read with the fastest trigger hands each batch to
  foreachBatch, which takes now - send time for every row.
Needs raftq[spark] (pyspark, pyarrow) and Java.
"""

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from put_bench import percentile, put_load  # noqa: E402

from raftq.client import Client  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402

BODY = b"x" * 100
PAGE = 10_000


def session(master: str, token: str | None):
    os.environ.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                       "SPARK_LOCAL_IP": "127.0.0.1",
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(master).appName("raftq-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.driver.memory", "2g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import raftq.spark
    raftq.spark.register(spark)
    if token:
        os.environ["RAFTQ_TOKEN"] = token      # the connector's default for its `token` option
    return spark


def fill(urls, token, queue: str, count: int) -> float:
    started = time.perf_counter()
    with Client(urls, token=token, cbor=True) as client:
        for start in range(0, count, PAGE):
            client.put_batch(queue, [{"body": BODY} for _ in range(min(PAGE, count - start))])
    return count / (time.perf_counter() - started)


def raw_browse(urls, token, queue: str, *, cbor: bool) -> tuple[float, int]:
    started = time.perf_counter()
    seen, cursor = 0, 0
    with Client(urls, token=token, cbor=cbor) as client:
        while True:
            page = client.browse(queue, from_seq=cursor, limit=PAGE)["messages"]
            seen += len(page)
            if len(page) < PAGE:
                break
            cursor = page[-1]["seq"] + 1
    return seen / (time.perf_counter() - started), seen


def batch_read(spark, urls, queue: str, messages: int, partitions: int) -> float:
    df = (spark.read.format("raftq").option("url", ",".join(urls)).option("queue", queue)
          .option("partitionSize", -(-messages // partitions)).load())
    started = time.perf_counter()
    row = df.selectExpr("count(*) AS n", "sum(length(body)) AS bytes").first()
    elapsed = time.perf_counter() - started
    assert row.n == messages and row.bytes == messages * len(BODY), row
    return messages / elapsed


def stream_write(spark, urls, token, source: str, sink: str, messages: int, checkpoint: str) -> float:
    url = ",".join(urls)
    query = (spark.readStream.format("raftq").option("url", url).option("queue", source)
             .option("group", "bench-copy").option("maxMessagesPerTrigger", 10_000).load()
             .selectExpr("body").writeStream.format("raftq").option("url", url).option("queue", sink)
             .option("producerId", "bench-copy").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True))
    started = time.perf_counter()
    query = query.start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    with Client(urls, token=token) as client:
        stored = client.queue(sink)["stats"]["depth"]
    assert stored == messages, (stored, messages)
    return messages / elapsed


def stream_lag(spark, urls, token, queue: str, seconds: float, checkpoint: str) -> list:
    lags: list[float] = []

    def collect(batch, _batch_id):
        now = time.time()
        lags.extend(now - json.loads(r.body_json)["sent"] for r in batch.select("body_json").collect())

    url = ",".join(urls)
    with Client(urls, token=token) as client:
        client.create_queue(queue)
    query = (spark.readStream.format("raftq").option("url", url).option("queue", queue).option("group", "lag")
             .option("startingOffsets", "latest").load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", checkpoint).trigger(processingTime="0 seconds").start())
    time.sleep(5)      # the first batches pay for planning and worker start-up
    stop = threading.Event()

    def produce():
        with Client(urls, token=token) as client:
            while not stop.is_set():
                client.put(queue, {"sent": time.time()})
                time.sleep(0.02)
    producer = threading.Thread(target=produce)
    producer.start()
    time.sleep(seconds)
    stop.set()
    producer.join()
    time.sleep(3)
    query.stop()
    return lags


def run(args) -> dict:
    figures: dict = {"messages": args.messages, "body_bytes": len(BODY), "master": args.master}
    with tempfile.TemporaryDirectory(prefix="raftq-spark-bench-") as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", 3)
        try:
            cluster.start()
            if cluster.wait_for_leader(60) is None:
                raise SystemExit("no leader")
            urls, token = cluster.urls, cluster.token
            rate, _ = asyncio.run(put_load(urls, "bench-put", 16, 100, 5.0))
            figures["put_batch_msgs_per_s"] = round(rate)
            print(f"put (16 producers x 100)     {rate:>10,.0f} msgs/s", flush=True)
            rate = fill(urls, token, "bench", args.messages)
            print(f"fill (1 client x 10000)      {rate:>10,.0f} msgs/s", flush=True)

            for cbor, key in ((False, "raw_browse_msgs_per_s"), (True, "raw_browse_cbor_msgs_per_s")):
                rate, seen = raw_browse(urls, token, "bench", cbor=cbor)
                assert seen == args.messages, seen
                figures[key] = round(rate)
                print(f"{key:<28} {rate:>10,.0f} msgs/s", flush=True)

            spark = session(args.master, token)
            batch_read(spark, urls, "bench", args.messages, 2)      # warm-up: planner, workers
            for partitions in (1, 2, 4):
                rate = batch_read(spark, urls, "bench", args.messages, partitions)
                figures[f"batch_read_msgs_per_s_{partitions}p"] = round(rate)
                print(f"batch read, {partitions} partition(s)     {rate:>10,.0f} msgs/s", flush=True)
            figures["batch_read_vs_raw_browse_2p"] = round(
                figures["batch_read_msgs_per_s_2p"] / figures["raw_browse_msgs_per_s"], 3)

            copied = args.stream_messages
            fill(urls, token, "bench-stream", copied)
            rate = stream_write(spark, urls, token, "bench-stream", "bench-copy", copied,
                                str(Path(tmp) / "ck-write"))
            figures["stream_write_msgs_per_s"] = round(rate)
            figures["stream_write_vs_put_batch"] = round(rate / figures["put_batch_msgs_per_s"], 3)
            print(f"stream write ({copied} msgs)  {rate:>10,.0f} msgs/s", flush=True)

            lags = stream_lag(spark, urls, token, "bench-lag", args.lag_seconds, str(Path(tmp) / "ck-lag"))
            figures["stream_lag_p50_s"] = round(percentile(lags, 50), 3)
            figures["stream_lag_p90_s"] = round(percentile(lags, 90), 3)
            figures["stream_lag_rows"] = len(lags)
            print(f"stream lag over {len(lags)} rows: p50 {figures['stream_lag_p50_s']} s, "
                  f"p90 {figures['stream_lag_p90_s']} s", flush=True)
            spark.stop()
        finally:
            cluster.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--stream-messages", type=int, default=200_000)
    parser.add_argument("--lag-seconds", type=float, default=15.0)
    parser.add_argument("--master", default="local[2]")
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
