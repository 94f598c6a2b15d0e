"""Crashes, restarts and lost majorities against real node processes.

The promise under test: a message that was acknowledged to its producer
survives the loss of any minority of nodes, and a full crash of every node.
"""

import dataclasses
import inspect
import json
import signal
import threading
import time

import pytest

from raftq.api.leader import ELECTION_HOLD_S
from chaos.power import PowerCutCluster
from raftq.client import RaftqError
from tests.waiting import wait_until
from tests.wire import call

pytestmark = pytest.mark.integration


def drain(cluster, queue: str, *, group: str = "default", idle_rounds: int = 3) -> list:
    """Receive and ack everything until the queue stays empty."""
    bodies = []
    empty = 0
    with cluster.client(retry_for=30) as client:
        while empty < idle_rounds:
            got = client.receive(queue, group=group, max=1000, wait_ms=300)["messages"]
            if not got:
                empty += 1
                continue
            empty = 0
            bodies += [m["body"] for m in got]
            client.ack(queue, [m["receipt"] for m in got])
    return bodies


class Producer(threading.Thread):
    """Puts numbered messages one at a time, recording which were acknowledged."""

    def __init__(self, cluster, queue: str):
        super().__init__(daemon=True)
        self.client = cluster.client(retry_for=20, timeout=5)
        self.queue = queue
        self.acked: list[int] = []
        self.failed: list[int] = []
        self.stop = threading.Event()

    def run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            try:
                self.client.put(self.queue, n, id=f"{self.queue}-{n}")
                self.acked.append(n)
            except (OSError, RaftqError):
                self.failed.append(n)
        self.client.close()


def acked_more(producer: Producer, count: int, what: str) -> None:
    """Wait until `producer` has `count` more acknowledged puts than now."""
    start = len(producer.acked)
    wait_until(lambda: len(producer.acked) >= start + count, timeout=60, what=what)


def test_kill_leader_under_load_loses_no_acknowledged_put(fresh_cluster):
    cluster = fresh_cluster(3)
    queue = "stream"
    producer = Producer(cluster, queue)
    producer.start()
    for _ in range(2):
        acked_more(producer, 25, "puts acknowledged before the kill")
        leader = cluster.wait_for_leader(30)
        cluster.kill(leader)
        assert cluster.wait_for_leader(30) not in (None, leader)
        acked_more(producer, 1, "a put acknowledged by the new leader")
        cluster.start(leader)
    acked_more(producer, 25, "puts acknowledged after the restarts")
    producer.stop.set()
    producer.join(60)
    assert len(producer.acked) > 50
    received = drain(cluster, queue)
    missing = set(producer.acked) - set(received)
    assert not missing, f"acknowledged but lost: {sorted(missing)[:20]}"
    # Idempotency ids: a put retried across the failover is stored once.
    assert len(received) == len(set(received))


def test_kill_all_nodes_and_restart_keeps_data(fresh_cluster):
    cluster = fresh_cluster(3)
    with cluster.client() as client:
        client.create_queue("keep", lease_ms=60000)
        for i in range(20):
            client.put_batch("keep", [{"body": f"{i}-{j}"} for j in range(50)])
        leased = client.receive("keep", max=10)["messages"]
    for nid in cluster.ids:
        cluster.kill(nid)
    cluster.start()
    assert cluster.wait_for_leader(60) is not None
    with cluster.client(retry_for=30) as client:
        stats = client.queue("keep")["stats"]
        assert stats["depth"] == 1000 and stats["in_flight"] == 10
        # Receipts issued before the crash still name live leases.
        assert client.ack("keep", [m["receipt"] for m in leased])["acked"] == 10
    assert len(drain(cluster, "keep")) == 990
    verify = call("POST", cluster.url(cluster.wait_for_leader(30)) + "/v1/cluster/verify").body
    assert verify["agree"] is True


