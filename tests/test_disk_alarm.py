"""A full disk is a clear, bounded state (issue 47): each node's data directory on a small
tmpfs of its own, filled by a ballast file to below the node's watermark.

Every door refuses new writes with 507 insufficient_storage naming the node and its free
bytes (HTTP, the streaming wire, SQS as AWS's throttling error, the Spark writer) and stores
nothing; receives, acks, nacks, deletes and purges go on; metrics, /health/ready, the
console's data and `raftq cluster status` show the alarm; the ballast removed, writes resume
without a restart. And the cluster's --max-stored-bytes holds exactly under concurrent puts.
(The Spark writer's refusal is in tests/test_spark_write.py, beside its Spark session.)
"""

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import threading
import time

import pytest
from botocore.exceptions import ClientError

from raftq.client import Client, Producer, RaftqError
from raftq.engine.config import Sqs
from tests.conftest import STARTED_CLUSTERS, wait_for_settled_leaders
from tests.sqsutil import ACCOUNT, ADMIN, DATA, sqs_client
from tests.test_api import metric_values, read_events
from tests.test_cli import raftq
from tests.tools import SmallFilesystem
from tests.waiting import wait_until
from tests.wire import call, register

pytestmark = pytest.mark.integration

DISK_MIB = 64
FREE_LIMIT = 16 << 20          # --disk-free-limit: the watermark, with the snapshots' few KiB on top
BELOW = 4 << 20                # how far below its watermark a ballast leaves a node


@contextlib.contextmanager
def on_small_disks(root, nodes: int = 3, free_limit: int = FREE_LIMIT, **create):
    """A cluster whose nodes each have their data directory on a 64 MiB tmpfs and a watermark of
    `free_limit`, speaking SQS too; stopped and unmounted at the end. `create`: LocalCluster.create's."""
    from raftq.local import LocalCluster

    cluster = LocalCluster.create(root, nodes, node_args=("--disk-free-limit", str(free_limit)), **create)
    cluster.cfg = dataclasses.replace(cluster.cfg, sqs=Sqs(account=ACCOUNT, keys=(ADMIN, DATA)))
    cluster.write_config()
    disks = []
    try:
        for node_id in cluster.ids:
            disks.append(SmallFilesystem(root / node_id, DISK_MIB))
        register(cluster)
        STARTED_CLUSTERS.add(cluster)
        cluster.start()
        assert cluster.wait_for_leader(60) and cluster.wait_all_ready(60)
        yield cluster
    finally:
        cluster.close()
        for disk in disks:
            disk.unmount()


@pytest.fixture(scope="module")
def small_disks(tmp_path_factory):
    with on_small_disks(tmp_path_factory.mktemp("small-disks")) as cluster:
        yield cluster


@contextlib.contextmanager
def ballast(cluster, *node_ids, free: int | None = None):
    """Each node's disk filled to BELOW bytes under its watermark (or to `free` bytes free) while
    the block runs; after a block that ended well, each node out of alarm again."""
    files = []
    try:
        for node_id in node_ids:
            watermark = call("GET", cluster.url(node_id) + "/health/disk").body["watermark_bytes"]
            left = watermark - BELOW if free is None else free
            disk = os.statvfs(cluster.root / node_id)
            path = cluster.root / node_id / "ballast"
            with open(path, "wb") as out:
                os.posix_fallocate(out.fileno(), 0, disk.f_bavail * disk.f_frsize - left)
            files.append(path)
        yield
    finally:
        for path in files:
            path.unlink()
    # A node samples its disk once a second: the next test of the module, sharing the cluster,
    # would otherwise find a node it never filled still in alarm.
    for node_id in node_ids:
        wait_until(lambda: call("GET", cluster.url(node_id) + "/health/disk").body["alarm"] is False, 15,
                   f"{node_id}'s alarm to end")


def put(url: str, queue: str, body="m"):
    return call("POST", f"{url}/v1/queues/{queue}/messages", {"body": body})


def refused_for(url: str, node_id: str):
    """The 507 a put answers once the front at `url` sees `node_id` in alarm (None before)."""
    reply = put(url, "probe")
    return reply if reply.status == 507 and reply.body["node"] == node_id else None


def depth(url: str, queue: str):
    info = call("GET", f"{url}/v1/queues/{queue}")
    return info.body["stats"]["depth"] if info.status == 200 else None


