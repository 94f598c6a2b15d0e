"""A client's routing over Raft groups (raftq/failover.py): where a queue's calls go first,
what a redirect or a failure teaches it, and when it asks the routing again."""

from raftq.failover import Failover

ROUTING = {"group_count": 2, "queues": {"a": 0, "b": 1},
           "groups": [{"id": 0, "members": ["n1", "n2", "n3"], "leader": "n1", "leader_http_addr": "h1:1",
                       "term": 3},
                      {"id": 1, "members": ["n2", "n3"], "leader": "n2", "leader_http_addr": "h2:2", "term": 2}]}


def failover() -> Failover:
    return Failover(["http://h3:3"], None, retry_for=1.0, timeout=1.0, cafile=None)


def test_a_queues_calls_go_to_its_groups_leader_and_others_to_the_current_node():
    route = failover()
    assert route.wants_routing("a")
    route.learn(ROUTING)
    assert (route.base_for("a"), route.base_for("b"), route.base_for(None)) == ("http://h1:1", "http://h2:2",
                                                                                 "http://h3:3")
    assert route.base_for("unknown") == "http://h3:3"
    assert not route.wants_routing("a")
    assert not route.wants_routing("unknown")   # asked a moment ago: not again for every call


def test_a_redirect_names_the_groups_new_leader_and_a_failure_forgets_it():
    route = failover()
    route.learn(ROUTING)
    route.follow("http://h3:3/v1/queues/b/messages", "b")
    assert route.base_for("b") == "http://h3:3" and route.base_for("a") == "http://h1:1"
    route.next_node("a")
    assert route.base_for("a") == route.base != "http://h1:1"
    assert route.base_for("b") == "http://h3:3"


def test_with_one_group_every_queue_is_that_groups_even_one_created_after_the_routing_was_asked():
    route = failover()
    route.learn({"group_count": 1, "queues": {}, "groups": [{"id": 0, "members": ["n1"], "leader": "n1",
                                                             "leader_http_addr": "h1:1", "term": 1}]})
    assert route.base_for("new") == "http://h1:1" and not route.wants_routing("new")


def test_without_an_answer_the_calls_go_where_they_went_before_routing():
    route = failover()
    route.learn(None)
    assert route.base_for("a") == "http://h3:3" and not route.wants_routing("a")
