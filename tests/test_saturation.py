"""Heartbeats never starve (issues 9 and 11): no CPU burst a client can cause
costs an election.

Each test drives one burst at a real 3-node cluster — a body near the size
limit every second, concurrent /metrics scrapes with 10 000 queues, 2 000
concurrent long polls, the leader's snapshot of a million stored messages —
and the last drives all of them at once for 60 s with batched puts from 4
producers. While a burst runs, a probe puts one message at a time through the
leader. Each test asserts that no node's term changed and that no request
(burst or probe) was answered 503; the failure message has every answer
tallied by kind and status.

Bursts go to the leader, where a stalled heartbeat costs an election. A
client cannot ask for a snapshot: it causes one by writing, so the snapshot
test writes one-message puts (one log entry each) until the leader has taken
one, at its compaction threshold (engine/raft/consensus.py): some 10 000–15 000
entries. It runs on the cluster the other tests load (10 000 queues and the
million messages), first.
"""

import asyncio
import collections
import json
import time

import aiohttp
import pytest

from raftq.statemachine.machine import MAX_NEW_QUEUES_PER_ENTRY
from tests.conftest import start_cluster
from tests.test_api import metric_values
from tests.waiting import wait_until
from tests.wire import call

# The first test on `loaded` (the leader's snapshot) also sets it up: a minute or two.
pytestmark = [pytest.mark.integration, pytest.mark.saturation, pytest.mark.timeout(900)]

QUEUES = 10_000
STORED = 1_000_000
STORE_BATCH = 10_000                 # the most messages one put may carry
LONG_POLLS = 2_000
METRICS_SCRAPERS = 8
PRODUCERS, PRODUCER_BATCH = 4, 100
FILLERS = 4
BURST_S = 15
SATURATION_S = 60
SNAPSHOT_WAIT_S = 400
SETUP_S = 300
TX_QUEUES = MAX_NEW_QUEUES_PER_ENTRY  # queues made per transaction while setting up (one entry makes at most that)
# A node compacts its log past 10 000-15 000 entries (engine/raft/consensus.py);
# the loaded cluster's log is filled to just below, so that the first test on it
# (the leader's snapshot) writes at most a few thousand entries to cause one. The
# 60-s test waits, as it always did, for one of the nodes' next snapshots.
LOG_BEFORE_SATURATION = 9_500
REQUEST_BYTES = 4 << 20              # --max-request-bytes, the default
MESSAGE_BYTES = 1 << 20              # --max-message-bytes, the default
RETRY_PAUSE_S = 0.1                  # what a client waits after a refusal before asking again
# every client here is 127.0.0.1: one address holds all the long polls
NODE_ARGS = ("--max-long-polls", str(LONG_POLLS + 100), "--max-long-polls-per-client", str(LONG_POLLS + 100),
             "--max-connections", str(LONG_POLLS + 500), "--max-queues", str(QUEUES + 100))
REFUSED = 0                          # tallied for a connection the node closed or reset


class Tally:
    """Every answer a test got, by what was asked and by status."""

    def __init__(self):
        self.by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.refusals: collections.Counter = collections.Counter()   # (kind, the 503's message)
        self.snapshot_missed = False

    def add(self, kind: str, status: int, message: str | None = None) -> None:
        self.by_kind[kind][status] += 1
        if status == 503:
            self.refusals[kind, message] += 1

    def count(self, status: int) -> int:
        return sum(counter[status] for counter in self.by_kind.values())

    def __repr__(self) -> str:
        return repr({kind: dict(counter) for kind, counter in self.by_kind.items()}) + \
            (f"; 503s: {dict(self.refusals)}" if self.refusals else "")


def session(cluster) -> aiohttp.ClientSession:
    # no connection cap: 2 000 long polls must be open at once
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                 headers={"Authorization": f"Bearer {cluster.token}",
                                          "Content-Type": "application/json"},
                                 timeout=aiohttp.ClientTimeout(total=120))


def refusal_message(answer: bytes) -> str:
    """What a 503 said (its error's message), so a failure shows which refusal it was."""
    try:
        return json.loads(answer)["message"]
    except (ValueError, KeyError, TypeError):
        return answer[:200].decode(errors="replace")


def encode(body) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


