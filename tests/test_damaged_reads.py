"""Issue 47, the read side: a record damaged on a minority of replicas is served intact, repaired
from a replica whose copy verifies, and stops nothing (docs/guarantees.md, "Storage faults").

Real node processes; the damage is what a failing disk returns: a letter flipped in place inside
a stored body, the file the same length and the text still valid.
"""

import os
import time
from pathlib import Path

import pytest

from raftq.client import Client
from tests.test_api import metric
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

ELECTION_TIMEOUT_S = 0.6
LATER_BYTES = 2048          # 3 000 of them: past every node's cache of recent entries (RECENT_BYTES)


def first_bodies() -> list[str]:
    return [f"body {n:03d} lorem ipsum dolor sit amet" for n in range(40)]


def segments(cluster, node_id: str) -> list[Path]:
    return sorted((cluster.root / node_id / "raft" / "journal").glob("seg-*.log"))


def flip_a_letter(cluster, node_id: str, text: str) -> None:
    """`text` (stored once in `node_id`'s journal) with its "lorem" made "lnrem", in place."""
    needle = text.encode()
    for path in segments(cluster, node_id):
        at = path.read_bytes().find(needle)
        if at < 0:
            continue
        letter = at + needle.index(b"lorem") + 1
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, bytes([os.pread(fd, 1, letter)[0] ^ 0x01]), letter)
            os.fsync(fd)
        finally:
            os.close(fd)
        return
    raise AssertionError(f"{text!r} is in no journal segment of {node_id}")


def journal_holds(cluster, node_id: str, text: str) -> bool:
    return any(text.encode() in path.read_bytes() for path in segments(cluster, node_id))


def test_a_letter_flipped_in_the_leaders_journal_is_served_intact_repaired_and_writes_go_on(fresh_cluster):
    cluster = fresh_cluster(3)
    bodies = first_bodies()
    with cluster.client() as client:
        for body in bodies:
            client.put("first", body)
        for _ in range(30):
            client.put_batch("later", ["x" * LATER_BYTES] * 100)
    leader = cluster.wait_for_leader(30)
    damaged = bodies[::4]
    for body in damaged:
        flip_a_letter(cluster, leader, body)

    # Writes must go on within the election timeout plus a second: a client that gives up
    # after that long sees every call answered.
    with cluster.client(retry_for=ELECTION_TIMEOUT_S + 1.0) as client:
        received = client.receive("first", max=40, lease_ms=600_000)["messages"]
        assert sorted(m["body"] for m in received) == bodies
        for n in range(10):
            client.put("first", f"after {n}")
    assert cluster.wait_for_leader(30) != leader          # it handed the lead to a replica that can read

    # repaired in place, from a replica whose copy verified, and counted
    wait_until(lambda: all(journal_holds(cluster, leader, body) for body in damaged), 30,
               what="the damaged records written back intact")
    url = cluster.url(leader)
    assert metric(url, "raftq_damaged_records_total") == len(damaged)
    wait_until(lambda: metric(url, "raftq_repaired_records_total") == len(damaged), 30,
               what="every repair counted")
    # its own reads: a follower's (consistency=any) may not have applied the last put yet
    with Client([url], token=cluster.token, cafile=cluster.cafile) as client:
        def held_bodies():
            return [m["body"] for m in client.browse("first", limit=100, consistency="any")["messages"]]
        wait_until(lambda: len(held_bodies()) == 50, 30, what="the old leader applying every put")
        assert held_bodies() == bodies + [f"after {n}" for n in range(10)]

    # a follower's own reads (consistency=any) of a body damaged in its journal are served intact too
    follower = next(n for n in cluster.ids if n not in (leader, cluster.wait_for_leader(30)))
    flip_a_letter(cluster, follower, bodies[1])
    with Client([cluster.url(follower)], token=cluster.token, cafile=cluster.cafile) as client:
        held = client.browse("first", limit=100, consistency="any")["messages"]
    assert [m["body"] for m in held][:40] == bodies
    wait_until(lambda: journal_holds(cluster, follower, bodies[1]), 30, what="the follower's record written back")
    assert metric(cluster.url(follower), "raftq_damaged_records_total") == 1