def test_minority_node_refuses_and_is_not_ready(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    survivor = next(n for n in cluster.ids if n != leader)
    for nid in cluster.ids:
        if nid != survivor:
            cluster.kill(nid)
    wait_until(lambda: call("GET", cluster.url(survivor) + "/health/ready").status == 503,
               what="the survivor to stop being ready")
    ready = call("GET", cluster.url(survivor) + "/health/ready")
    assert ready.status == 503
    put = call("POST", cluster.url(survivor) + "/v1/queues/x/messages", {"body": 1})
    assert put.status == 503 and put.body["error"] == "no_quorum" and put.headers["Retry-After"]
    cluster.start()
    assert cluster.wait_for_leader(30) is not None


def test_five_nodes_survive_two_kills(fresh_cluster):
    cluster = fresh_cluster(5)
    with cluster.client() as client:
        client.put_batch("five", [{"body": i} for i in range(100)])
    killed = [cluster.wait_for_leader(30)]
    cluster.kill(killed[0])
    second = cluster.wait_for_leader(30)
    assert second is not None and second != killed[0]
    cluster.kill(second)
    assert cluster.wait_for_leader(30) is not None
    with cluster.client(retry_for=30) as client:
        client.put_batch("five", [{"body": i} for i in range(100, 200)])
    assert sorted(drain(cluster, "five")) == list(range(200))


def test_sigterm_leader_hands_over_and_exits_cleanly(fresh_cluster):
    cluster = fresh_cluster(3)
    leader = cluster.wait_for_leader(30)
    proc = cluster.procs[leader]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    cluster.procs.pop(leader)
    # A hand-over, not an election after a silence: the old leader saw another
    # node take the lead before it shut down (it logs "given up" otherwise).
    lines = [json.loads(line)["msg"] for line in cluster.log_path(leader).read_text().splitlines()
             if line.startswith("{")]
    assert "leadership handed over before shutdown" in lines, lines[-10:]
    successor = cluster.wait_for_leader(10)
    assert successor not in (None, leader)
    with cluster.client(retry_for=10) as client:
        assert client.put("after", "still here")["messages"][0]["seq"] == 1


def test_membership_add_remove_replace_under_load(fresh_cluster, tmp_path):
    from raftq.engine.config import NodeSpec
    from raftq.local import free_ports

    cluster = fresh_cluster(3)
    producer = Producer(cluster, "members")
    producer.start()
    try:
        # Replace n3 (dead) by n4: remove it from the membership, add the new node.
        cluster.kill("n3")
        http_port, raft_port = free_ports(2)
        n4 = NodeSpec(id="n4", raft=f"127.0.0.1:{raft_port}", http=f"127.0.0.1:{http_port}")
        with cluster.client(retry_for=30) as client:
            client.remove_node("n3")
            client.add_node(n4.id, n4.raft, n4.http)
        cluster.cfg = dataclasses.replace(
            cluster.cfg, nodes=tuple(n for n in cluster.cfg.nodes if n.id != "n3") + (n4,))
        cluster.write_config()
        cluster.start("n4")
        wait_until(lambda: (lambda v: v and v["ready"] and v["applied_index"] > 0)(cluster.ready_view("n4")),
                   what="n4 to follow the leader and apply")
        ids = sorted(n["id"] for n in call("GET", cluster.url(cluster.wait_for_leader(30)) + "/v1/cluster").body["nodes"])
        assert ids == ["n1", "n2", "n4"]
        # The new member carries the quorum: losing another original node is survivable.
        victim = next(n for n in ("n1", "n2") if n != cluster.wait_for_leader(30))
        cluster.kill(victim)
        assert cluster.wait_for_leader(30) is not None
        acked_more(producer, 25, "puts acknowledged by the new membership")
    finally:
        producer.stop.set()
        producer.join(60)
    received = drain(cluster, "members")
    assert not set(producer.acked) - set(received)


def test_restart_node_holding_100k_messages(fresh_cluster):
    cluster = fresh_cluster(3)
    with cluster.client(timeout=60) as client:
        body = "x" * 100
        for start in range(0, 100_000, 5_000):
            client.put_batch("big", [{"body": body} for _ in range(5_000)])
    leader = cluster.wait_for_leader(30)
    follower = next(n for n in cluster.ids if n != leader)
    committed = cluster.ready_view(leader)["commit_index"]
    cluster.kill(follower)
    cluster.start(follower)
    # caught up with what the leader had committed, not with what the
    # restarted follower has heard of so far
    wait_until(lambda: (lambda v: v and v["ready"] and v["applied_index"] >= committed)(
        cluster.ready_view(follower)), timeout=120, what="the restarted follower to catch up")
    depth = call("GET", cluster.url(follower) + "/v1/queues/big?consistency=any").body["stats"]["depth"]
    assert depth == 100_000


def test_buffer_allow_takes_puts_without_a_leader_and_forwards_them(fresh_cluster):
    cluster = fresh_cluster(3)
    survivor = cluster.ids[0]
    for nid in cluster.ids[1:]:
        cluster.kill(nid)
    url = cluster.url(survivor)
    wait_until(lambda: call("GET", url + "/health/ready").status == 503, what="the survivor to stop being ready")
    refused = call("POST", url + "/v1/queues/buffered/messages", {"body": "no buffer"})
    assert refused.status == 503
    bad = call("POST", url + "/v1/queues/buffered/messages?buffer=allow", {"body": 1, "ttl_ms": "x"})
    assert bad.status == 400
    taken = call("POST", url + "/v1/queues/buffered/messages?buffer=allow",
                 {"messages": [{"body": "b1", "id": "fixed-id"}, {"body": "b2"}]})
    assert taken.status == 202 and taken.body["buffered"] is True
    assert taken.body["ids"][0] == "fixed-id" and len(taken.body["ids"]) == 2
    # The node itself crashes before a leader is back: the buffer is on disk.
    cluster.kill(survivor)
    cluster.start()
    leader = cluster.wait_for_leader(30)
    assert leader is not None
    wait_until(lambda: (lambda info: info.status == 200 and info.body["stats"]["depth"] == 2)(
        call("GET", cluster.url(cluster.wait_for_leader(30)) + "/v1/queues/buffered")),
        what="the buffered puts to be forwarded")
    assert sorted(drain(cluster, "buffered")) == ["b1", "b2"]



def test_power_loss_of_every_node_under_load_loses_no_acknowledged_put(tmp_path):
    """Every node killed -9 at one instant and its journal cut back to what it
    had fsynced (chaos/power.py: the production write path, then a power cut)."""
    cluster = PowerCutCluster.create(tmp_path / "c", 3)
    producer = None
    try:
        cluster.start()
        assert cluster.wait_for_leader(60) is not None
        producer = Producer(cluster, "powered")
        producer.start()
        wait_until(lambda: len(producer.acked) >= 200, what="200 acknowledged puts")
        for nid in cluster.ids:
            cluster.signal(nid, signal.SIGKILL)
        for nid in cluster.ids:
            cluster.kill(nid)          # reaps the process, then cuts its journal
        acked_before_the_cut = list(producer.acked)
        cluster.start()
        assert cluster.wait_for_leader(60) is not None
        producer.stop.set()
        producer.join(60)
        received = drain(cluster, "powered")
    finally:
        if producer is not None:
            producer.stop.set()
        cluster.close()
    missing = set(acked_before_the_cut) - set(received)
    assert not missing, f"acknowledged but lost in the power cut: {sorted(missing)[:20]}"
    assert not set(producer.acked) - set(received)
    assert len(received) == len(set(received))


def _consensus_default(name: str):
    from raftq.engine.raft.consensus import Consensus
    return inspect.signature(Consensus).parameters[name].default


@pytest.fixture
def proxied_cluster(tmp_path):
    """Three real nodes whose Raft links each pass through a fault proxy, as in
    the chaos suite (chaos.runner.wire_proxies); everything stopped by PID."""
    from chaos.runner import wire_proxies
    from chaos.toxiproxy import ToxiproxyServer
    from raftq.local import LocalCluster
    from tests.wire import register

    server = ToxiproxyServer.start(seed=1)
    cluster = None
    try:
        cluster = LocalCluster.create(tmp_path / "cluster", 3)
        network, _ = wire_proxies(server, cluster)
        register(cluster)
        cluster.start()
        assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
        yield cluster, network
    finally:
        if cluster is not None:
            cluster.close()
        server.stop()


# The chaos prober's attempt (chaos.workload.STALE_PROBE_TIMEOUT_S): shorter
# than any hold for an election, so only a refusal answers it.
PROBE_TIMEOUT_S = 0.1
# What a refusal may take beyond the step-down on this loaded machine: the
# attempt under way (PROBE_TIMEOUT_S and a pause), the view's push to the
# front, a late tick.
REFUSAL_ALLOWANCE_S = 0.3


@pytest.mark.parametrize("method", ["blackhole", "disable"])
def test_an_isolated_leader_steps_down_and_refuses_writes_at_once(proxied_cluster, method):
    """CheckQuorum. A leader cut off from both followers (its Raft links
    silenced, or refused) hears no answer to its appends; within the longest
    election timeout it steps down, and its front refuses writes at once
    (503 no_quorum) instead of holding each for an election it cannot see.
    Short attempts, as the chaos prober makes, time the first refusal from
    the cut: within the election timeout plus one heartbeat. Before, the
    front held every attempt past its timeout until the partition healed
    (only one that slipped in as the leader's lease ran out was refused)."""
    cluster, network = proxied_cluster
    leader = cluster.wait_for_leader(30)
    url = cluster.url(leader) + "/v1/queues/isolated/messages"
    assert call("POST", url, {"body": "before"}).status == 201
    network.cut(network.pairs_touching(leader), method)
    cut = time.monotonic()     # the last answer the leader hears came before this
    refused = None
    while time.monotonic() - cut < 10:
        try:
            reply = call("POST", url, {"body": "during"}, timeout=PROBE_TIMEOUT_S)
        except OSError:       # held (or slow): no answer within the attempt
            continue
        if reply.status == 503:
            refused = reply, time.monotonic() - cut
            break
        time.sleep(0.02)
    assert refused is not None, "the isolated leader never refused a write"
    reply, after = refused
    assert reply.body["error"] == "no_quorum" and reply.headers["Retry-After"]
    bound = _consensus_default("election_timeout")[1] + _consensus_default("heartbeat")
    assert after <= bound + REFUSAL_ALLOWANCE_S, f"refused {after:.2f} s after the cut"
    # it stepped down (its view says so, the step-down is counted), and says
    # so at once: no write is held, each is refused well before the hold ends
    wait_until(lambda: call("GET", cluster.url(leader) + "/health/ready").body["role"] == "follower",
               what="the isolated leader to step down")
    metrics = call("GET", cluster.url(leader) + "/metrics").raw.decode()
    assert "raftq_quorum_step_downs_total 1.0" in metrics
    for _ in range(5):
        reply = call("POST", url, {"body": "during"}, timeout=ELECTION_HOLD_S / 2)
        assert reply.status == 503 and reply.body["error"] == "no_quorum", reply
    # the others elected a leader meanwhile; once healed, the old one follows it
    network.heal()
    new = cluster.wait_for_leader(30)
    assert new is not None
    wait_until(lambda: call("GET", cluster.url(leader) + "/health/ready").status == 200,
               what="the old leader to follow the new one")
    assert call("POST", url, {"body": "after"}, headers={"X-Raftq-Forward": "1"}).status == 201
