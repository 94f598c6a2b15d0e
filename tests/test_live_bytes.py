"""Disk use follows live bytes (issue 47): live bodies are copied forward out of mostly-dead log
entries (engine/relocation.py), so compaction stops keeping whole entries for one message each.

Each of ROUNDS log entries carries a small message that stays unacknowledged and a large one
that is acknowledged: without relocation every node's journal would keep all of them, whole,
as long as the small ones stay (ROUNDS x BIG_BYTES, 50 MiB). Puts that store nothing
(duplicates of an id already seen) then grow every node's log past its compaction threshold
(32 MiB, jittered up to 1.5x per node) a few times over, until each node keeps no more than
twice the live bytes and the 8 MiB below which no relocation is planned.
"""

import re

import pytest

from raftq.client import Client
from raftq.engine.relocation import SLACK_BYTES
from tests.test_operations import caught_up
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ROUNDS = 200
BIG_BYTES = 256 * 1024           # 50 MiB of entries, each kept for one small message without relocation
CHURN_PUTS = 32                  # 8 MiB of log between two looks at every node
CHURN_LIMIT = 40                 # 320 MiB: past every node's third compaction, however jittered
# What a node's journal may keep for the small messages: their bodies twice over, and the slack
# below which no relocation is planned (engine/relocation.py)
KEPT_SLACK_BYTES = SLACK_BYTES


def small(n: int) -> str:
    return f"slow-{n:04d}-" + "s" * 90


def metric(cluster, node_id: str, name: str) -> float:
    with Client([cluster.url(node_id)], token=cluster.token, cafile=cluster.cafile) as client:
        found = re.search(rf"^{name} (\S+)$", client.metrics(), re.MULTILINE)
    return float(found.group(1))


def test_one_live_message_per_entry_keeps_its_bytes_not_its_entries_through_compaction(fresh_cluster):
    cluster = fresh_cluster(3)
    live_bytes = sum(len(small(n)) for n in range(ROUNDS))
    with cluster.client() as client:
        for n in range(ROUNDS):
            client.put_batch("slow", [{"body": small(n)}, {"body": "b" * BIG_BYTES}])
            taken = client.receive("slow", max=2, lease_ms=3_600_000)["messages"]
            assert [m["body"][:10] for m in taken] == [small(n)[:10], "b" * 10]
            client.ack("slow", [taken[1]["receipt"]])
        client.put("churn", "", id="again")
        [first] = client.receive("churn")["messages"]
        client.ack("churn", [first["receipt"]])

        def kept_everywhere() -> dict:
            return {node_id: metric(cluster, node_id, "raftq_journal_kept_bytes") for node_id in cluster.ids}
        for _ in range(CHURN_LIMIT):
            for _ in range(CHURN_PUTS):     # each stores nothing: its entry is dead at once
                assert client.put("churn", "c" * BIG_BYTES, id="again")["messages"][0]["duplicate"]
            kept = kept_everywhere()
            if all(0 < held <= 2 * live_bytes + KEPT_SLACK_BYTES for held in kept.values()):
                break
        assert all(held <= 2 * live_bytes + KEPT_SLACK_BYTES for held in kept.values()), \
            f"journals keep {kept} bytes for {live_bytes} live bytes"
        # (what the slack lets a journal keep needs no moving)
        relocated = sum(metric(cluster, node_id, "raftq_relocated_bodies_total") for node_id in cluster.ids)
        assert relocated >= ROUNDS - KEPT_SLACK_BYTES // BIG_BYTES

        assert client.verify()["agree"]
    # every small message reads back intact from every replica, and again after kill -9 of every
    # node, from each one's snapshot and journal
    assert_served(cluster)
    for node_id in cluster.ids:
        cluster.kill(node_id)
    cluster.start()
    assert cluster.wait_for_leader(60) is not None and cluster.wait_all_ready(60)
    assert_served(cluster)


def assert_served(cluster) -> None:
    for node_id in cluster.ids:
        wait_until(lambda: caught_up(cluster, node_id), 60, what=f"{node_id} to apply everything")
        with Client([cluster.url(node_id)], token=cluster.token, cafile=cluster.cafile) as replica:
            page = replica.browse("slow", limit=ROUNDS + 1, consistency="any")["messages"]
        assert [m["body"] for m in page] == [small(n) for n in range(ROUNDS)], node_id
