"""Heartbeats never starve (issues 9 and 11): no CPU burst a client can cause
costs an election.

Each test drives one burst at a real 3-node cluster — a body near the size
limit every second, concurrent /metrics scrapes with 10 000 queues, 2 000
concurrent long polls, a snapshot of a million stored messages — and the last
drives all of them at once for 60 s with batched puts from 4 producers. While
a burst runs, a probe puts one message at a time through the leader. Each
test asserts that no node's term changed and that no request (burst or probe)
was answered 503.

Bursts go to the leader, where a stalled heartbeat costs an election; a
snapshot happens on the followers (the leader defers its own compaction), where
a stalled tick makes the follower stand for election when it resumes.
"""

import asyncio
import collections
import time

import aiohttp
import pytest

from tests.conftest import start_cluster
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration

QUEUES = 10_000
STORED = 1_000_000
STORE_BATCH = 10_000                 # the most messages one put may carry
LONG_POLLS = 2_000
METRICS_SCRAPERS = 8
PRODUCERS, PRODUCER_BATCH = 4, 100
BURST_S = 15
SATURATION_S = 60
SNAPSHOT_WAIT_S = 240                # filler puts until a follower has compacted
SETUP_S = 600
TX_QUEUES = 1_000
REQUEST_BYTES = 4 << 20              # --max-request-bytes, the default
MESSAGE_BYTES = 1 << 20              # --max-message-bytes, the default
NODE_ARGS = ("--max-long-polls", str(LONG_POLLS + 100), "--max-connections", str(LONG_POLLS + 500),
             "--max-queues", str(QUEUES + 100))


class Tally:
    """Every answer a test got, by what was asked and by status."""

    def __init__(self):
        self.by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def add(self, kind: str, status: int) -> None:
        self.by_kind[kind][status] += 1

    def count(self, status: int) -> int:
        return sum(counter[status] for counter in self.by_kind.values())

    def __repr__(self) -> str:
        return repr({kind: dict(counter) for kind, counter in self.by_kind.items()})


def session(cluster) -> aiohttp.ClientSession:
    # no connection cap: 2 000 long polls must be open at once
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 headers={"Authorization": f"Bearer {cluster.token}"},
                                 timeout=aiohttp.ClientTimeout(total=120))


async def ask(http, tally: Tally, kind: str, method: str, url: str, body=None) -> int:
    async with http.request(method, url, json=body, allow_redirects=False) as reply:
        await reply.read()
        tally.add(kind, reply.status)
        return reply.status


def terms(cluster) -> dict:
    """Each node's term, once every node is ready and they agree."""
    def agreed():
        views = {nid: cluster.ready_view(nid) for nid in cluster.ids}
        if all(v and v["ready"] for v in views.values()) and len({v["term"] for v in views.values()}) == 1:
            return {nid: v["term"] for nid, v in views.items()}
        return None
    return wait_until(agreed, 60, "every node ready in one term")


def answered_terms(cluster) -> dict | None:
    """Each node's term, agreed or not; None while one does not answer."""
    views = {nid: cluster.ready_view(nid, timeout=5) for nid in cluster.ids}
    return {nid: v["term"] for nid, v in views.items()} if all(views.values()) else None


def leader_url(cluster) -> str:
    leader = cluster.wait_for_leader(60)
    assert leader is not None
    return cluster.url(leader)


async def put(http, tally, kind, url, queue, messages) -> int:
    return await ask(http, tally, kind, "POST", f"{url}/v1/queues/{queue}/messages", {"messages": messages})


# ---- the bursts: each runs until `stop` is set ------------------------------------------------

async def probe(http, url, tally, stop: asyncio.Event) -> None:
    """One message at a time through the leader: what a quiet client sees meanwhile."""
    while not stop.is_set():
        await put(http, tally, "probe", url, "probe", [{"body": "p"}])
        await asyncio.sleep(0.05)


def many_messages_body() -> list:
    # as many messages as a put may carry, filling the request to just under its limit
    size = (REQUEST_BYTES - 1024) // STORE_BATCH - len('{"body":""},')
    return [{"body": "b" * size}] * STORE_BATCH


