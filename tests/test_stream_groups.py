"""Producers and Consumers on the streaming wire while the leaders of several Raft groups move (issue 24).

A Producer keeps one stream per group leader (``?route=group``). When a
group's leader changes under load — a leader killed, then leader balancing
handing each group back to its preferred member once that node returns —
every message a Producer sent is confirmed or fails with an error the caller
sees, and each confirmed one is stored exactly once (the same ids resent).
Consumers of queues in every group go on receiving from the groups that did
not move and follow the ones that did; a connection routed by group whose
node hands one group's lead away ends that group's subscription alone.
"""

import asyncio
import threading
import time
from collections import Counter

import aiohttp
import cbor2
import pytest

from raftq.client import Client, Consumer, Producer
from tests.conftest import wait_for_settled_leaders
from tests.test_routing import group_leaders, queues_in_groups
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# Far beyond any failover and rebalance: a Producer that reaches them waits forever (a send
# waits for room in its window, which only confirms make).
SENDING_TIMEOUT_S = 300
FLUSH_TIMEOUT_S = 120
# A subscription that ends as its group's lead moves leaves the leases it gave to run their course
# (docs/stream.md): the consumers lease for LEASE_MS and wait longer than that for a last message.
LEASE_MS = 5_000
LAST_MESSAGE_WAIT_S = LEASE_MS / 1000 + 3


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
    wait_for_settled_leaders(cluster, 90)


def group_leaders_at(cluster, node_id: str) -> dict:
    from tests.wire import call

    routing = call("GET", cluster.url(node_id) + "/v1/cluster/routing")
    return {} if routing.status != 200 else {g["id"]: g["leader"] for g in routing.body["groups"]}


def test_producers_get_every_confirm_while_the_leaders_of_their_groups_move(fresh_cluster):
    cluster = fresh_cluster(3, groups=4)
    wait_for_settled_leaders(cluster)
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


def leader_of_a_group_but_not_of_group_0(cluster) -> str:
    leaders = group_leaders(cluster)
    return leaders[1] if leaders[1] != leaders[0] else leaders[2]


def test_consumers_of_every_group_go_on_while_one_nodes_groups_move_and_lose_no_message(fresh_cluster):
    cluster = fresh_cluster(3, groups=4)
    wait_for_settled_leaders(cluster)
    placed = queues_in_groups(cluster)
    leaders = group_leaders(cluster)
    moving = leader_of_a_group_but_not_of_group_0(cluster)
    still = {group: q for group, q in placed.items() if leaders[group] != moving}   # groups that stay put
    moved = threading.Event()
    window = {}          # when the node was killed, and when its groups were back where they belong

    def move() -> None:
        # kill -9, then back: its groups fail over, then balancing hands them back to it
        window["killed"] = time.monotonic()
        cluster.kill(moving)
        others = [n for n in cluster.ids if n != moving]
        wait_until(lambda: set(group_leaders_at(cluster, others[0]).values()) <= set(others), 60,
                   f"the groups {moving} led to fail over")
        cluster.start(moving)
        wait_until(lambda: all(group_leaders_at(cluster, others[0]).get(g) == moving for g in placed
                               if g not in still), 120, f"{moving} to lead its groups again")
        window["back"] = time.monotonic()
        moved.set()

    async def produce(queue: str, confirmed: list) -> None:
        async with Producer([cluster.url(cluster.ids[0])], token=cluster.token, retry_for=60) as producer:
            sent = []
            while not moved.is_set():
                sent.append(await producer.send(queue, f"{queue}/{len(sent)}"))
                await asyncio.sleep(0.005)      # a steady trickle, not a flood the consumers trail behind
            await producer.flush()
        confirmed.extend(f"{queue}/{n}" for n, future in enumerate(sent) if future.exception() is None)

    async def consume(queue: str, received: list, done: asyncio.Event) -> None:
        async with Consumer([cluster.url(cluster.ids[0])], queue, prefetch=50, lease_ms=LEASE_MS,
                            token=cluster.token, retry_for=60) as consumer:
            while not (done.is_set() and (message := await consumer.receive(timeout=LAST_MESSAGE_WAIT_S)) is None):
                if not done.is_set():
                    message = await consumer.receive(timeout=1)
                if message is not None:
                    received.append((time.monotonic(), message.body))
                    message.ack()
            await consumer.flush()

    async def scenario():
        confirmed = {q: [] for q in placed.values()}
        received = {q: [] for q in placed.values()}
        done = asyncio.Event()
        consumers = [asyncio.create_task(consume(q, received[q], done)) for q in placed.values()]
        mover = asyncio.create_task(asyncio.to_thread(move))
        await asyncio.wait_for(asyncio.gather(mover, *(produce(q, confirmed[q]) for q in placed.values())),
                               SENDING_TIMEOUT_S)
        done.set()
        await asyncio.wait_for(asyncio.gather(*consumers), FLUSH_TIMEOUT_S)
        return confirmed, received

    confirmed, received = asyncio.run(scenario())
    for group, q in placed.items():
        bodies = Counter(body for _, body in received[q])
        assert set(confirmed[q]) - set(bodies) == set(), f"confirmed but never received from {q} (group {group})"
        if group in still:
            # the groups that did not move: received all along, each message once (every ack settled)
            assert any(window["killed"] < at < window["back"] for at, _ in received[q]), f"{q} stalled"
            assert {body for body, count in bodies.items() if count > 1} == set(), f"{q} delivered twice"
    with Client(cluster.urls, token=cluster.token, retry_for=30) as client:
        for q in placed.values():    # every message received was acked in the end: nothing left
            assert client.queue(q)["stats"]["depth"] == 0, client.queue(q)


