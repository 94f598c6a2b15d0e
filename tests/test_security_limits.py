"""Caps with clear errors, against real nodes: queues, groups, dedup windows,
long polls (and the herd one put used to wake), membership changes that
would leave no majority, and a put buffer that never wedges."""

import asyncio
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from raftq.cli.cluster import status_table
from raftq.client import AsyncClient, RaftqError
from tests.conftest import wait_for_settled_leaders
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration


def metric(url: str, name: str) -> float:
    text = call("GET", url + "/metrics").raw.decode()
    total = 0.0
    for line in text.splitlines():
        if re.match(rf"{name}(\{{.*\}})? ", line):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    from tests.conftest import start_cluster
    cluster = start_cluster(tmp_path_factory.mktemp("capped"), 1, node_args=(
        "--max-queues", "3", "--max-groups-per-queue", "2", "--max-long-polls", "4",
        "--max-dedup-window-ms", "60000"))
    yield cluster
    cluster.close()


def test_caps_refuse_with_their_option_named_and_show_in_cluster_status(capped):
    url = capped.urls[0]
    for name in ("c1", "c2", "c3"):
        assert call("PUT", f"{url}/v1/queues/{name}", {}).status == 201
    over = call("PUT", f"{url}/v1/queues/c4", {})
    assert (over.status, over.body["error"]) == (429, "limit_reached") and "--max-queues" in over.body["message"]
    auto = call("POST", f"{url}/v1/queues/c5/messages", {"body": 1})
    assert (auto.status, auto.body["error"]) == (429, "limit_reached")
    assert call("POST", f"{url}/v1/queues/c1/messages", {"body": 1}).status == 201   # existing queues take puts
    assert call("PUT", f"{url}/v1/queues/c1/groups/g2", {}).status == 201
    groups = call("PUT", f"{url}/v1/queues/c1/groups/g3", {})
    assert (groups.status, groups.body["error"]) == (429, "limit_reached")
    window = call("PATCH", f"{url}/v1/queues/c1", {"dedup_window_ms": 60001})
    assert window.status == 400 and "--max-dedup-window-ms" in window.body["message"]
    assert call("PATCH", f"{url}/v1/queues/c1", {"dedup_window_ms": 60000}).status == 200
    limits = call("GET", f"{url}/v1/cluster").body["limits"]
    assert limits["max_queues"] == 3 and limits["max_groups_per_queue"] == 2 and limits["max_long_polls"] == 4
    assert limits["header_timeout_s"] == 10.0 and limits["max_dedup_bytes"] == 16 << 20


def test_groups_added_at_once_cannot_pass_the_cap_between_them(capped):
    """The group cap is applied by the state machine: requests packed into one log
    entry each see the groups the ones before them added."""
    url = capped.urls[0]
    assert call("PUT", f"{url}/v1/queues/c3", {}).status in (200, 201)
    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda i: call("PUT", f"{url}/v1/queues/c3/groups/fan{i}", {}), range(16)))
    assert sorted(reply.status for reply in replies) == [201] + [429] * 15
    assert {reply.body["error"] for reply in replies if reply.status == 429} == {"limit_reached"}
    assert len(call("GET", f"{url}/v1/queues/c3/groups").body["groups"]) == 2


