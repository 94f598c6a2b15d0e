"""The operator's procedures of docs/operations.md, followed as written: backup and
restore, a node that lost its data rejoining, installing for deploy/'s systemd unit,
a rolling upgrade (issue 27, item 8)."""

import shutil
import tarfile

import pytest

from raftq.client import Client
from raftq.local import LocalCluster
from tests.waiting import wait_until
from tests.wire import register

pytestmark = pytest.mark.integration

QUEUES = ("orders", "events", "audit")


def load(cluster) -> None:
    """Messages in several queues, some of them leased, some acked, some keyed."""
    with cluster.client() as client:
        for name in QUEUES:
            for batch in range(3):
                client.put_batch(name, [{"body": {"queue": name, "n": batch * 100 + i}} for i in range(100)])
            client.put(name, {"latest": True}, key="k")
            leased = client.receive(name, max=20, lease_ms=600_000)["messages"]
            client.ack(name, [m["receipt"] for m in leased[:10]])


def contents(cluster) -> dict:
    """Every stored message of every queue, and the queues' counters."""
    seen = {}
    with cluster.client() as client:
        for name in sorted(q["name"] for q in client.queues()["queues"]):
            stats = client.queue(name)["stats"]
            browsed = client.browse(name, limit=10_000)["messages"]
            seen[name] = {"messages": [(m["seq"], m["body"], m["key"]) for m in browsed],
                          "counters": {k: stats[k] for k in ("depth", "in_flight", "put_total", "acked_total")}}
    return seen


def caught_up(cluster, node_id: str) -> bool:
    leader = cluster.wait_for_leader(30)
    mine, theirs = cluster.ready_view(node_id), cluster.ready_view(leader)
    return bool(mine and theirs and mine["applied_index"] >= theirs["commit_index"])


def test_a_backup_of_a_loaded_cluster_restores_as_a_new_cluster_elsewhere(fresh_cluster, tmp_path):
    cluster = fresh_cluster(3)
    load(cluster)
    before = contents(cluster)
    assert sum(len(q["messages"]) for q in before.values()) == 3 * (301 - 10)
    # the documented backup: a follower with no lag, stopped, its raft/ archived, started again
    follower = next(n for n in cluster.ids if n != cluster.wait_for_leader(30))
    wait_until(lambda: caught_up(cluster, follower), 60, what=f"{follower} to have applied everything")
    cluster.stop(follower)
    archive = tmp_path / f"raftq-{follower}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(cluster.root / follower / "raft", arcname=f"{follower}/raft")
    cluster.start(follower)

    # the documented restore: a new cluster (new addresses, secret and tokens), the same node ids,
    # the archive unpacked into every node's data directory
    copy = LocalCluster.create(tmp_path / "elsewhere", 3)
    register(copy)
    try:
        for node_id in copy.ids:
            data_dir = copy.root / node_id
            data_dir.mkdir(mode=0o700)
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if "/" in m.name]
                for member in members:
                    member.name = member.name.split("/", 1)[1]
                tar.extractall(data_dir, members=members, filter="data")
        copy.start()
        assert copy.wait_for_leader(60) is not None and copy.wait_all_ready(60)
        assert contents(copy) == before
        with copy.client() as client:
            assert client.verify()["agree"]
            client.put("orders", {"after": "restore"})      # and it takes writes as a cluster of its own
        assert contents(cluster) == before                    # the original never saw that put
    finally:
        copy.close()


def test_a_node_that_lost_its_data_rejoins_and_holds_every_message(fresh_cluster):
    cluster = fresh_cluster(3)
    load(cluster)
    before = contents(cluster)
    lost = next(n for n in cluster.ids if n != cluster.wait_for_leader(30))
    spec = cluster.cfg.node(lost)
    cluster.kill(lost)
    shutil.rmtree(cluster.root / lost)          # the disk is gone
    with cluster.client() as client:
        client.remove_node(lost)
        client.add_node(lost, spec.raft, spec.http)
    cluster.start(lost)
    wait_until(lambda: caught_up(cluster, lost), 120, what=f"{lost} to catch up from nothing")
    with cluster.client() as client:
        assert client.verify()["agree"]
    # the rebuilt node's own replica holds every message (consistency=any: no leader involved)
    with Client(cluster.url(lost), token=cluster.token) as own:
        for name, queue in before.items():
            browsed = own.browse(name, limit=10_000, consistency="any")["messages"]
            assert [(m["seq"], m["body"], m["key"]) for m in browsed] == queue["messages"]
    assert contents(cluster) == before