def biggest_messages_body() -> list:
    # three messages just under the message limit
    return [{"body": "B" * (MESSAGE_BYTES - 1024)}] * 3


async def big_bodies(http, url, tally, stop: asyncio.Event) -> None:
    """A body near the size limit every second: 10 000 small messages and three
    of nearly 1 MiB in turn."""
    bodies = [many_messages_body(), biggest_messages_body()]
    sent = 0
    while not stop.is_set():
        started = time.monotonic()
        await put(http, tally, "big_body", url, "big", bodies[sent % 2])
        sent += 1
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


async def metrics_scrapes(http, url, tally, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.gather(*(ask(http, tally, "metrics", "GET", f"{url}/metrics")
                               for _ in range(METRICS_SCRAPERS)))


async def long_polls(http, url, tally, stop: asyncio.Event) -> None:
    """LONG_POLLS receives waiting at once on an empty queue, renewed as they end."""
    async def one():
        while not stop.is_set():
            await ask(http, tally, "long_poll", "POST", f"{url}/v1/queues/empty/receive",
                      {"max": 1, "wait_ms": 5_000})
    await asyncio.gather(*(one() for _ in range(LONG_POLLS)))


async def producers(http, url, tally, stop: asyncio.Event) -> None:
    async def one(index: int):
        while not stop.is_set():
            await put(http, tally, "batched_put", url, f"produced-{index}",
                      [{"body": f"m{i}"} for i in range(PRODUCER_BATCH)])
    await asyncio.gather(*(one(i) for i in range(PRODUCERS)))


async def snapshot_taken(http, cluster, tally, before: dict) -> None:
    """Puts of one message each (one log entry each), until a node's last
    snapshot is another than in `before`: a follower compacts its log once it
    holds enough entries, and its snapshot holds every stored message."""
    url = leader_url(cluster)
    deadline = time.monotonic() + SNAPSHOT_WAIT_S

    async def filler(index: int, done: asyncio.Event):
        while not done.is_set():
            await put(http, tally, "filler_put", url, f"filler-{index}", [{"body": "f"}])

    done = asyncio.Event()
    fillers = [asyncio.create_task(filler(i, done)) for i in range(4)]
    try:
        while await snapshots(http, cluster) == before:
            assert time.monotonic() < deadline, f"no node took a snapshot within {SNAPSHOT_WAIT_S} s"
            await asyncio.sleep(3.0)
    finally:
        done.set()
        await asyncio.gather(*fillers)


async def snapshots(http, cluster) -> dict:
    """Each node's last snapshot as its /metrics say: (bytes, seconds)."""
    seen = {}
    for nid in cluster.ids:
        async with http.get(f"{cluster.url(nid)}/metrics") as reply:
            text = (await reply.read()).decode()
        values = dict(line.split(" ") for line in text.splitlines()
                      if line.startswith(("raftq_snapshot_size_bytes ", "raftq_snapshot_duration_seconds ")))
        seen[nid] = (float(values["raftq_snapshot_size_bytes"]), float(values["raftq_snapshot_duration_seconds"]))
    return seen


async def run_bursts(cluster, bursts, *, seconds: float | None = None, until_snapshot: bool = False) -> Tally:
    """The bursts and the probe against the leader, for `seconds` and/or until
    a node took a new snapshot; every answer tallied."""
    tally = Tally()
    url = leader_url(cluster)
    async with session(cluster) as http:
        before = await snapshots(http, cluster) if until_snapshot else None
        stop = asyncio.Event()
        running = [asyncio.create_task(burst(http, url, tally, stop)) for burst in (probe, *bursts)]
        started = time.monotonic()
        try:
            if until_snapshot:
                await snapshot_taken(http, cluster, tally, before)
            if seconds is not None:
                await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
        finally:
            stop.set()
            await asyncio.gather(*running)
    return tally


def assert_no_election_and_no_503(cluster, drive) -> Tally:
    before = terms(cluster)
    tally = asyncio.run(drive())
    after = wait_until(lambda: answered_terms(cluster), 60, "every node answering")
    assert (after, tally.count(503)) == (before, 0), f"answers: {tally}"
    return tally


# ---- the clusters ------------------------------------------------------------------------------

def setup_deadline(what: str):
    """A check that the cluster is still making progress setting up: a cluster
    that stopped taking writes fails the test instead of hanging it."""
    deadline = time.monotonic() + SETUP_S

    def check(done: int):
        assert time.monotonic() < deadline, f"{what}: only {done} done within {SETUP_S} s"
    return check


async def store(cluster, queue: str, count: int) -> None:
    """`count` one-byte messages in `queue`, STORE_BATCH per put (one log entry each)."""
    check = setup_deadline(f"storing {count} messages")
    async with session(cluster) as http:
        stored = 0
        while stored < count:
            check(stored)
            batch = min(STORE_BATCH, count - stored)
            if await put(http, Tally(), "store", leader_url(cluster), queue, [{"body": "s"}] * batch) == 201:
                stored += batch


async def make_queues(cluster, count: int) -> None:
    """`count` queues of one message each, made by transactions of TX_QUEUES puts
    (auto-created queues; one log entry per transaction)."""
    check = setup_deadline(f"creating {count} queues")
    async with session(cluster) as http:
        made = 0
        while made < count:
            check(made)
            names = range(made, min(count, made + TX_QUEUES))
            body = {"put": [{"queue": f"q{i:05d}", "messages": [{"body": "q"}]} for i in names]}
            if await ask(http, Tally(), "create", "POST", f"{leader_url(cluster)}/v1/tx", body) in (200, 201):
                made += len(names)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """10 000 queues and a million stored messages."""
    cluster = start_cluster(tmp_path_factory.mktemp("saturation"), 3, node_args=NODE_ARGS)
    try:
        asyncio.run(make_queues(cluster, QUEUES - 1))
        assert call("PUT", f"{leader_url(cluster)}/v1/queues/empty", {}).status == 201   # where polls wait
        asyncio.run(store(cluster, "stored", STORED))
        yield cluster
    finally:
        cluster.close()


# ---- one burst at a time -------------------------------------------------------------------------

def test_a_body_near_the_size_limit_every_second_costs_no_election(loaded):
    tally = assert_no_election_and_no_503(loaded, lambda: run_bursts(loaded, [big_bodies], seconds=BURST_S))
    assert tally.by_kind["big_body"][201] >= 2, tally     # both kinds of body were stored


def test_concurrent_metrics_scrapes_with_10k_queues_cost_no_election(loaded):
    tally = assert_no_election_and_no_503(loaded, lambda: run_bursts(loaded, [metrics_scrapes], seconds=BURST_S))
    assert tally.by_kind["metrics"][200] >= METRICS_SCRAPERS, tally


def test_2000_concurrent_long_polls_cost_no_election(loaded):
    tally = assert_no_election_and_no_503(loaded, lambda: run_bursts(loaded, [long_polls], seconds=BURST_S))
    assert tally.by_kind["long_poll"][200] >= LONG_POLLS, tally


def test_a_snapshot_of_a_million_messages_costs_no_election(fresh_cluster):
    cluster = fresh_cluster(3)
    asyncio.run(store(cluster, "stored", STORED))
    tally = assert_no_election_and_no_503(cluster, lambda: run_bursts(cluster, [], until_snapshot=True))
    assert tally.by_kind["filler_put"][201] >= 1, tally


# ---- everything at once ----------------------------------------------------------------------------

def test_60_s_of_every_burst_at_once_costs_no_election(loaded):
    every = [big_bodies, metrics_scrapes, long_polls, producers]
    tally = assert_no_election_and_no_503(
        loaded, lambda: run_bursts(loaded, every, seconds=SATURATION_S, until_snapshot=True))
    answered = {"big_body": 201, "metrics": 200, "long_poll": 200, "batched_put": 201, "probe": 201}
    assert all(tally.by_kind[kind][status] >= 1 for kind, status in answered.items()), tally
