"""Repair from peers (issue 47, the read side): a damaged record found by the scrubber, the
snapshot writer or a leader sending entries is fetched from a replica whose copy verifies and
written back in place; it is never carried on with a fresh checksum.

Real pysyncobj nodes in this process, each on an asyncio loop of its own
(``tests.test_consensus``); the damage is a byte flipped in place in a node's
files while it runs, as a rotting disk returns it.
"""

import shutil
from pathlib import Path

import pytest

from raftq.engine.scrubber import Scrubber
from raftq.engine.storage import snapshot_file
from raftq.engine.storage.damage import DamagedRecord
from tests.test_consensus import Keeper, cluster, commit, snapshot_header  # noqa: F401 -- the fixture
from tests.waiting import wait_until

NEVER = 10 ** 6


def flip(path: Path, text: bytes) -> None:
    """The second byte of the last `text` in `path` (in a snapshot, the carried entries follow the
    state), flipped in place: the same length."""
    data = path.read_bytes()
    at = data.rindex(text) + 1
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(bytes([data[at] ^ 0x01]))


def journal_file_holding(c, node_id: str, text: bytes) -> Path:
    return next(p for p in sorted((c.root / node_id / "journal").glob("seg-*.log")) if text in p.read_bytes())


def kept_and_compacted(c) -> dict:
    """Entries b"keep <n>" every tenth, compacted on every node (the journal keeps them); the
    bodies each node must read back."""
    for i in range(60):
        commit(c, b"keep %d" % i if i % 10 == 0 else b"filler %d " % i + b"x" * 100)
    commit(c, b"drop keep 0")
    c.converged()
    for node in c.nodes.values():
        assert node.force_snapshot()
        wait_until(lambda: node.status()["log_entries"] <= 3, what="compaction")
    return {b"keep %d" % i: b"keep %d" % i for i in range(10, 60, 10)}


def test_a_damaged_kept_entry_is_found_by_the_scrubber_and_repaired_without_a_hand_over(cluster):
    c = cluster(machine_class=Keeper, segment_bytes=2048, compaction_min_entries=NEVER,
                compaction_min_seconds=NEVER).start_all()
    expected = kept_and_compacted(c)
    leader = c.leader()
    leader_id, term = leader.status()["self_id"], leader.status()["term"]
    segment = journal_file_holding(c, leader_id, b"keep 20")
    flip(segment, b"keep 20")
    assert b"keep 20" not in segment.read_bytes()

    scrubber = leader.call(lambda: Scrubber(leader.node, pass_hours=0.5 / 3600))
    leader.call(scrubber.start)
    try:
        wait_until(lambda: leader.damage_counts() == (1, 1), 30, "the scrubber to find and repair the damage")
        assert scrubber.passes >= 1 or scrubber.checked_bytes > 0
    finally:
        leader.call(scrubber.stop)
    assert b"keep 20" in segment.read_bytes()
    assert c.machines[leader_id].read_back() == expected
    # found in the background, not in what it serves: it keeps leading
    assert leader.status()["role"] == "leader" and leader.status()["term"] == term


def test_a_damaged_carried_entry_is_refused_by_the_snapshot_writer_repaired_and_carried_intact(cluster):
    c = cluster(machine_class=Keeper, segment_bytes=2048, compaction_min_entries=NEVER,
                compaction_min_seconds=NEVER).start_all()
    expected = kept_and_compacted(c)
    # a follower that lost its disk is sent the leader's snapshot with every live entry carried
    leader_id = c.leader().status()["self_id"]
    lost = next(i for i in c.nodes if i != leader_id)
    c.stop(lost)
    shutil.rmtree(c.root / lost)
    commit(c, b"filler after")
    assert c.nodes[leader_id].force_snapshot()
    c.start(lost)
    c.converged()
    node = c.nodes[lost]
    assert snapshot_header(node)["entries"] == sorted(c.machines[lost].kept.values())
    path = c.root / lost / "snapshot.bin"
    flip(path, b"keep 20")

    # its next snapshot's writer reads the carried entry back, finds it damaged and writes nothing
    assert not node.force_snapshot()
    wait_until(lambda: node.damage_counts() == (1, 1), 30, "the carried entry repaired from a replica")
    assert b"kdep 20" not in path.read_bytes()        # written back in place
    wait_until(node.force_snapshot, 30, "a snapshot once the repair is in")
    snapshot_file.check(path)
    assert b"kdep 20" not in path.read_bytes()
    assert c.machines[lost].read_back() == expected

    # damaged while it is down: it starts (the state is intact), and the entry is repaired once read
    c.stop(lost)
    flip(path, b"keep 30")
    c.start(lost)
    c.converged()
    with pytest.raises(DamagedRecord):
        c.machines[lost].read_back()
    wait_until(lambda: c.nodes[lost].damage_counts() == (1, 1), 30, "the carried entry repaired")
    assert c.machines[lost].read_back() == expected
    assert b"kdep 30" not in path.read_bytes()