def test_a_follower_below_its_watermark_stops_its_groups_writes_at_every_door_and_nothing_is_stored(small_disks):
    cluster = small_disks
    leader = cluster.wait_for_leader(30)
    full = next(node_id for node_id in cluster.ids if node_id != leader)
    url = cluster.url(leader)
    assert put(url, "kept").status == 201
    with ballast(cluster, full):
        refused = wait_until(lambda: refused_for(url, full), 15, f"the leader to refuse writes for {full}'s disk")
        body = refused.body
        assert refused.headers["Retry-After"] and body["error"] == "insufficient_storage"
        assert 0 < body["free_bytes"] < body["watermark_bytes"] and body["watermark_bytes"] >= FREE_LIMIT
        assert f"node {full} is in disk alarm: {body['free_bytes']} bytes free" in body["message"]
        assert "Nothing was stored" in body["message"]

        # HTTP: a put (also to a queue it would create), a batch, a transaction that puts, a queue's creation
        for reply in (put(url, "kept"), put(url, "new-one"),
                      call("POST", f"{url}/v1/queues/kept/messages", {"messages": [{"body": 1}, {"body": 2}]}),
                      call("POST", f"{url}/v1/tx", {"put": [{"queue": "kept", "messages": [{"body": "t"}]}]}),
                      call("PUT", f"{url}/v1/queues/made-in-alarm", {})):
            assert reply.status == 507 and reply.body["node"] == full, reply

        # the streaming wire: the Producer's future fails with the node's refusal, not a retry loop
        async def stream_put():
            async with Producer(cluster.urls, token=cluster.token, retry_for=5) as producer:
                return await asyncio.gather(await producer.send("kept", "streamed"), return_exceptions=True)
        streamed, = asyncio.run(stream_put())
        assert isinstance(streamed, RaftqError) and streamed.status == 507
        assert streamed.code == "insufficient_storage" and f"node {full} is in disk alarm" in streamed.message

        # SQS: AWS's own throttling error, which the SDK backs off on and retries, then raises
        sqs = sqs_client(url, DATA, attempts=2)
        queue_url = sqs.get_queue_url(QueueName="kept")["QueueUrl"]
        with pytest.raises(ClientError) as throttled:
            sqs.send_message(QueueUrl=queue_url, MessageBody="via sqs")
        error = throttled.value.response
        assert error["Error"]["Code"] == "RequestThrottled" and f"node {full}" in error["Error"]["Message"]
        assert error["ResponseMetadata"]["RetryAttempts"] >= 1      # retried as throttling, then raised
        with pytest.raises(ClientError, match="RequestThrottled"):
            sqs_client(url, ADMIN, attempts=1).create_queue(QueueName="sqs-made-in-alarm")

        assert depth(url, "kept") == 1
        for never_made in ("new-one", "made-in-alarm", "sqs-made-in-alarm"):
            assert depth(url, never_made) is None
    wait_until(lambda: put(url, "kept").status == 201, 15, "writes to resume")


def test_in_disk_alarm_receives_acks_nacks_deletes_and_purges_go_on(small_disks):
    cluster = small_disks
    leader = cluster.wait_for_leader(30)
    url = cluster.url(leader)
    for queue in ("drained", "purged", "deleted"):
        assert call("POST", f"{url}/v1/queues/{queue}/messages",
                    {"messages": [{"body": n} for n in range(4)]}).status == 201
    with ballast(cluster, leader):
        wait_until(lambda: refused_for(url, leader), 15, "the leader to refuse writes for its own disk")
        got = call("POST", f"{url}/v1/queues/drained/receive", {"max": 3})
        assert got.status == 200 and len(got.body["messages"]) == 3
        first, second, third = (m["receipt"] for m in got.body["messages"])
        assert call("POST", f"{url}/v1/queues/drained/ack", {"receipts": [first]}).status == 200
        assert call("POST", f"{url}/v1/queues/drained/nack", {"receipts": [second]}).status == 200
        assert call("POST", f"{url}/v1/tx", {"ack": [{"queue": "drained", "receipts": [third]}]}).status == 200
        assert call("POST", f"{url}/v1/queues/purged/groups/default/commit", {"seq": 4}).status == 200
        assert call("DELETE", f"{url}/v1/queues/deleted").status == 204
        sqs = sqs_client(url, ADMIN, attempts=1)
        queue_url = sqs.get_queue_url(QueueName="drained")["QueueUrl"]
        received = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=1)["Messages"]
        sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=received[0]["ReceiptHandle"])
        sqs.purge_queue(QueueUrl=queue_url)
        assert depth(url, "drained") == 0 and depth(url, "purged") == 0 and depth(url, "deleted") is None


