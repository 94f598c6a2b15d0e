"""Log time at the edges of a cluster's life, seen through HTTP as a client sees it."""

import json
import time
import urllib.error
import urllib.request

import pytest

from raftq.client import Client
from raftq.local import LocalCluster

pytestmark = pytest.mark.integration


def put_at_the_first_chance(cluster: LocalCluster, queue: str, message: dict,
                            timeout: float = 30.0) -> str:
    """Offer a put to every node in turn, without pause, from before any leader
    exists: the first node to take it is the leader, at the first moment it can.

    Returns that leader's URL.
    """
    body = json.dumps({"messages": [message]}).encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for url in cluster.urls:
            request = urllib.request.Request(f"{url}/v1/queues/{queue}/messages", data=body,
                                             method="POST")
            if cluster.token:
                request.add_header("Authorization", f"Bearer {cluster.token}")
            try:
                with urllib.request.urlopen(request, timeout=5) as reply:
                    if reply.status == 201:
                        return url
            except urllib.error.HTTPError as refusal:   # 307 from a follower, 503 while electing
                refusal.close()
            except OSError:                            # not listening yet
                pass
    raise AssertionError("no node took the put within 30 s")


def test_a_brand_new_cluster_stamps_its_first_commands_with_real_time(tmp_path):
    """The first put, receive and ack of a cluster, sent while it is still electing.

    Stamped with log time 0, the put's 60 s TTL and the receive's 30 s lease
    ended the moment log time jumped to the wall clock: the ack was stale and
    the message expired (issue 7).
    """
    cluster = LocalCluster.create(tmp_path / "c", 3)
    try:
        sent_at_ms = time.time() * 1000
        cluster.start()
        leader = put_at_the_first_chance(cluster, "t", {"body": "x", "ttl_ms": 60_000, "id": "first"})
        with Client(leader, token=cluster.token, retry_for=30) as client:
            received = client.receive("t", max=1)["messages"]
            time.sleep(0.3)
            assert client.ack("t", [received[0]["receipt"]]) == {"acked": 1, "stale": []}
            stats = client.queue("t")["stats"]
        assert len(received) == 1
        assert sent_at_ms - 1000 < received[0]["put_at_ms"] < time.time() * 1000 + 1000
        assert stats["acked_total"] == 1
        assert stats["expired_total"] == 0
        assert stats["depth"] == 0
    finally:
        cluster.close()


def put_at_ms(client, queue: str, seq: int) -> int:
    [message] = client.browse(queue, from_seq=seq, limit=1)["messages"]
    assert message["seq"] == seq
    return message["put_at_ms"]


def test_log_time_does_not_run_while_no_node_leads(fresh_cluster):
    """Log time continues from the applied log time with the leaders'
    monotonic clocks: the time the whole cluster was down is not counted, as
    it would be by a wall clock."""
    cluster = fresh_cluster(3)
    first_sent = time.monotonic()
    with cluster.client() as client:
        first = client.put("clock", "before")["messages"][0]["seq"]
        before = put_at_ms(client, "clock", first)
    for nid in cluster.ids:
        cluster.kill(nid)
    down = time.monotonic()
    time.sleep(2.0)   # the outage: how long it lasts is what log time must leave out
    up = time.monotonic()
    cluster.start()
    assert cluster.wait_for_leader(60) is not None
    with cluster.client(retry_for=30) as client:
        second = client.put("clock", "after")["messages"][0]["seq"]
        answered = time.monotonic()
        after = put_at_ms(client, "clock", second)
    led_ms = ((answered - first_sent) - (up - down)) * 1000
    # put_at_ms is whole milliseconds: one for each stamp's rounding
    assert before <= after <= before + led_ms + 2, (before, after, led_ms)
