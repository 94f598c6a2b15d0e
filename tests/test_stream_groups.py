"""Producers on the streaming wire while the leaders of several Raft groups move (issue 24).

A Producer keeps one stream per group leader (``?route=group``). When a
group's leader changes under load — a leader killed, then leader balancing
handing each group back to its preferred member once that node returns —
every message a Producer sent is confirmed or fails with an error the caller
sees, and each confirmed one is stored exactly once (the same ids resent).
"""

import asyncio
import threading
from collections import Counter

import pytest

from raftq.client import Client, Producer
from tests.conftest import wait_for_preferred_leaders
from tests.test_routing import group_leaders, queues_in_groups
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# Far beyond any failover and rebalance: a Producer that reaches them waits forever (a send
# waits for room in its window, which only confirms make).
SENDING_TIMEOUT_S = 300
FLUSH_TIMEOUT_S = 120


def stored_bodies(client: Client, queue: str) -> Counter:
    bodies, from_seq = Counter(), 0
    while True:
        page = client.browse(queue, from_seq=from_seq, limit=1000)["messages"]
        if not page:
            return bodies
        bodies.update(m["body"] for m in page)
        from_seq = page[-1]["seq"] + 1


def move_every_leader_of(cluster, node_id: str) -> None:
    """Kill `node_id` (its groups fail over to the others), start it again, and wait until
    balancing has handed each group back to its preferred leader (a transfer per group)."""
    cluster.kill(node_id)
    others = [n for n in cluster.ids if n != node_id]
    wait_until(lambda: set(group_leaders_at(cluster, others[0]).values()) <= set(others), 60,
               f"the groups {node_id} led to fail over")
    cluster.start(node_id)
    wait_for_preferred_leaders(cluster, 90)


def group_leaders_at(cluster, node_id: str) -> dict:
    from tests.wire import call

    routing = call("GET", cluster.url(node_id) + "/v1/cluster/routing")
    return {} if routing.status != 200 else {g["id"]: g["leader"] for g in routing.body["groups"]}


def test_producers_get_every_confirm_while_the_leaders_of_their_groups_move(fresh_cluster):
    cluster = fresh_cluster(3, groups=4)
    wait_for_preferred_leaders(cluster)
    placed = queues_in_groups(cluster)
    leaders = group_leaders(cluster)
    # the node leading group 1 (not group 0's leader, so the catalog stays put): its groups move twice
    moving = leaders[1] if leaders[1] != leaders[0] else leaders[2]
    moved = threading.Event()

    async def produce(producer: Producer, name: str, queue: str, sent: list) -> None:
        # on and on until the leaders have moved, then a last window's worth
        while not moved.is_set():
            body = f"{name}/{len(sent)}"
            sent.append((body, await producer.send(queue, body)))
        for _ in range(200):
            body = f"{name}/{len(sent)}"
            sent.append((body, await producer.send(queue, body)))

    async def scenario():
        # one Producer per queue (as bench/scale.py's w6) and one writing to every queue
        producers = [Producer([cluster.url(cluster.ids[0])], token=cluster.token, retry_for=60)
                     for _ in range(len(placed) + 1)]
        sent = {(i, q): [] for i, q in enumerate(placed.values())}
        sent.update({(len(placed), q): [] for q in placed.values()})
        for producer in producers:
            await producer.__aenter__()
        try:
            mover = asyncio.create_task(asyncio.to_thread(lambda: (move_every_leader_of(cluster, moving),
                                                                   moved.set())))
            senders = [produce(producers[i], f"{i}/{q}", q, bodies) for (i, q), bodies in sent.items()]
            await asyncio.wait_for(asyncio.gather(mover, *senders), SENDING_TIMEOUT_S)
            await asyncio.wait_for(asyncio.gather(*(producer.flush() for producer in producers)),
                                   FLUSH_TIMEOUT_S)
        finally:
            moved.set()
            await asyncio.wait_for(asyncio.gather(*(producer.close() for producer in producers)),
                                   FLUSH_TIMEOUT_S)
        outcomes = {}
        for (_, q), bodies in sent.items():
            for body, future in bodies:
                outcomes[body] = (q, future.exception() or future.result())
        return outcomes

    outcomes = asyncio.run(scenario())
    failed = {body: outcome for body, (_, outcome) in outcomes.items() if isinstance(outcome, Exception)}
    assert not failed, f"{len(failed)} messages failed, e.g. {next(iter(failed.items()))}"
    with Client(cluster.urls, token=cluster.token, retry_for=30) as client:
        for q in placed.values():
            stored = stored_bodies(client, q)
            confirmed = {body for body, (queue, _) in outcomes.items() if queue == q}
            assert {body for body, count in stored.items() if count > 1} == set(), f"stored twice in {q}"
            assert confirmed - set(stored) == set(), f"confirmed but not stored in {q}"
