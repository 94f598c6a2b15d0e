"""The Spark sink against a real 3-node cluster, exactly once: a replayed
streaming batch, a task that fails once (local[2,2] retries it), a leader
killed mid-write; the one-line errors of bad writes; and a write into a full disk."""

import shutil
import time

import pytest

from tests.sparkutil import name, options, require_spark, start_session
from tests.test_disk_alarm import ballast, depth, on_small_disks, refused_for
from tests.waiting import wait_until
from tests.wire import call

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def spark():
    require_spark()
    # local[2,2]: a failed task is tried again once (plain local[N] never retries).
    session = start_session("local[2,2]", "raftq-write-tests")
    yield session
    session.stop()


def stored(cluster, queue) -> list:
    out, cursor = [], 0
    with cluster.client(cbor=True) as client:
        while True:
            page = client.browse(queue, from_seq=cursor, limit=10_000)["messages"]
            out += page
            if len(page) < 10_000:
                return out
            cursor = page[-1]["seq"] + 1


def fill(cluster, queue: str, count: int) -> None:
    with cluster.client(cbor=True) as client:
        for start in range(0, count, 10_000):
            client.put_batch(queue, [{"body": {"n": n}} for n in range(start, min(start + 10_000, count))])


def copy_stream(spark, cluster, source, sink, producer, checkpoint, *, per_trigger, transform=None, **extra):
    """availableNow: source queue -> (transform) -> sink queue; the query's progress."""
    df = spark.readStream.format("raftq").options(**options(cluster, source, group="copy",
                                                            maxMessagesPerTrigger=per_trigger)).load()
    df = transform(df) if transform else df.selectExpr("body_json AS body")
    query = (df.writeStream.format("raftq").options(**options(cluster, sink, producerId=producer, **extra))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    assert query.awaitTermination(300)
    assert query.exception() is None
    return query.recentProgress


def test_a_batch_write_stores_every_row_once_with_its_fields(spark, cluster3):
    queue = name("batch")
    df = spark.createDataFrame(
        [({"n": i, "tags": ["a"]}, f"k{i}", {"h": str(i)}, f"id{i}", 3_600_000) for i in range(300)],
        "body struct<n:int,tags:array<string>>, key string, headers map<string,string>, id string, ttl_ms long")
    df.repartition(3).write.format("raftq").options(**options(cluster3, queue)).mode("append").save()
    messages = stored(cluster3, queue)
    assert sorted((m["body"]["n"], m["body"]["tags"], m["key"], m["headers"]) for m in messages) == [
        (i, ["a"], f"k{i}", {"h": str(i)}) for i in range(300)]
    binary = spark.createDataFrame([(b"\x00\x01",), (b"\xff",)], "body binary")
    binary.write.format("raftq").options(**options(cluster3, queue)).mode("append").save()
    assert sorted(m["body"] for m in stored(cluster3, queue)[300:]) == [b"\x00\x01", b"\xff"]


@pytest.mark.parametrize("columns, message", [
    ("body string, extra int", "column extra: not a raftq message field"),
    ("body int", "column body: must be string, binary, struct, map or array, not int"),
    ("key string", "column body: a DataFrame written to raftq needs a body column"),
    ("body string, headers map<string,int>", "column headers: must be map<string,string>"),
])
def test_a_batch_write_of_a_bad_frame_fails_at_save(spark, cluster3, columns, message):
    df = spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=message):
        df.write.format("raftq").options(**options(cluster3, name("bad"))).mode("append").save()


def test_bad_write_options_fail_at_start_or_save(spark, cluster3, tmp_path):
    source = name("src")
    fill(cluster3, source, 1)
    stream = spark.readStream.format("raftq").options(**options(cluster3, source)).load().selectExpr(
        "body_json AS body")
    # Spark 4.3 builds a Python stream writer only for the first batch, not at .start():
    # the query stops at once, and awaitTermination raises the option's message.
    query = stream.writeStream.format("raftq").options(**options(cluster3, name("dst"))).option(
        "checkpointLocation", str(tmp_path / "ck")).start()
    with pytest.raises(Exception, match="option producerId: required for a streaming write"):
        query.awaitTermination(120)
    frame = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match="option producerId: only for streaming writes"):
        frame.write.format("raftq").options(**options(cluster3, name("dst"), producerId="p")).mode("append").save()
    with pytest.raises(Exception, match="option stageChunkSize: 'many' is not an integer"):
        frame.write.format("raftq").options(**options(cluster3, name("dst"), stageChunkSize="many")).mode(
            "append").save()


def test_a_replayed_streaming_batch_is_not_stored_twice_even_past_the_dedup_window(spark, cluster3, tmp_path):
    source, sink, producer = name("src"), name("dst"), name("prod")
    fill(cluster3, source, 900)
    with cluster3.client() as client:
        client.create_queue(sink, dedup_window_ms=1_000)
    checkpoint = tmp_path / "ck"
    progress = copy_stream(spark, cluster3, source, sink, producer, str(checkpoint), per_trigger=300)
    assert [p["numInputRows"] for p in progress if p["numInputRows"]] == [300, 300, 300]
    assert len(stored(cluster3, sink)) == 900
    last = max(int(p.name) for p in (checkpoint / "commits").glob("[0-9]*"))
    # As if the query died before recording the batch (the file and Hadoop's checksum of it).
    for path in (checkpoint / "commits" / str(last), checkpoint / "commits" / f".{last}.crc"):
        path.unlink(missing_ok=True)
    time.sleep(1.5)                                     # past the sink's dedup window
    progress = copy_stream(spark, cluster3, source, sink, producer, str(checkpoint), per_trigger=300)
    assert [(p["batchId"], p["numInputRows"]) for p in progress if p["numInputRows"]] == [(last, 300)]
    bodies = [m["body"] for m in stored(cluster3, sink)]
    assert sorted(bodies) == sorted(f'{{"n":{n}}}' for n in range(900))
    with cluster3.client() as client:
        assert client.producer(producer)["committed_batch"] == last