async def ask(http, tally: Tally, kind: str, method: str, url: str, body: bytes | None = None) -> int:
    """The answer's status, tallied; a refusal is followed by a client's pause."""
    try:
        async with http.request(method, url, data=body, allow_redirects=False) as reply:
            answer = await reply.read()
            status = reply.status
    except aiohttp.ClientConnectionError:
        status, answer = REFUSED, b""
    tally.add(kind, status, refusal_message(answer) if status == 503 else None)
    if status not in (200, 201):
        await asyncio.sleep(RETRY_PAUSE_S)
    return status


async def put(http, tally, kind, url, queue, messages) -> int:
    return await ask(http, tally, kind, "POST", f"{url}/v1/queues/{queue}/messages", encode({"messages": messages}))


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


# ---- the bursts: each runs until `stop` is set ------------------------------------------------

async def probe(http, url, tally, stop: asyncio.Event) -> None:
    """One message at a time through the leader: what a quiet client sees meanwhile."""
    while not stop.is_set():
        await put(http, tally, "probe", url, "probe", [{"body": "p"}])
        await asyncio.sleep(0.05)


def near_the_limit(messages: int, limit: int) -> list:
    """`messages` equal messages whose put body is just under `limit` bytes."""
    overhead = len(encode({"messages": [{"body": ""}] * messages}))
    body = [{"body": "b" * ((limit - 1024 - overhead) // messages)}] * messages
    assert limit - 1024 - messages < len(encode({"messages": body})) < limit
    return body


async def big_bodies(http, url, tally, stop: asyncio.Event) -> None:
    """A body near the request size limit every second: 10 000 small messages
    and three of nearly the message size limit in turn."""
    bodies = [near_the_limit(STORE_BATCH, REQUEST_BYTES), near_the_limit(3, 3 * MESSAGE_BYTES)]
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
                      encode({"max": 1, "wait_ms": 5_000}))
    await asyncio.gather(*(one() for _ in range(LONG_POLLS)))


async def producers(http, url, tally, stop: asyncio.Event) -> None:
    async def one(index: int):
        while not stop.is_set():
            await put(http, tally, "batched_put", url, f"produced-{index}",
                      [{"body": f"m{i}"} for i in range(PRODUCER_BATCH)])
    await asyncio.gather(*(one(i) for i in range(PRODUCERS)))


async def fillers(http, url, tally, stop: asyncio.Event) -> None:
    """Puts of one message each: one log entry each, the fastest way to grow the log."""
    async def one(index: int):
        while not stop.is_set():
            await put(http, tally, "filler_put", url, f"filler-{index}", [{"body": "f"}])
    await asyncio.gather(*(one(i) for i in range(FILLERS)))


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


async def snapshot_taken(http, cluster, by: list[str]) -> bool:
    """Whether one of the nodes `by` took a snapshot within SNAPSHOT_WAIT_S."""
    before = await snapshots(http, cluster)
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(3.0)
        now = await snapshots(http, cluster)
        if any(now[nid] != before[nid] for nid in by):
            return True
    return False


async def run_bursts(cluster, bursts, *, seconds: float = 0.0, snapshot_by: list[str] = ()) -> Tally:
    """The bursts and the probe against the leader for `seconds`, and until one
    of the nodes `snapshot_by` took a snapshot (or SNAPSHOT_WAIT_S passed:
    `snapshot_missed`); every answer tallied."""
    tally = Tally()
    url = leader_url(cluster)
    async with session(cluster) as http:
        stop = asyncio.Event()
        running = [asyncio.create_task(burst(http, url, tally, stop)) for burst in (probe, *bursts)]
        try:
            _, took = await asyncio.gather(
                asyncio.sleep(seconds),
                snapshot_taken(http, cluster, list(snapshot_by)) if snapshot_by else asyncio.sleep(0, True))
        finally:
            stop.set()
            await asyncio.gather(*running)
    tally.snapshot_missed = not took
    return tally


def late_ticks(cluster) -> dict:
    """Each node's Raft ticks that ran late so far, and how late in all (s): /metrics."""
    def of(nid):
        values = metric_values(call("GET", cluster.url(nid) + "/metrics").raw.decode())
        return values["raftq_raft_late_ticks_total"], round(values["raftq_raft_late_ticks_seconds_total"], 2)
    return {nid: of(nid) for nid in cluster.ids}


def assert_no_election_and_no_503(cluster, drive) -> Tally:
    """The terms, the 503s and (if driven) whether the snapshot happened, in one
    assertion: a failure shows all three, and how late each node's ticks ran
    (the nodes' logs, printed below it, say where the time went)."""
    before, late_before = terms(cluster), late_ticks(cluster)
    tally = asyncio.run(drive())
    after = wait_until(lambda: answered_terms(cluster), 60, "every node answering")
    assert (after, tally.count(503), tally.snapshot_missed) == (before, 0, False), \
        f"answers: {tally}; late ticks (count, s) before: {late_before}, after: {late_ticks(cluster)}"
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
            body = encode({"put": [{"queue": f"q{i:05d}", "messages": [{"body": "q"}]} for i in names]})
            if await ask(http, Tally(), "create", "POST", f"{leader_url(cluster)}/v1/tx", body) in (200, 201):
                made += len(names)


def commit_index(cluster) -> int:
    view = cluster.ready_view(cluster.wait_for_leader(60))
    return view["commit_index"] if view else 0


async def make_queue(cluster, name: str) -> None:
    check = setup_deadline(f"creating {name}")
    async with session(cluster) as http:
        url = f"{leader_url(cluster)}/v1/queues/{name}"
        while await ask(http, Tally(), "create", "PUT", url, b"{}") not in (200, 201):
            check(0)
            url = f"{leader_url(cluster)}/v1/queues/{name}"


async def fill_log(cluster, entries: int) -> None:
    """One-message puts until the leader's log holds `entries` entries."""
    check = setup_deadline(f"filling the log to {entries} entries")
    async with session(cluster) as http:
        stop = asyncio.Event()
        running = asyncio.create_task(fillers(http, leader_url(cluster), Tally(), stop))
        try:
            while (index := await asyncio.to_thread(commit_index, cluster)) < entries:
                check(index)
                await asyncio.sleep(0.5)
        finally:
            stop.set()
            await running


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """10 000 queues, a million stored messages, and a log just short of a follower's snapshot."""
    cluster = start_cluster(tmp_path_factory.mktemp("saturation"), 3, node_args=NODE_ARGS)
    try:
        # the log first, while a write is cheap: 100 entries store the messages, 20 make the queues
        asyncio.run(fill_log(cluster, LOG_BEFORE_SATURATION - STORED // STORE_BATCH - QUEUES // TX_QUEUES))
        asyncio.run(store(cluster, "stored", STORED))
        asyncio.run(make_queues(cluster, QUEUES - 1))
        asyncio.run(make_queue(cluster, "empty"))      # where the long polls wait
        yield cluster
    finally:
        cluster.close()


# ---- the leader's snapshot, first: the log is where `loaded` left it ---------------------------------

# On `loaded`, whose million stored messages it needs too (storing them again on a cluster of its own
# cost CI a minute), and first on it: the fixture filled the log to just short of a compaction, so the
# leader takes its snapshot within a few thousand more entries (run after the other tests instead, it
# wrote for 70 s here, not 18).
def test_the_leaders_snapshot_of_a_million_messages_costs_no_election(loaded):
    leader = loaded.wait_for_leader(60)
    with loaded.client() as client:
        assert client.queue("stored")["stats"]["depth"] == STORED   # what the snapshot holds
    tally = assert_no_election_and_no_503(loaded, lambda: run_bursts(loaded, [fillers], snapshot_by=[leader]))
    assert tally.by_kind["filler_put"][201] >= 1, tally


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


# ---- everything at once ----------------------------------------------------------------------------

# This one failed on a 2-core machine when it ran after the other tests of this module (it passed
# alone, 2026-11-27). Its 503s went first (a write the lease refused before the log is proposed again
# once the majority is heard: engine/node.py LEASE_HOLD_S); then an election was left. Timing every
# tick of the three engines during it showed ticks of 0.2-1 s on all three nodes at once, most of them
# in no journal call: the engines' tick threads waited for a core and for the interpreter lock they
# shared with the engine's loop. Issue 24's one-thread engine (Raft ticked on the loop, 2026-11-28)
# removed the second wait, and `make saturation` has passed whole, this test last, in every run since
# (206, 242, 199 and 158 s), so CI runs it.
def test_60_s_of_every_burst_at_once_costs_no_election(loaded):
    every = [big_bodies, metrics_scrapes, long_polls, producers, fillers]
    tally = assert_no_election_and_no_503(
        loaded, lambda: run_bursts(loaded, every, seconds=SATURATION_S, snapshot_by=loaded.ids))
    answered = {"big_body": 201, "metrics": 200, "long_poll": 200, "batched_put": 201, "probe": 201}
    assert all(tally.by_kind[kind][status] >= 1 for kind, status in answered.items()), tally
