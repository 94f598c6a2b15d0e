"""The Spark source against a real 3-node cluster and a local Spark session (local[2]).

Batch reads (sizes, ranges, columns), streaming reads killed and restarted,
Trigger.AvailableNow with admission control, a leader killed mid-stream, and
the one-line errors of bad options.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.sparkutil import REPO, name, options, require_spark, spark_env, start_session
from tests.waiting import wait_until
from tests.wire import call

pytestmark = [pytest.mark.spark, pytest.mark.integration]


@pytest.fixture(scope="module")
def spark():
    require_spark()
    session = start_session("local[2]", "raftq-read-tests")
    yield session
    session.stop()


def fill(cluster, queue: str, count: int, batch: int = 10_000) -> None:
    with cluster.client(cbor=True) as client:
        for start in range(0, count, batch):
            client.put_batch(queue, [{"body": {"n": n}} for n in range(start, min(start + batch, count))])


def browse_pages_served(cluster) -> dict:
    """Per node: browse requests it answered (its Prometheus counter)."""
    headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}
    served = {}
    for nid in cluster.ids:
        text = call("GET", cluster.url(nid) + "/metrics", headers=headers).raw.decode()
        served[nid] = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                          if line.startswith("raftq_http_requests_total{")
                          and 'route="/v1/queues/{queue}/messages"' in line and 'method="GET"' in line
                          and 'status="200"' in line)
    return served


def test_batch_read_of_100k_messages_with_1_and_4_partitions(spark, cluster3):
    queue = name("big")
    fill(cluster3, queue, 100_000)
    for size, partitions in ((100_000, 1), (25_000, 4)):
        df = spark.read.format("raftq").options(**options(cluster3, queue, partitionSize=size)).load()
        assert df.rdd.getNumPartitions() == partitions
        before = browse_pages_served(cluster3)
        row = df.selectExpr("count(*) AS n", "count(DISTINCT seq) AS d", "min(seq) AS lo", "max(seq) AS hi",
                            "count(DISTINCT get_json_object(body_json, '$.n')) AS bodies").first()
        assert row.asDict() == {"n": 100_000, "d": 100_000, "lo": 1, "hi": 100_000, "bodies": 100_000}
    # The four partitions started at different nodes: the pages came from more than one.
    after = browse_pages_served(cluster3)
    assert sum(after[n] > before[n] for n in cluster3.ids) >= 2, (before, after)


def test_register_makes_the_source_known_by_hand_too(spark, cluster3):
    # The other tests find it with Spark's own lookup (pyspark_raftq on the path).
    import raftq.spark
    raftq.spark.register(spark)
    queue = name("reg")
    fill(cluster3, queue, 3, batch=3)
    assert spark.read.format("raftq").options(**options(cluster3, queue)).load().count() == 3


def test_batch_read_honours_offsets_and_fills_every_column(spark, cluster3):
    queue = name("cols")
    with cluster3.client() as client:
        client.put(queue, {"a": 1}, key="k1", headers={"h": "v"})
        client.put(queue, b"\x00raw")
        client.put(queue, "text")
        client.put(queue, [1, 2])
    df = spark.read.format("raftq").options(**options(cluster3, queue)).load()
    rows = [r.asDict() for r in df.orderBy("seq").collect()]
    assert [(r["seq"], r["key"], bytes(r["body"]), r["body_json"], r["headers"], r["queue"]) for r in rows] == [
        (1, "k1", b'{"a":1}', '{"a":1}', {"h": "v"}, queue),
        (2, None, b"\x00raw", None, None, queue),
        (3, None, b"text", '"text"', None, queue),
        (4, None, b"[1,2]", "[1,2]", None, queue)]
    assert all(abs(time.time() - r["put_at"].timestamp()) < 3600 for r in rows)
    ranged = spark.read.format("raftq").options(**options(
        cluster3, queue, startingOffsets='{"seq": 2}', endingOffsets='{"seq": 4}')).load()
    assert sorted(r.seq for r in ranged.collect()) == [2, 3]
    latest = spark.read.format("raftq").options(**options(cluster3, queue, startingOffsets="latest")).load()
    assert latest.count() == 0
    # Reading never consumes: the queue still holds everything for its group.
    with cluster3.client() as client:
        assert client.queue(queue)["stats"]["groups"]["default"] == {
            "depth": 4, "in_flight": 0, "cursor": 1, "paused": False, "resume_at_ms": None, "rate_limit": None}


@pytest.mark.parametrize("extra, message", [
    ({"queue": "no-such-queue"}, "option queue: queue 'no-such-queue' does not exist"),
    ({"startingOffsets": "first"}, "option startingOffsets: 'first' is not"),
    ({"startingOffsets": '{"seq": 0}'}, "option startingOffsets"),
    ({"endingOffsets": '{"offset": 5}'}, "option endingOffsets"),
    ({"partitionSize": "lots"}, "option partitionSize: 'lots' is not an integer"),
    ({"fetchSize": "20000"}, "option fetchSize: 20000 is not between 1 and 10000"),
    ({"replicaReads": "maybe"}, "option replicaReads: 'maybe' is not true or false"),
    ({"url": "n1:8001"}, "option url: 'n1:8001' is not an http:// or https:// address"),
    ({"startingOffset": "earliest"}, "option startingoffset: not an option of raftq readers"),
    ({"startingOffsets": '{"time_ms": -1}'}, "option startingOffsets"),
    ({"endingOffsets": '{"time_ms": 5}'}, "option endingOffsets"),
])
def test_bad_options_fail_at_load_with_a_message_naming_the_option(spark, cluster3, extra, message):
    queue = name("opts")
    with cluster3.client() as client:
        client.create_queue(queue)
    with pytest.raises(Exception) as failure:
        spark.read.format("raftq").options(**{**options(cluster3, queue), **extra}).load()
    assert message in str(failure.value)


def test_stream_only_and_batch_only_options_are_refused(spark, cluster3):
    queue = name("modes")
    with cluster3.client() as client:
        client.create_queue(queue)
    with pytest.raises(Exception, match="option maxMessagesPerTrigger: only streaming reads"):
        spark.read.format("raftq").options(**options(cluster3, queue, maxMessagesPerTrigger=5)).load().count()
    stream = spark.readStream.format("raftq").options(**options(cluster3, queue, endingOffsets="latest")).load()
    query = stream.writeStream.format("noop").start()
    with pytest.raises(Exception, match="option endingOffsets: only batch reads end"):
        query.awaitTermination(120)


def run_available_now(spark, cluster, queue, group, checkpoint, out, **extra):
    query = (spark.readStream.format("raftq").options(**options(cluster, queue, group=group, **extra)).load()
             .writeStream.format("parquet").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start(out))
    assert query.awaitTermination(300)
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def test_available_now_honours_max_messages_per_trigger(spark, cluster3, tmp_path):
    queue = name("avail")
    fill(cluster3, queue, 1_000)
    sizes = run_available_now(spark, cluster3, queue, "etl", str(tmp_path / "ck"), str(tmp_path / "out"),
                              maxMessagesPerTrigger=300)
    assert sizes == [300, 300, 300, 100]
    with cluster3.client() as client:
        client.put_batch(queue, [{"body": {"n": n}} for n in range(1_000, 1_050)])
    sizes = run_available_now(spark, cluster3, queue, "etl", str(tmp_path / "ck"), str(tmp_path / "out"),
                              maxMessagesPerTrigger=300)
    assert sizes == [50]
    seqs = [r.seq for r in spark.read.parquet(str(tmp_path / "out")).select("seq").collect()]
    assert sorted(seqs) == list(range(1, 1_051))
    # Spark commits a batch to the source when it plans the next one: the group
    # has let go of everything but (at most) the last batch.
    with cluster3.client() as client:
        assert client.queue(queue)["stats"]["groups"]["etl"]["cursor"] in (1_001, 1_051)


def test_a_streaming_read_killed_mid_stream_and_restarted_gives_exact_rows(spark, cluster3, tmp_path):
    queue, total = name("kill"), 6_000
    fill(cluster3, queue, total)
    checkpoint, out = str(tmp_path / "ck"), str(tmp_path / "out")
    env = {**os.environ, **spark_env()}
    if cluster3.token:
        env["RAFTQ_TOKEN"] = cluster3.token
    child = subprocess.Popen([sys.executable, "-m", "tests.spark_stream_child", ",".join(cluster3.urls), queue,
                              "etl", checkpoint, out, "500"], cwd=REPO, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        commits = tmp_path / "ck" / "commits"
        while time.monotonic() < deadline and len(list(commits.glob("[0-9]*"))) < 3:
            assert child.poll() is None, "the streaming child died by itself"
            time.sleep(0.2)
        assert len(list(commits.glob("[0-9]*"))) >= 3
    finally:
        os.killpg(child.pid, signal.SIGKILL)     # the child, its JVM and its Python workers
        child.wait()
    done = len(list(commits.glob("[0-9]*")))
    assert done < total // 500, "the query was meant to be killed mid-stream"
    run_available_now(spark, cluster3, queue, "etl", checkpoint, out, maxMessagesPerTrigger=500)
    rows = spark.read.parquet(out).selectExpr("count(*) AS n", "count(DISTINCT seq) AS d").first()
    assert (rows.n, rows.d) == (total, total)


def test_a_streaming_read_survives_kill_9_of_the_leader(spark, fresh_cluster, tmp_path):
    cluster = fresh_cluster(3)
    queue, total = name("failover"), 4_000
    fill(cluster, queue, total)
    out = str(tmp_path / "out")
    query = (spark.readStream.format("raftq").options(**options(cluster, queue, group="etl",
                                                                maxMessagesPerTrigger=400)).load()
             .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start(out))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(query.recentProgress) < 2:
        time.sleep(0.05)
    cluster.kill(cluster.wait_for_leader(30))
    assert query.awaitTermination(300)
    assert query.exception() is None
    rows = spark.read.parquet(out).selectExpr("count(*) AS n", "count(DISTINCT seq) AS d").first()
    assert (rows.n, rows.d) == (total, total)


def test_planning_survives_the_leader_dying_between_its_two_questions(fresh_cluster):
    """The planner asks the leader for the queue's stats, then that same node
    for its commit index. A leader killed in between used to fail the whole
    streaming query (found by CI: a kept-alive connection reset on the
    second question); the planner must ask both again of the next leader."""
    require_spark()
    from raftq.client import Client
    from raftq.spark.options import read_options
    from raftq.spark.ranges import committed_view

    cluster = fresh_cluster(3)
    queue = name("plan")
    fill(cluster, queue, 100)
    leader = cluster.wait_for_leader(30)
    killed = []
    real_ready = Client.ready

    def ready_after_killing_the_leader(client, groups=False):
        if not killed:
            cluster.kill(leader)
            killed.append(leader)
        return real_ready(client, groups)

    Client.ready = ready_after_killing_the_leader
    try:
        stats, index = committed_view(read_options(options(cluster, queue), streaming=False))
    finally:
        Client.ready = real_ready
    assert killed and stats["depth"] == 100
    new_leader = cluster.wait_for_leader(30)
    assert new_leader != killed[0]
    with cluster.client() as client:
        assert 0 < index <= client.ready()["commit_index"]


def test_a_batch_read_of_queues_in_every_raft_group_of_four_gives_exact_rows(spark, fresh_cluster):
    """The planner bounds a read by the commit index of the queue's own Raft group: another
    group's index counts another log's entries, and replica reads would be judged by it."""
    cluster = fresh_cluster(3, groups=4)
    queues = [name(f"g{n}") for n in range(4)]
    for count, queue in enumerate(queues, start=1):
        fill(cluster, queue, 500 * count)
    with cluster.client() as client:
        def every_queue_routed():
            # a node answers from its replica of group 0's catalog, which may lag the leader
            # that created the last queue by a heartbeat
            known = client.routing()["queues"]
            return known if set(queues) <= set(known) else None
        routed = wait_until(every_queue_routed, 10, "every queue in the routing")
    groups = {queue: routed[queue] for queue in queues}
    assert set(groups.values()) == {0, 1, 2, 3}, groups
    for count, queue in enumerate(queues, start=1):
        df = spark.read.format("raftq").options(**options(cluster, queue, partitionSize=200)).load()
        row = df.selectExpr("count(*) AS n", "count(DISTINCT seq) AS d").first()
        assert (row.n, row.d) == (500 * count, 500 * count), (queue, groups[queue])


def test_a_read_starts_at_a_log_time_and_a_stream_from_then_replays_retained_messages(spark, cluster3, tmp_path):
    """startingOffsets {"time_ms": T}: a batch read starts at the group's first message put at or
    after log time T; a stream's new group is made there, so it replays what the queue retained."""
    queue = name("since")
    with cluster3.client() as client:
        client.create_queue(queue, retention_ms=3_600_000)
        client.put_batch(queue, [{"body": {"n": n}} for n in range(3)])
        time.sleep(0.05)
        later = [m["seq"] for m in client.put_batch(queue, [{"body": {"n": n}} for n in range(3, 5)])["messages"]]
        since = client.browse(queue, from_seq=later[0], limit=1)["messages"][0]["put_at_ms"]
    batch = spark.read.format("raftq").options(**options(cluster3, queue, startingOffsets=f'{{"time_ms": {since}}}'))
    assert sorted(r.seq for r in batch.load().collect()) == later
    with cluster3.client() as client:                      # consumed: kept only by retention now
        client.ack(queue, [m["receipt"] for m in client.receive(queue, max=10)["messages"]])
        assert client.queue(queue)["stats"]["retained"] == 5
    out = str(tmp_path / "out")
    counts = run_available_now(spark, cluster3, queue, "replay", str(tmp_path / "checkpoint"), out,
                               startingOffsets=f'{{"time_ms": {since}}}')
    assert sum(counts) == 2
    assert sorted(r.seq for r in spark.read.parquet(out).collect()) == later