def test_with_four_groups_a_deleted_queues_name_leaves_the_catalog_so_its_limit_bounds_queues(fresh_cluster):
    """The catalog holds at most --max-queues names for each group, but a deleted queue's name
    leaves it (the name releaser, api/releaser.py): twenty queues made and deleted one after
    another under a limit of eight names, each made as soon as the catalog has room."""
    cluster = fresh_cluster(3, groups=4, node_args=("--max-queues", "2"))   # the catalog: 8 names
    # every group led where balancing leaves it: a node that knows no leader of a group yet
    # answers 503 after its 0.8 s hold, which this test of the catalog's limit is not about
    wait_for_settled_leaders(cluster)
    url = cluster.urls[0]
    refusals = set()

    def created(name: str) -> bool:
        reply = call("PUT", f"{url}/v1/queues/{name}", {})
        if reply.status == 429:
            refusals.add(reply.body["error"])
            assert "--max-queues for each group" in reply.body["message"], reply
        else:
            assert reply.status == 201, reply
        return reply.status == 201

    for i in range(20):
        wait_until(lambda: created(f"temp{i}"), 30, f"room in the catalog for temp{i}")
        assert call("DELETE", f"{url}/v1/queues/temp{i}").status == 204
        view = call("GET", f"{url}/v1/cluster").body
        assert view["catalog"]["names"] <= 8 and view["catalog"]["limit"] == 8, view["catalog"]
    assert refusals <= {"limit_reached"}
    empty = {"names": 0, "by_group": [0, 0, 0, 0], "limit": 8}
    view = wait_until(lambda: (v := call("GET", f"{url}/v1/cluster").body)["catalog"] == empty and v,
                      30, "every deleted name released")
    assert "catalog: 0 of 8 queue names (--max-queues for each group; a deleted queue's name leaves" \
        in status_table(view)
    assert metric(url, "raftq_catalog_names") == 0 and metric(url, "raftq_catalog_names_limit") == 8

    def names() -> int:
        return call("GET", f"{url}/v1/cluster").body["catalog"]["names"]
    # names placed but never made go too: a dead-letter queue no longer named, a refused transaction's
    assert call("PUT", f"{url}/v1/queues/src", {"dead_letter": "src-dlq"}).status == 201
    assert call("POST", f"{url}/v1/queues/src/messages", {"body": 1}).status == 201
    receipt = call("POST", f"{url}/v1/queues/src/receive", {"max": 1}).body["messages"][0]["receipt"]
    assert call("POST", f"{url}/v1/queues/src/ack", {"receipts": [receipt]}).status == 200
    stale = receipt                         # its lease ended with the ack
    refused = call("POST", f"{url}/v1/tx", {"ack": [{"queue": "src", "receipts": [stale]}],
                                            "put": [{"queue": "never-made", "messages": [{"body": 2}]}]})
    assert refused.status == 409 and refused.body["error"] == "stale_receipt"
    assert names() == 3
    assert call("PATCH", f"{url}/v1/queues/src", {"dead_letter": None}).status == 200
    wait_until(lambda: names() == 1, 60, "src-dlq and never-made released")
    assert call("GET", f"{url}/v1/cluster/routing?queue=src").body["queues"] == {"src": 0}
    assert call("DELETE", f"{url}/v1/queues/src").status == 204
    wait_until(lambda: names() == 0, 30, "src released")
    for i in range(8):   # the whole limit is there to use again
        assert call("PUT", f"{url}/v1/queues/again{i}", {}).status == 201
    refused = call("PUT", f"{url}/v1/queues/again8", {})
    assert refused.status == 429 and refused.body["error"] == "limit_reached", refused
    # a release sent by hand of a live queue's name is refused: group 0's leader asks the group
    # what it retired, and its fence, which the refusal gives, does not make it so
    group = call("GET", f"{url}/v1/cluster/routing?queue=again0").body["queues"]["again0"]
    forged = call("POST", f"{url}/v1/cluster/catalog/release", {"group": group, "names": ["again0"], "fence": 0})
    assert forged.status == 409 and forged.body["error"] == "conflict", forged
    assert f"group {group} has not retired 'again0'" in forged.body["message"], forged
    fence = forged.body["fence"]
    forged = call("POST", f"{url}/v1/cluster/catalog/release", {"group": group, "names": ["again0"], "fence": fence})
    assert forged.status == 409 and "has not retired 'again0'" in forged.body["message"], forged
    unfenced = call("POST", f"{url}/v1/cluster/catalog/release", {"group": group, "names": ["again0"]})
    assert unfenced.status == 400 and "give fence" in unfenced.body["message"], unfenced
    assert call("GET", f"{url}/v1/cluster/routing?queue=again0").body["queues"] == {"again0": group}
    assert call("POST", f"{url}/v1/queues/again0/messages", {"body": 1}).status == 201


