"""A Spark pipeline on raftq, end to end, in one command (`make pipeline`).

1. starts a local 3-node raftq cluster (stopped again at the end);
2. producers put JSON click events {"page", "user", "at"} into the queue `clicks`;
3. a Structured Streaming job reads `clicks`, counts clicks per minute and
   page with a ten-minute watermark (append mode: each minute's count is
   written once, when it is final), and writes the counts to the raftq queue
   `totals` through the exactly-once sink;
4. a second streaming job writes the same aggregate to parquet;
5. it reads both back, prints them, and checks they agree with what was put.
The last event is stamped half an hour after the others: it moves the
watermark past every earlier minute, so their counts are final and written.

    .venv/bin/python examples/spark_pipeline.py [--events 3000] [--url http://...]

With --url it uses that cluster instead of starting one (and the token in
RAFTQ_TOKEN, if it needs one).
"""

import argparse
import datetime
import json
import os
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from raftq.client import Client  # noqa: E402
from raftq.local import LocalCluster  # noqa: E402

PAGES = ["/", "/pricing", "/docs", "/blog", "/signup"]
EVENT_SCHEMA = "page string, user string, at timestamp"


def produce(urls, token, events: int) -> Counter:
    """Put click events spread over five minutes; the counts a correct pipeline must find."""
    rng = random.Random(7)
    start = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.timezone.utc)
    expected = Counter()
    batch = []
    with Client(urls, token=token) as client:
        for n in range(events):
            at = start + datetime.timedelta(seconds=rng.uniform(0, 300))
            page = rng.choice(PAGES)
            batch.append({"body": {"page": page, "user": f"u{rng.randint(1, 50)}", "at": at.isoformat()},
                          "id": f"click-{n}"})
            expected[(at.strftime("%H:%M"), page)] += 1
            if len(batch) == 1_000:
                client.put_batch("clicks", batch)
                batch = []
        closing = start + datetime.timedelta(minutes=30)
        batch.append({"body": {"page": "/", "user": "u0", "at": closing.isoformat()}, "id": "click-closing"})
        client.put_batch("clicks", batch)
    return expected


def session():
    os.environ.update({"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                       "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
                       "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("raftq-pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    import raftq.spark
    raftq.spark.register(spark)
    return spark


def clicks_per_minute_and_page(spark, raftq_options: dict, group: str):
    from pyspark.sql import functions as F
    clicks = (spark.readStream.format("raftq").options(**raftq_options).option("queue", "clicks")
              .option("group", group).option("maxMessagesPerTrigger", 1_000).load()
              .select(F.from_json("body_json", EVENT_SCHEMA).alias("click")).select("click.*"))
    return (clicks.withWatermark("at", "10 minutes").groupBy(F.window("at", "1 minute"), "page")
            .agg(F.count("*").alias("clicks"))
            .select(F.date_format("window.start", "HH:mm").alias("minute"), "page", "clicks"))


def run(spark, raftq_options: dict, work: Path) -> tuple[list, list]:
    from pyspark.sql import functions as F
    totals = clicks_per_minute_and_page(spark, raftq_options, "pipeline-totals")
    to_raftq = (totals.select(F.concat_ws(" ", "minute", "page").alias("key"),
                              F.struct("minute", "page", "clicks").alias("body"))
                .writeStream.outputMode("append").format("raftq").options(**raftq_options)
                .option("queue", "totals").option("producerId", "pipeline-totals")
                .option("checkpointLocation", str(work / "ck-totals")).trigger(availableNow=True).start())
    to_raftq.awaitTermination()

    parquet = str(work / "totals.parquet")
    to_parquet = (clicks_per_minute_and_page(spark, raftq_options, "pipeline-parquet")
                  .writeStream.outputMode("append").format("parquet")
                  .option("checkpointLocation", str(work / "ck-parquet")).trigger(availableNow=True)
                  .start(parquet))
    to_parquet.awaitTermination()

    in_raftq = [json.loads(r.body_json) for r in spark.read.format("raftq").options(**raftq_options)
                .option("queue", "totals").load().collect()]
    in_parquet = [r.asDict() for r in spark.read.parquet(parquet).collect()]
    return in_raftq, in_parquet


def show(title: str, rows: list) -> None:
    print(f"\n{title}")
    print(f"  {'minute':<7} {'page':<9} {'clicks':>6}")
    for row in sorted(rows, key=lambda r: (r["minute"], r["page"])):
        print(f"  {row['minute']:<7} {row['page']:<9} {row['clicks']:>6}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=3_000)
    parser.add_argument("--url", help="comma-separated nodes of a running cluster (default: start one)")
    args = parser.parse_args()
    token = os.environ.get("RAFTQ_TOKEN")
    with tempfile.TemporaryDirectory(prefix="raftq-pipeline-") as tmp:
        work = Path(tmp)
        cluster = None
        if args.url:
            urls = args.url.split(",")
        else:
            cluster = LocalCluster.create(work / "cluster", 3)
            token = cluster.token
            cluster.start()
            if cluster.wait_for_leader(60) is None:
                print("the local cluster elected no leader", file=sys.stderr)
                cluster.close()
                return 1
            urls = cluster.urls
            print(f"raftq: 3-node cluster at {', '.join(urls)}")
        try:
            expected = produce(urls, token, args.events)
            print(f"put {args.events} click events into queue 'clicks'")
            spark = session()
            raftq_options = {"url": ",".join(urls), **({"token": token} if token else {})}
            in_raftq, in_parquet = run(spark, raftq_options, work)
            spark.stop()
        finally:
            if cluster is not None:
                cluster.stop()
    show("clicks per minute and page, written to raftq queue 'totals':", in_raftq)
    show("the same aggregate, written to parquet:", in_parquet)
    want = {(m, p): c for (m, p), c in expected.items()}
    got_raftq = {(r["minute"], r["page"]): r["clicks"] for r in in_raftq}
    got_parquet = {(r["minute"], r["page"]): r["clicks"] for r in in_parquet}
    ok = got_raftq == want == got_parquet and len(in_raftq) == len(want)
    print(f"\n{'OK' if ok else 'MISMATCH'}: {sum(want.values())} clicks in {len(want)} (minute, page) cells; "
          f"raftq and parquet {'agree with' if ok else 'differ from'} what was put")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