async def frames_until(ws, wanted, timeout: float = 60) -> list:
    """Frames from `ws` until `wanted(frame)` holds for one (the last of those returned)."""
    seen = []
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.BINARY, (msg, seen)
            seen.append(cbor2.loads(msg.data))
            if wanted(seen[-1]):
                return seen


def test_a_subscription_whose_group_is_handed_away_ends_alone_and_its_connection_serves_the_others(fresh_cluster):
    cluster = fresh_cluster(3, groups=4)
    wait_for_settled_leaders(cluster)
    placed = queues_in_groups(cluster)
    leaders = group_leaders(cluster)
    dying = leader_of_a_group_but_not_of_group_0(cluster)
    others = [n for n in cluster.ids if n != dying]
    cluster.kill(dying)
    wait_until(lambda: set(group_leaders_at(cluster, others[0]).values()) <= set(others), 60,
               f"the groups {dying} led to fail over")
    taken = next(g for g, leader in leaders.items() if leader == dying)     # failed over; goes back later
    holder = group_leaders_at(cluster, others[0])[taken]
    kept = next(g for g, leader in leaders.items() if leader == holder)     # the holder's own: it stays
    headers = {"Authorization": f"Bearer {cluster.token}"} if cluster.token else {}

    async def scenario():
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(cluster.url(holder) + "/v1/stream?route=group", headers=headers)
            assert cbor2.loads((await ws.receive(timeout=10)).data)["leader"] is True
            for group in (taken, kept):
                await ws.send_bytes(cbor2.dumps({"op": "subscribe", "sub": group, "queue": placed[group],
                                                 "prefetch": 10}))
                assert (await frames_until(ws, lambda f: f.get("sub") == group))[-1]["op"] == "subscribed"
            # the node comes back; balancing hands `taken` back to it, away from `holder`
            await asyncio.to_thread(lambda: (cluster.start(dying), wait_for_settled_leaders(cluster, 90)))
            ended = (await frames_until(ws, lambda f: f.get("sub") == taken and f["op"] == "error"))[-1]
            with Client(cluster.urls, token=cluster.token, retry_for=30) as client:
                await asyncio.to_thread(client.put, placed[kept], "still served")
                await asyncio.to_thread(client.put, placed[taken], "served elsewhere")
            return ended, (await frames_until(ws, lambda f: f["op"] == "deliver"))[-1]
    ended, delivered = asyncio.run(scenario())
    # the leader this node heard of then (the group may pass through another before it is back)
    assert ended["error"] == "not_leader" and ended["leader"] in cluster.ids and ended["leader"] != holder, ended
    assert ended["leader_url"] == cluster.url(ended["leader"])
    assert delivered["sub"] == kept and [m["body"] for m in delivered["messages"]] == ["still served"]
