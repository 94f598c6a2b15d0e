"""What a put's answer claims, against real node processes with a follower
paused by SIGSTOP (and resumed by the test, by PID, whatever happens).

- `durability=all` is answered only once a lagging voter holds the entry;
- when a connected voter does not get it within the write timeout, the answer
  says `quorum`, names the voter, and the client raises DurabilityNotReached;
- `consistency=strong` puts exactly one no-op through the log.
"""

import http.client
import json
import select
import signal
from urllib.parse import urlsplit

import pytest

from raftq.client import Client, DurabilityNotReached
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration


def auth(cluster) -> dict:
    return {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}


class Pending:
    """One request sent now, whose answer is looked for later without waiting."""

    def __init__(self, url: str, method: str, path: str, body, headers: dict):
        self.conn = http.client.HTTPConnection(urlsplit(url).netloc, timeout=60)
        self.conn.request(method, path, body=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json", **headers})

    def answered(self) -> bool:
        """True once any byte of the answer has arrived."""
        readable, _, _ = select.select([self.conn.sock], [], [], 0)
        return bool(readable)

    def reply(self) -> tuple[int, dict]:
        try:
            response = self.conn.getresponse()
            return response.status, json.loads(response.read())
        finally:
            self.conn.close()


def followers(cluster, leader: str) -> list[str]:
    return [n for n in cluster.ids if n != leader]


def test_durability_all_is_answered_only_after_a_lagging_voter_caught_up(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    url, lagging = cluster.url(leader), followers(cluster, leader)[0]
    assert call("PUT", f"{url}/v1/queues/everywhere", {}, headers=auth(cluster)).status == 201
    cluster.signal(lagging, signal.SIGSTOP)
    try:
        pending = Pending(url, "POST", "/v1/queues/everywhere/messages?durability=all", {"body": "late"},
                          auth(cluster))
        # Committed on the majority (leader and the running follower) ...
        wait_until(lambda: call("GET", f"{url}/v1/queues/everywhere", headers=auth(cluster))
                   .body["stats"]["depth"] == 1, what="the put to commit")
        # ... and a later write through the same log answered: an answer the
        # leader would give without waiting for the lagging voter is out by now.
        barrier = call("POST", f"{url}/v1/queues/barrier/messages", {"body": "b"}, headers=auth(cluster))
        assert barrier.status == 201, barrier
        assert not pending.answered(), "durability=all answered while a connected voter lacked the entry"
    finally:
        cluster.signal(lagging, signal.SIGCONT)
    status, body = pending.reply()
    assert status == 201 and body["durability"] == "all", body
    assert "durability_not_reached" not in body
    view = cluster.ready_view(lagging)
    assert view["last_log_index"] >= body["commit_index"]


def test_durability_all_not_reached_in_time_says_quorum_and_the_client_raises(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    paused = followers(cluster, leader)[0]
    cluster.signal(paused, signal.SIGSTOP)
    try:
        with Client([cluster.url(leader)], token=cluster.token, timeout=60) as client:
            with pytest.raises(DurabilityNotReached) as caught:
                client.put("short", "not everywhere", id="m-1", durability="all")
    finally:
        cluster.signal(paused, signal.SIGCONT)
    shortfall = caught.value
    assert (shortfall.status, shortfall.code) == (201, "durability_not_reached")
    body = shortfall.body
    assert body["durability"] == "quorum"
    assert body["durability_not_reached"]["requested"] == "all"
    assert body["durability_not_reached"]["lagging"] == [paused]
    assert "durability=all was NOT reached" in shortfall.message
    assert body["messages"] == [{"seq": 1, "duplicate": False, "replaced_seq": None}]
    # Once the voter is back, the same put (same id) stores nothing and reaches all.
    with Client([cluster.url(leader)], token=cluster.token, timeout=60) as client:
        again = client.put("short", "not everywhere", id="m-1", durability="all")
    assert again["durability"] == "all"
    assert again["messages"] == [{"seq": 1, "duplicate": True, "replaced_seq": None}]


def test_a_strong_read_puts_one_no_op_through_the_log_and_a_leader_read_none(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    url = cluster.url(leader)
    assert call("PUT", f"{url}/v1/queues/quiet", {}, headers=auth(cluster)).status == 201

    def commit_index():
        return call("GET", url + "/health/ready", headers=auth(cluster)).body["commit_index"]

    # A queue without leases or delays has no timers: once the leader's
    # barrier is in, nothing else enters the log.
    wait_until(lambda: commit_index() == commit_index(), what="a quiet log")
    before = commit_index()
    leader_read = call("GET", f"{url}/v1/queues/quiet?consistency=leader", headers=auth(cluster))
    assert leader_read.status == 200 and commit_index() == before
    strong = call("GET", f"{url}/v1/queues/quiet?consistency=strong", headers=auth(cluster))
    assert strong.status == 200 and strong.body["stats"]["depth"] == 0
    assert commit_index() == before + 1
