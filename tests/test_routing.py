"""Routing a request to its queue's Raft group (issue 24), against real clusters.

GET /v1/cluster/routing, the `group` parameter of a listing, the groups of
`/v1/cluster`, and a client that keeps the routing: each group's leader
after a failover of the one it knew.
"""

import uuid
from urllib.parse import urlsplit

import pytest

from raftq.client import Client
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration


def qname() -> str:
    return "r-" + uuid.uuid4().hex[:10]


def test_the_routing_names_each_group_its_members_its_leader_and_each_queue_its_group(cluster3):
    leader = cluster3.wait_for_leader(30)
    q = qname()
    assert call("PUT", f"{cluster3.url(leader)}/v1/queues/{q}", {}).status == 201
    for node_id in cluster3.ids:   # any node answers, from what it has heard
        routing = call("GET", f"{cluster3.url(node_id)}/v1/cluster/routing")
        assert routing.status == 200, routing
        assert routing.body["group_count"] == 1
        [group] = routing.body["groups"]
        assert group["id"] == 0 and sorted(group["members"]) == sorted(cluster3.ids)
        assert group["leader"] == leader and group["term"] >= 1
        assert group["leader_http_addr"] == urlsplit(cluster3.url(leader)).netloc
        # a follower's catalog is its replica's: the queue is there once it applied its creation
        assert wait_until(lambda: q in call("GET", f"{cluster3.url(node_id)}/v1/cluster/routing").body["queues"], 10)
        assert call("GET", f"{cluster3.url(node_id)}/v1/cluster/routing").body["queues"][q] == 0


def test_the_routing_of_one_group_and_a_group_that_is_not_one(cluster3):
    url = cluster3.url(cluster3.wait_for_leader(30))
    assert call("GET", f"{url}/v1/cluster/routing?group=0").body["groups"][0]["id"] == 0
    for bad in ("1", "-1", "x", "%C2%B2"):
        refused = call("GET", f"{url}/v1/cluster/routing?group={bad}")
        assert refused.status == 400 and refused.body["error"] == "bad_request", refused


def test_a_listing_of_one_group_is_that_groups_queues(cluster3):
    url = cluster3.url(cluster3.wait_for_leader(30))
    q = qname()
    assert call("POST", f"{url}/v1/queues/{q}/messages", {"body": 1}).status == 201
    assert q in [queue["name"] for queue in call("GET", f"{url}/v1/queues?group=0").body["queues"]]
    assert call("GET", f"{url}/v1/queues?group=1").status == 400


def test_the_cluster_view_shows_each_group_with_its_leader_and_every_replicas_lag(cluster3):
    leader = cluster3.wait_for_leader(30)
    view = call("GET", cluster3.url(leader) + "/v1/cluster").body
    [group] = view["groups"]
    assert group["leader"] == leader and sorted(group["members"]) == sorted(cluster3.ids)
    assert sorted(group["replicas"]) == sorted(cluster3.ids)
    assert all(replica["lag"] is not None and replica["lag"] >= 0 for replica in group["replicas"].values())
    ready = call("GET", cluster3.url(leader) + "/health/ready").body
    assert {group: state["role"] for group, state in ready["raft_groups"].items()} == {"0": "leader"}


def test_a_client_keeps_the_routing_and_finds_the_new_leader_of_a_group_after_a_failover(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    follower = next(n for n in cluster.ids if n != leader)
    q = qname()
    with Client([cluster.url(follower)], token=cluster.token, retry_for=30) as client:
        client.create_queue(q)
        assert client.routing()["groups"][0]["leader"] == leader
        client.put(q, "before")
        cluster.kill(leader)
        new_leader = cluster.wait_for_leader(30, among=[n for n in cluster.ids if n != leader])
        client.put(q, "after")
        assert [m["body"] for m in client.receive(q, max=10)["messages"]] == ["before", "after"]
        assert wait_until(lambda: client.routing()["groups"][0]["leader"] == new_leader, 10)


def test_rebalance_of_one_group_has_nothing_to_move_and_the_cli_says_so(cluster3):
    from tests.test_cli import raftq

    url = cluster3.url(cluster3.wait_for_leader(30))
    answer = call("POST", f"{url}/v1/cluster/rebalance")
    assert answer.status == 200 and answer.body == {"groups": [], "moved": 0}, answer
    assert "one Raft group: nothing to balance" in raftq("cluster", "rebalance", url=url, cluster=cluster3).stdout


def test_verify_of_one_group_and_of_a_group_that_is_not_one(cluster3):
    url = cluster3.url(cluster3.wait_for_leader(30))
    assert call("POST", f"{url}/v1/cluster/verify?group=0").body["agree"] is True
    assert call("POST", f"{url}/v1/cluster/verify?group=3").status == 400