def test_a_node_in_disk_alarm_says_so_in_metrics_health_the_console_and_cluster_status_once_in_its_log(small_disks):
    cluster = small_disks
    leader = cluster.wait_for_leader(30)
    full = next(node_id for node_id in cluster.ids if node_id != leader)
    with ballast(cluster, full):
        wait_until(lambda: refused_for(cluster.url(leader), full), 15, f"the leader to see {full}'s alarm")
        metrics = metric_values(call("GET", cluster.url(full) + "/metrics").raw.decode())
        assert metrics["raftq_disk_alarm"] == 1
        assert metrics["raftq_disk_free_bytes"] < metrics["raftq_disk_watermark_bytes"] < DISK_MIB << 20
        assert metrics_of(cluster, leader)["raftq_disk_alarm"] == 0
        # still ready: it serves what drains its disk, and a load balancer keeps it
        ready = call("GET", cluster.url(full) + "/health/ready")
        assert ready.status == 200 and ready.body["ready"] is True and ready.body["disk"]["alarm"] is True

        status = raftq("cluster", "status", url=cluster.url(leader), cluster=cluster).stdout
        header, *rows = status.splitlines()
        row = next(line.split() for line in rows if line.split()[:1] == [full])
        assert row[header.split().index("disk")].startswith("ALARM:")
        assert f"disk alarm on {full}: " in status and "refused (507)" in status
        nodes = json.loads(raftq("cluster", "status", "--json", url=cluster.url(leader), cluster=cluster).stdout)
        assert {n["id"]: n["disk"]["alarm"] for n in nodes["nodes"]} == {n: n == full for n in cluster.ids}

        events = read_events(cluster.url(leader) + "/v1/events?interval_ms=250", 1,
                             {"Authorization": f"Bearer {cluster.token}"})
        console = {n["id"]: n["disk"] for n in events[0]["cluster"]["nodes"]}
        assert console[full]["alarm"] is True and console[leader]["alarm"] is False
    wait_until(lambda: not metrics_of(cluster, full)["raftq_disk_alarm"], 15, f"{full}'s alarm to end")
    # one line per change of state, and no traceback however many writes were refused
    for node_id in cluster.ids:
        log = cluster.log_path(node_id).read_text()
        assert "Traceback" not in log
    log = cluster.log_path(full).read_text()
    assert log.count("disk alarm: ") == log.count("disk alarm cleared: ") >= 1


def test_the_console_shows_a_node_in_disk_alarm(small_disks):
    from tests.test_console import CHROMIUM, CHROMIUM_ARGS, WAIT_MS, browser_or_skip

    sync_playwright = browser_or_skip()
    cluster = small_disks
    leader = cluster.wait_for_leader(30)
    full = next(node_id for node_id in cluster.ids if node_id != leader)
    with ballast(cluster, full), sync_playwright() as playwright:
        wait_until(lambda: refused_for(cluster.url(leader), full), 15, f"the leader to see {full}'s alarm")
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(cluster.url(leader) + "/ui")
            page.fill("#token", cluster.token)
            page.click("#token-form button")
            alarm = page.wait_for_selector(f'#nodes tr[data-node="{full}"] .badge.bad', timeout=WAIT_MS)
            assert alarm.inner_text() == "DISK ALARM"
            assert page.query_selector(f'#nodes tr[data-node="{leader}"] .badge.bad') is None
            assert f"disk alarm on {full}" in page.inner_text("#cluster-summary")
        finally:
            browser.close()


def metrics_of(cluster, node_id: str) -> dict:
    return metric_values(call("GET", cluster.url(node_id) + "/metrics").raw.decode())


def test_every_disk_full_then_space_back_writes_resume_without_a_restart(small_disks):
    cluster = small_disks
    leader = cluster.wait_for_leader(30)
    url = cluster.url(leader)
    pids = {node_id: cluster.pid(node_id) for node_id in cluster.ids}
    with ballast(cluster, *cluster.ids):
        refused = wait_until(lambda: (reply := put(url, "after")).status == 507 and reply, 15, "writes refused")
        assert refused.body["node"] in cluster.ids
        before = depth(url, "after")
    resumed = wait_until(lambda: (reply := put(url, "after", "back")).status == 201 and reply, 15,
                         "writes to resume once space is back")
    assert depth(url, "after") == (before or 0) + 1 and resumed.body["messages"][0]["duplicate"] is False
    assert {node_id: cluster.pid(node_id) for node_id in cluster.ids} == pids


