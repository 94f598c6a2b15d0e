"""Stored bodies live in the log entries that carried them (issue 25), through
compaction, a follower rebuilt from the leader's snapshot, and kill -9 of
every node; so do staged bodies, in their stage's entry until the commit.

The cluster writes more than its compaction threshold (32 MiB of journal,
jittered up to 1.5x per node), so every node snapshots and drops the
entries from its journal: from then on each body is read back from the live
entries its snapshot carries.
"""

import shutil
from pathlib import Path

import pytest

from raftq.client import Client
from tests.test_operations import caught_up
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

BODY_BYTES = 64 * 1024
MESSAGES = 1_000            # 64 MiB: above every node's compaction threshold
BATCH = 10


def body(n: int) -> str:
    return f"{n:06d}" + "abcdefghijklmnopqrstuvwxyz"[n % 26] * (BODY_BYTES - 6)


def snapshot_path(cluster, node_id: str) -> Path:
    return cluster.root / node_id / "raft" / "snapshot.bin"


def served(cluster, node_id: str, queue: str = "q") -> list:
    """(seq, body) of every message node_id's own replica holds."""
    with Client([cluster.url(node_id)], token=cluster.token, cafile=cluster.cafile) as client:
        held = []
        while True:
            page = client.browse(queue, from_seq=held[-1][0] + 1 if held else 0, limit=100,
                                 consistency="any")["messages"]
            if not page:
                return held
            held += [(m["seq"], m["body"]) for m in page]


def test_bodies_read_back_after_compaction_snapshot_install_and_kill_of_every_node(fresh_cluster):
    cluster = fresh_cluster(3)
    staged = [(seq, body(10_000 + seq)) for seq in range(1, BATCH + 1)]
    with cluster.client() as client:
        # staged first: its entry lies in the compacted log, live until the commit at the end
        client.stage("sink", "t0", 0, "staged", [{"body": b} for _, b in staged])
        for first in range(0, MESSAGES, BATCH):
            client.put_batch("q", [{"body": body(n)} for n in range(first, first + BATCH)])
        received = client.receive("q", max=100, lease_ms=600_000)["messages"]
        client.ack("q", [m["receipt"] for m in received[:50]])
    assert [m["body"] for m in received] == [body(n) for n in range(100)]
    wait_until(lambda: all(snapshot_path(cluster, n).exists() for n in cluster.ids), 180,
               what="every node to compact its log")
    expected = [(seq, body(seq - 1)) for seq in range(51, MESSAGES + 1)]
    for node_id in cluster.ids:
        wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to apply everything")
        assert served(cluster, node_id) == expected, node_id

    # a follower that lost its disk is sent the leader's snapshot: its entries are compacted away
    lost = next(n for n in cluster.ids if n != cluster.wait_for_leader(30))
    spec = cluster.cfg.node(lost)
    cluster.kill(lost)
    shutil.rmtree(cluster.root / lost)
    with cluster.client() as client:
        client.remove_node(lost)
        client.add_node(lost, spec.raft, spec.http)
    cluster.start(lost)
    wait_until(lambda: caught_up(cluster, lost), 180, what=f"{lost} to catch up from nothing")
    assert served(cluster, lost) == expected
    with cluster.client() as client:
        assert client.verify()["agree"]

    # kill -9 of every node: each restarts from its snapshot and its journal
    for node_id in cluster.ids:
        cluster.kill(node_id)
    cluster.start()
    assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
    for node_id in cluster.ids:
        wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to apply everything")
        assert served(cluster, node_id) == expected, node_id
    with cluster.client() as client:
        assert client.verify()["agree"]
        assert [m["body"] for m in client.receive("q", max=100)["messages"]] == [b for _, b in expected[50:150]]
        assert client.commit_stages("sink", 0, [{"token": "t0", "chunks": 1}], queue="staged")["put"] == BATCH
    for node_id in cluster.ids:
        wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to apply the commit")
        assert served(cluster, node_id, "staged") == staged, node_id
    with cluster.client() as client:
        assert client.verify()["agree"]