def test_a_leader_sends_a_lagging_follower_what_precedes_a_damaged_entry_repairs_it_and_hands_over(cluster):
    """Entries past the leader's cache of recent commands are read back from its journal to be
    sent; one of them damaged must neither stop the heartbeats nor be sent."""
    entries = 6                 # of 1 MB: more than the journal's RECENT_BYTES
    c = cluster(compaction_min_entries=NEVER, compaction_min_seconds=NEVER, compaction_min_bytes=1 << 30,
                max_entry_bytes=2 << 20).start_all()
    leader = c.leader()
    leader_id = leader.status()["self_id"]
    lagging = next(i for i in c.nodes if i != leader_id)
    c.stop(lagging)
    big = [b"%02d" % i + bytes([65 + i]) * 1_000_000 for i in range(entries)]
    for entry in big:
        commit(c, entry)
    flip(journal_file_holding(c, leader_id, big[1][:40]), big[1][:40])
    c.start(lagging)
    c.converged(timeout=60)
    assert c.machines[lagging].entries[-entries:] == big
    assert leader.damage_counts() == (1, 1)
    wait_until(lambda: c.leader().status()["self_id"] != leader_id, 30, "the lead handed over")


def test_a_snapshot_whose_state_is_damaged_is_not_shipped_and_one_written_from_memory_is(cluster):
    """The state has no copy to fetch (each replica's snapshot is taken at its own point), but the
    leader's state is intact in memory: a shipment that finds its file's state damaged stops, and
    a new snapshot replaces the file (before, the damaged one was sent at every append and the
    follower refused it every time)."""
    c = cluster(compaction_min_entries=NEVER, compaction_min_seconds=NEVER).start_all()
    leader = c.leader()
    leader_id = leader.status()["self_id"]
    for i in range(20):
        commit(c, b"state-entry-%d" % i)
    lost = next(i for i in c.nodes if i != leader_id)
    c.stop(lost)
    shutil.rmtree(c.root / lost)
    commit(c, b"after")
    assert leader.force_snapshot()
    path = c.root / leader_id / "snapshot.bin"
    flip(path, b"state-entry-5")
    c.start(lost)
    c.converged(timeout=60)
    assert c.machines[lost].entries == c.machines[leader_id].entries
    assert leader.damage_counts() == (1, 1)
    snapshot_file.check(path)


def test_a_pickled_record_is_repaired_from_replicas_that_carry_its_entry_and_propose_plain_ones(cluster):
    """engine.raft.node, item 19: a replica that holds only the entry (carried by its snapshot)
    gives its copy in the form it proposes in now; the damaged record was logged in the other,
    and is written back in that form, filling its place exactly."""
    c = cluster(machine_class=Keeper, segment_bytes=2048, compaction_min_entries=NEVER,
                compaction_min_seconds=NEVER).start_all()
    expected = kept_and_compacted(c)                 # logged as pickled calls
    leader_id = c.leader().status()["self_id"]
    for lost in [i for i in c.nodes if i != leader_id]:     # the followers keep only snapshots' copies
        c.stop(lost)
        shutil.rmtree(c.root / lost)
        commit(c, b"filler after %s" % lost.encode())
        assert c.nodes[leader_id].force_snapshot()
        c.start(lost)
        c.converged()
        assert b"keep 20" not in b"".join(p.read_bytes() for p in (c.root / lost / "journal").glob("seg-*.log"))
    for node in c.nodes.values():
        node.allow_plain_entries(True)
    leader = c.nodes[leader_id]
    segment = journal_file_holding(c, leader_id, b"keep 20")
    flip(segment, b"keep 20")

    scrubber = leader.call(lambda: Scrubber(leader.node, pass_hours=0.5 / 3600))
    leader.call(scrubber.start)
    try:
        wait_until(lambda: leader.damage_counts() == (1, 1), 30, "the scrubber to find and repair the damage")
    finally:
        leader.call(scrubber.stop)
    assert b"keep 20" in segment.read_bytes()
    assert c.machines[leader_id].read_back() == expected