def test_a_held_disk_answer_comes_as_the_alarm_changes_and_not_before(small_disks):
    """`GET /health/disk?alarm=...&wait_ms=...` (how the nodes ask each other): held while the
    alarm is as the asker last heard it, answered as it changes; bad parameters are a 400."""
    cluster = small_disks
    leader = cluster.wait_for_leader(30)
    full = next(node_id for node_id in cluster.ids if node_id != leader)
    url = cluster.url(full) + "/health/disk"

    started = time.monotonic()
    calm = call("GET", url + "?alarm=false&wait_ms=1500")
    assert calm.status == 200 and calm.body["alarm"] is False and time.monotonic() - started >= 1.5
    started = time.monotonic()
    differs = call("GET", url + "?alarm=true&wait_ms=10000")        # not as the asker heard: at once
    assert differs.status == 200 and differs.body["alarm"] is False and time.monotonic() - started < 10

    held = {}
    asker = threading.Thread(target=lambda: held.update(
        reply=call("GET", url + "?alarm=false&wait_ms=10000"), at=time.monotonic()))
    asked = time.monotonic()
    asker.start()
    time.sleep(0.5)
    with ballast(cluster, full):
        asker.join()
        assert held["reply"].status == 200 and held["reply"].body["alarm"] is True
        assert held["at"] - asked < 5          # answered by the change, not at the end of its 10 s
    for query in ("alarm=maybe&wait_ms=100", "alarm=false", "wait_ms=100", "alarm=false&wait_ms=0",
                  "alarm=false&wait_ms=10001", "alarm=false&wait_ms=1.5", "alarm=false&wait_ms=%C2%B2"):
        refused = call("GET", f"{url}?{query}")
        assert refused.status == 400 and refused.body["error"] == "bad_request", (query, refused)


def test_idle_nodes_ask_each_other_about_their_disks_once_a_hold_not_once_a_second(small_disks):
    """Each front holds one request to every other node, answered when that node's alarm changes
    or after HOLD_S: a node of an idle 3-node cluster serves about 2 / HOLD_S of them a second,
    where polling each second served 2."""
    from raftq.api.disk import HOLD_S

    cluster = small_disks
    # the leader: the tests before filled only followers' disks, and a change of a node's alarm
    # answers the holds on it early
    node_id = cluster.wait_for_leader(30)

    def served() -> float:
        return sum(value for name, value in metrics_of(cluster, node_id).items()
                   if name.startswith("raftq_http_requests_total{") and 'route="/health/disk"' in name)

    window = 3 * HOLD_S
    before = served()
    time.sleep(window)
    # each of the two others: one answer per hold, and one or two more at the window's edges;
    # asked each second, 2 * window
    assert served() - before <= 2 * (window / HOLD_S + 2) < 2 * window


def test_with_several_groups_only_the_groups_a_node_in_alarm_holds_stop(tmp_path):
    """4 nodes, 2 Raft groups, group 1 on 2 of them: a node that holds only group 0 in alarm
    stops group 0's writes, and group 1's go on."""
    with on_small_disks(tmp_path / "grouped", 4, groups=2, replicas=2) as cluster:
        url = cluster.urls[0]
        for queue in ("first", "second"):        # the catalog places new names in its emptiest group
            assert call("PUT", f"{url}/v1/queues/{queue}", {}, follow=True).status == 201
        # a node's routing lists the catalog as its replica of group 0 has applied it: one that
        # follows there learns a placement another node's front made with the next append
        def listing_both():
            body = call("GET", f"{url}/v1/cluster/routing").body
            return body if {"first", "second"} <= set(body["queues"]) else None
        routing = wait_until(listing_both, 15, "the routing to list both queues")
        in_group = {group: next(q for q, g in routing["queues"].items() if g == group) for group in (0, 1)}
        outside = next(node_id for node_id in cluster.ids if node_id not in routing["groups"][1]["members"])
        with ballast(cluster, outside):
            refused = wait_until(lambda: (reply := call("POST", f"{url}/v1/queues/{in_group[0]}/messages",
                                                        {"body": "g0"}, follow=True)).status == 507 and reply,
                                 15, f"group 0's leader to refuse writes for {outside}'s disk")
            assert refused.body["node"] == outside and "Raft group 0" in refused.body["message"]
            held = call("POST", f"{url}/v1/queues/{in_group[1]}/messages", {"body": "g1"}, follow=True)
            assert held.status == 201, held