PAD = " " * 1_000


def test_a_task_that_fails_once_writes_no_duplicate(spark, cluster3, tmp_path):
    source, sink, producer = name("src"), name("dst"), name("prod")
    fill(cluster3, source, 3_000)

    urls, token = cluster3.urls, cluster3.token

    def fail_first_attempt_late(df):
        from pyspark.sql import functions as F
        from pyspark.sql.types import StringType

        def body(seq, text):
            import time as clock

            from pyspark import TaskContext

            from raftq.client import Client
            if seq == 2_500 and TaskContext.get().attemptNumber() == 0:
                # Die only once this attempt has staged rows, so its stage is an orphan to ignore.
                with Client(urls, token=token) as client:
                    deadline = clock.monotonic() + 60
                    while clock.monotonic() < deadline and not any(
                            s["messages"] >= 1_000 for s in client.producer(producer)["stages"]):
                        clock.sleep(0.05)
                raise RuntimeError("the first attempt of this task dies after staging rows")
            # Padded so that the UDF's worker flushes its output (and the writer
            # stages it) well before the row that fails.
            return text + PAD
        return df.select(F.udf(body, StringType())("seq", "body_json").alias("body"))

    # Rows reach the writer in Arrow batches of this many: small, so that the
    # failing attempt has staged chunks before its UDF raises.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        copy_stream(spark, cluster3, source, sink, producer, str(tmp_path / "ck"), per_trigger=3_000,
                    transform=fail_first_attempt_late, stageChunkSize=100)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    bodies = [m["body"] for m in stored(cluster3, sink)]
    assert sorted(bodies) == sorted(f'{{"n":{n}}}' + PAD for n in range(3_000))
    with cluster3.client() as client:
        orphans = client.producer(producer)["stages"]
    # The failed attempt did stage rows; its stage was never committed and waits for its TTL.
    assert len(orphans) == 1 and orphans[0]["messages"] >= 1_000


def test_a_streaming_write_survives_kill_9_of_the_leader(spark, fresh_cluster, tmp_path):
    cluster = fresh_cluster(3)
    source, sink, producer = name("src"), name("dst"), name("prod")
    fill(cluster, source, 12_000)
    checkpoint = str(tmp_path / "ck")
    df = spark.readStream.format("raftq").options(**options(cluster, source, group="copy",
                                                            maxMessagesPerTrigger=3_000)).load()
    query = (df.selectExpr("body_json AS body").writeStream.format("raftq")
             .options(**options(cluster, sink, producerId=producer, stageChunkSize=100))
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    with cluster.client() as client:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not client.producer(producer)["stages"]:
            time.sleep(0.02)
        assert client.producer(producer)["stages"], "no stage appeared to kill the leader under"
    cluster.kill(cluster.wait_for_leader(30))
    assert query.awaitTermination(300)
    assert query.exception() is None
    bodies = [m["body"] for m in stored(cluster, sink)]
    assert sorted(bodies) == sorted(f'{{"n":{n}}}' for n in range(12_000))
    shutil.rmtree(checkpoint)


def test_a_batch_that_another_writer_committed_past_fails_the_query(spark, cluster3, tmp_path):
    """Anyone with the data token may commit under any producer id: a mark moved past the
    query's batch makes that batch a duplicate, and its rows are dropped. The sink must fail
    the query then, never report the batch written."""
    source, sink, producer = name("src"), name("dst"), name("prod")
    fill(cluster3, source, 30)
    with cluster3.client() as client:           # another writer, before the query's first batch
        client.stage(producer, "other", 0, name("elsewhere"), [{"body": "not the query's"}])
        client.commit_stages(producer, 5, [{"token": "other", "chunks": 1}])
    df = spark.readStream.format("raftq").options(**options(cluster3, source, group="copy")).load()
    query = (df.selectExpr("body_json AS body").writeStream.format("raftq")
             .options(**options(cluster3, sink, producerId=producer))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    with pytest.raises(Exception, match="batch 0 was NOT written: the producer's committed batch is already 5"):
        query.awaitTermination(300)
    with cluster3.client() as client:
        assert client.producer(producer)["committed_batch"] == 5
        assert sink not in [q["name"] for q in client.queues()["queues"]]


def test_a_write_into_a_disk_alarm_fails_clearly_and_stores_nothing(spark, tmp_path):
    """A node of the cluster in disk alarm (tests/test_disk_alarm.py): the write fails with the
    node's 507, which names it and its free bytes, not a retry loop; nothing is staged or stored."""
    frame = spark.createDataFrame([(f"row {n}",) for n in range(20)], "body string").coalesce(1)
    with on_small_disks(tmp_path / "small-disks") as cluster:
        leader = cluster.wait_for_leader(30)
        full = next(node_id for node_id in cluster.ids if node_id != leader)
        with ballast(cluster, full):
            wait_until(lambda: refused_for(cluster.url(leader), full), 15, f"the leader to see {full}'s alarm")
            refusal = rf"507 insufficient_storage: node {full} is in disk alarm: \d+ bytes free"
            with pytest.raises(Exception, match=refusal):
                frame.write.format("raftq").options(**options(cluster, "in-alarm")).mode("append").save()
        assert depth(cluster.url(leader), "in-alarm") is None
        assert call("GET", cluster.url(leader) + "/v1/producers").body["producers"] == []   # nothing staged