def test_with_one_group_there_is_no_catalog_to_show(capped):
    url = capped.urls[0]
    view = call("GET", f"{url}/v1/cluster").body
    assert view["catalog"] is None and "catalog:" not in status_table(view)
    assert "raftq_catalog_names" not in call("GET", url + "/metrics").raw.decode()


def test_long_polls_beyond_the_cap_get_429_too_many_waiters(capped):
    url = capped.urls[0]
    call("PUT", f"{url}/v1/queues/c2", {})

    async def scenario():
        async with AsyncClient(url, token=capped.token, retry_for=0) as client:
            waiting = [asyncio.create_task(client.receive("c2", wait_ms=3000)) for _ in range(4)]
            await asyncio.sleep(1.0)
            with pytest.raises(RaftqError) as refused:
                await client.receive("c2", wait_ms=3000)
            assert (refused.value.status, refused.value.code) == (429, "too_many_waiters")
            assert (await client.receive("c2", wait_ms=0))["messages"] == []   # not waiting: served
            await asyncio.gather(*waiting)
    asyncio.run(scenario())


def test_one_put_wakes_as_many_waiting_receivers_as_it_made_messages_ready(fresh_cluster):
    cluster = fresh_cluster(1, node_args=("--max-long-polls", "1000"))
    url = cluster.urls[0]
    call("PUT", f"{url}/v1/queues/herd", {})
    waiters = 200

    async def scenario():
        # aiohttp opens at most 100 connections per session: one session per 50 polls, one for the put
        sessions = [AsyncClient(url, token=cluster.token, retry_for=0, timeout=60) for _ in range(waiters // 50)]
        async with AsyncClient(url, token=cluster.token, retry_for=0, timeout=60) as client:
            polls = [asyncio.create_task(sessions[i % len(sessions)].receive("herd", wait_ms=30_000))
                     for i in range(waiters)]
            await asyncio.sleep(2.0)
            before = metric(url, "raftq_log_entry_commands_sum")
            await client.put_batch("herd", [{"body": i} for i in range(3)])
            done, pending = await asyncio.wait(polls, return_when=asyncio.FIRST_COMPLETED)
            while len(done) < 3:
                more, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                done |= more
            await asyncio.sleep(1.0)      # a herd would be writing its empty receives now
            after = metric(url, "raftq_log_entry_commands_sum")
            for poll in pending:
                poll.cancel()
            for session in sessions:
                await session.close()
            return after - before, [t.result() for t in done], len(pending)
    written, got, still_waiting = asyncio.run(scenario())
    assert sorted(m["body"] for r in got for m in r["messages"]) == [0, 1, 2]
    assert still_waiting == waiters - 3
    # the put and the three receives that leased (a timer tick may slip in);
    # before, the put woke all 200 and each wrote a receive, 197 of them empty
    assert written <= 1 + 3 + 2, written


def test_a_membership_change_that_leaves_no_live_majority_is_refused_unless_forced(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    url = cluster.url(leader)
    # the attack, now with the admin token: remove one voter, add two that do not exist
    others = [n for n in cluster.ids if n != leader]
    assert call("DELETE", f"{url}/v1/cluster/nodes/{others[0]}").status == 204
    cluster.kill(others[0])
    assert call("POST", f"{url}/v1/cluster/nodes", {"id": "evil1", "raft_addr": "127.0.0.1:1",
                                                    "http_addr": "127.0.0.1:2"}).status == 201
    # the same add again (a retry whose first answer was lost) is done; at other addresses, refused
    assert call("POST", f"{url}/v1/cluster/nodes", {"id": "evil1", "raft_addr": "127.0.0.1:1",
                                                    "http_addr": "127.0.0.1:2"}).status == 200
    moved = call("POST", f"{url}/v1/cluster/nodes", {"id": "evil1", "raft_addr": "127.0.0.1:5",
                                                     "http_addr": "127.0.0.1:2"})
    assert (moved.status, moved.body["error"]) == (409, "conflict"), moved
    assert "127.0.0.1:1" in moved.body["message"]
    # an address pysyncobj could not take is refused before anything is written, as is a force
    # that is not "true"; each left the voters as they were
    for bad in ({"id": "evil3", "raft_addr": "x" * 5000, "http_addr": "127.0.0.1:6"},
                {"id": "evil3", "raft_addr": "127.0.0.1:7", "http_addr": "127.0.0.1:99999"},
                {"id": "evil3", "raft_addr": "127.0.0.1", "http_addr": "127.0.0.1:6"}):
        refused = call("POST", f"{url}/v1/cluster/nodes", bad)
        assert (refused.status, refused.body["error"]) == (400, "bad_request"), refused
        assert "must be host:port" in refused.body["message"]
    maybe = call("POST", f"{url}/v1/cluster/nodes?force=maybe", {"id": "evil3", "raft_addr": "127.0.0.1:7",
                                                                 "http_addr": "127.0.0.1:6"})
    assert (maybe.status, maybe.body["error"]) == (400, "bad_request"), maybe
    assert sorted(n["id"] for n in call("GET", f"{url}/v1/cluster").body["nodes"]) == sorted([leader, others[1], "evil1"])
    second = call("POST", f"{url}/v1/cluster/nodes", {"id": "evil2", "raft_addr": "127.0.0.1:3",
                                                      "http_addr": "127.0.0.1:4"})
    assert (second.status, second.body["error"]) == (409, "conflict"), second
    assert sorted(second.body["live"]) == sorted([leader, others[1]])
    # the cluster still has a leader and takes writes
    with cluster.client(retry_for=20) as client:
        assert client.put("after", "ok")["messages"][0]["seq"] == 1
    # removing a live voter now would leave 1 live of 2
    refused = call("DELETE", f"{url}/v1/cluster/nodes/{others[1]}")
    assert refused.status == 409
    assert call("DELETE", f"{url}/v1/cluster/nodes/evil1").status == 204


def test_a_buffered_put_refused_for_good_is_set_aside_and_the_next_goes_through(fresh_cluster):
    cluster = fresh_cluster(3, node_args=("--no-auto-create",))
    url0 = cluster.url(cluster.wait_for_leader(30))
    assert call("PUT", f"{url0}/v1/queues/real", {}).status == 201
    survivor = cluster.ids[0]
    for nid in cluster.ids[1:]:
        cluster.kill(nid)
    url = cluster.url(survivor)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and call("GET", url + "/health/ready").status != 503:
        time.sleep(0.1)
    # valid where it is taken, refused for good by the leader: the queue does not exist
    assert call("POST", f"{url}/v1/queues/missing/messages?buffer=allow", {"body": "lost"}).status == 202
    assert call("POST", f"{url}/v1/queues/real/messages?buffer=allow", {"body": "kept"}).status == 202
    for nid in cluster.ids[1:]:
        cluster.start(nid)
    deadline = time.monotonic() + 60
    depth = None
    while time.monotonic() < deadline:
        leader = cluster.wait_for_leader(30)
        info = call("GET", f"{cluster.url(leader)}/v1/queues/real")
        depth = info.body["stats"]["depth"] if info.status == 200 else None
        if depth == 1:
            break
        time.sleep(0.2)
    assert depth == 1
    view = call("GET", f"{url}/v1/cluster").body
    assert view["buffer"]["dead_lettered"] == 1 and view["buffer"]["pending_bytes"] == 0
    assert metric(url, "raftq_buffer_dead_lettered_total") == 1
    log = cluster.log_path(survivor).read_text()
    assert log.count("refused for good") == 1
    from raftq.engine.storage.put_buffer import PutBuffer
    assert [(q, [m["body"] for m in ms]) for q, ms, _ in
            PutBuffer(cluster.root / survivor / "buffer").dead_records()] == [("missing", ["lost"])]