def test_a_write_the_leaders_disk_itself_refuses_is_answered_as_one_the_watermark_refused(tmp_path):
    """With the alarm off (--disk-free-limit 0) the leader's disk fills: its journal has no room
    for the entry, and the engine's insufficient_storage is the same 507, naming the node and
    its free bytes, not 503 "outcome unknown, retry". Room back, writes resume."""
    with on_small_disks(tmp_path / "no-alarm", free_limit=0) as cluster:
        leader = cluster.wait_for_leader(30)
        url = cluster.url(leader)
        body = "x" * (500 << 10)
        assert put(url, "filled", body).status == 201
        with ballast(cluster, leader, free=256 << 10):
            # the journal's preallocated room goes first; then an entry finds none
            for _ in range(40):
                reply = put(url, "filled", body)
                if reply.status != 201:
                    break
            assert reply.status == 507, reply
            assert reply.body["error"] == "insufficient_storage" and reply.body["node"] == leader
            assert f"node {leader}'s disk refused the write: " in reply.body["message"]
            assert reply.body["free_bytes"] < 1 << 20 and reply.body["watermark_bytes"] == 0
            stored = depth(url, "filled")
        wait_until(lambda: put(url, "filled", body).status == 201, 30, "writes to resume once there is room")
        assert depth(url, "filled") == stored + 1


def test_the_clusters_stored_bytes_cap_holds_exactly_under_concurrent_puts(fresh_cluster):
    """40 puts of 100 KiB at once against a cap of 10½ of them: exactly 10 stored, 30 refused 507,
    whatever order the log takes them in; a retried id past the cap is answered as stored before,
    and once a message is consumed the next put fits again."""
    body = "x" * (100 << 10)
    size = len(body) + len("m00")                 # a message counts its id too, as for max_bytes
    cap = 10 * size + size // 2
    cluster = fresh_cluster(3, node_args=("--max-stored-bytes", str(cap)))
    wait_for_settled_leaders(cluster)       # the burst must meet a leader, not an election
    leader = cluster.wait_for_leader(30)
    url = cluster.url(leader)
    assert call("PUT", f"{url}/v1/queues/capped", {}).status == 201
    answers, together = {}, threading.Barrier(40)

    def producer(n: int) -> None:
        together.wait()
        answers[n] = call("POST", f"{url}/v1/queues/capped/messages", {"body": body, "id": f"m{n:02d}"})
    threads = [threading.Thread(target=producer, args=(n,)) for n in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(reply.status for reply in answers.values()) == [201] * 10 + [507] * 30
    refusal = next(reply.body for reply in answers.values() if reply.status == 507)
    assert refusal["error"] == "insufficient_storage" and refusal["limit"] == cap
    assert refusal["stored_bytes"] + size > cap and "--max-stored-bytes" in refusal["message"]
    assert depth(url, "capped") == 10
    assert metrics_of(cluster, leader)['raftq_group_stored_bytes{group="0"}'] == 10 * size
    stored = next(n for n, reply in answers.items() if reply.status == 201)
    again = call("POST", f"{url}/v1/queues/capped/messages", {"body": body, "id": f"m{stored:02d}"})
    assert again.status == 201 and again.body["messages"][0]["duplicate"] is True
    refused = next(n for n, reply in answers.items() if reply.status == 507)
    with Client(cluster.urls, token=cluster.token) as client:
        client.ack("capped", [client.receive("capped", max=1)["messages"][0]["receipt"]])
    assert call("POST", f"{url}/v1/queues/capped/messages", {"body": body, "id": f"m{refused:02d}"}).status == 201
    assert call("POST", f"{url}/v1/queues/capped/messages", {"body": "x" * (size // 2 + 1)}).status == 507


def test_the_watermark_counts_the_snapshot_each_engine_reports(tmp_path):
    """A snapshot is written beside the one it replaces before that one goes: a node's watermark
    is its reserve plus its current snapshot's size, which its engine reports in the view it
    pushes to the fronts (it used to be asked for its whole status every second)."""
    with on_small_disks(tmp_path / "snapshots", free_limit=4 << 20) as cluster:
        leader = cluster.wait_for_leader(30)
        url = cluster.url(leader)
        body = "x" * (100 << 10)
        for _ in range(150):    # 15 MiB of log: a stopping engine compacts above 8-12 MiB (the
            # snapshot is small: the bodies stay in the log entries that carried them)
            assert put(url, "snapshotted", body).status == 201
        follower = next(node_id for node_id in cluster.ids if node_id != leader)
        cluster.stop(follower)
        cluster.start(follower)
        assert cluster.wait_all_ready(60)

        def watermark_and_snapshot():
            snapshot = metrics_of(cluster, follower)["raftq_snapshot_size_bytes"]
            watermark = call("GET", cluster.url(follower) + "/health/disk").body["watermark_bytes"]
            return watermark, snapshot
        wait_until(lambda: (lambda w, s: s > 0 and w == (4 << 20) + s)(*watermark_and_snapshot()), 30,
                   "the follower's watermark to count its snapshot")
