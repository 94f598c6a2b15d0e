"""engine.raft on a disk that fills up or was damaged: real pysyncobj nodes in this process
(tests/test_consensus.py's harness), faults armed through the write seam (chaos/disk_faults.py)."""

import logging
import time
from pathlib import Path

import cbor2
import pytest

from chaos import disk_faults
from chaos.checker import GIVE_UP
from raftq.engine.storage import records, snapshot_file
from raftq.engine.storage.journal import ENTRY_PREFIX, SYNC_MARK
from tests.test_consensus import cluster, commit, follower_facing_a_fake_leader, propose_wait  # noqa: F401
from tests.waiting import wait_until


@pytest.fixture
def faults(tmp_path):
    control = tmp_path / "disk-faults.json"
    disk_faults.install(control)
    try:
        yield control
    finally:
        disk_faults.uninstall()


def node_id(node) -> str:
    return node.status()["self_id"]


def test_a_leader_with_no_room_refuses_the_entry_as_insufficient_storage_and_counts_it_nowhere(cluster, faults):
    """pysyncobj's tick raised out of the journal's failed append with the proposal's callback
    lost (and group commit's in-flight slot with it); nothing may count the entry either."""
    c = cluster().start_all()
    commit(c, b"before")
    c.converged()
    leader = c.leader()
    before = leader.status()
    disk_faults.arm(faults, {"kind": "no_room", "path": f"/{node_id(leader)}/journal/seg-"})
    for n in range(3):
        assert propose_wait(leader, b"no room %d" % n) == [(None, "insufficient_storage")]
    after = leader.status()
    assert after["last_log_index"] == before["last_log_index"] and after["role"] == "leader"
    disk_faults.disarm(faults)
    commit(c, b"after")
    c.converged()
    assert all(m.entries == [b"before", b"after"] for m in c.machines.values())


def test_a_follower_with_no_room_acknowledges_nothing_it_did_not_write_and_catches_up_later(cluster, faults):
    c = cluster().start_all()
    leader = c.leader()
    full = next(i for i in c.nodes if i != node_id(leader))
    disk_faults.arm(faults, {"kind": "no_room", "path": f"/{full}/journal/seg-"})
    for n in range(10):
        commit(c, b"entry %d" % n)               # the leader and the other follower are a majority
    assert c.nodes[full].status()["last_log_index"] < leader.status()["last_log_index"]
    assert leader.status()["peers"][full]["match_index"] == c.nodes[full].status()["last_log_index"]
    disk_faults.disarm(faults)
    c.converged()
    assert c.machines[full].entries == [b"entry %d" % n for n in range(10)]


def damage_entry(journal_dir: Path, index: int) -> None:
    """Flip a byte inside the command of the entry at log `index`, where the journal keeps it."""
    for segment in sorted(journal_dir.glob("seg-*.log")):
        data = bytearray(segment.read_bytes())
        for start, end, payload in records.iter_records(data):
            found, _ = ENTRY_PREFIX.unpack_from(payload)
            if found == index and found != SYNC_MARK:
                data[end - 1] ^= 0x10
                segment.write_bytes(bytes(data))
                return
    raise AssertionError(f"entry {index} is in no segment of {journal_dir}")


def leaders(c, ids) -> list[str]:
    return [i for i in ids if c.nodes[i].status()["role"] == "leader"]


def test_a_voter_that_gave_up_damaged_entries_never_elects_a_leader_without_them(cluster):
    """Entries 6.. were committed by the leader and one follower, then the follower's copy of
    one was damaged. Cut there, its log is longer than the third node's, which missed them:
    voting as before, it would lead -- or elect the third -- without entries a majority
    acknowledged. It waits for a leader that has them, and takes them again from it."""
    c = cluster().start_all()
    for n in range(5):
        commit(c, b"early %d" % n)
    c.converged()
    first = node_id(c.leader())
    keeper, behind = [i for i in c.nodes if i != first]
    c.stop(behind)
    for n in range(25):
        commit(c, b"late %d" % n)
    expected = list(c.machines[first].entries)
    c.stop(first)
    c.stop(keeper)
    damage_entry(c.root / keeper / "journal", 12)
    c.start(keeper)
    c.start(behind)
    assert c.nodes[keeper].status()["role"] == "follower"
    time.sleep(5 * 1.2)                            # elections enough for either to have won one
    assert leaders(c, [keeper, behind]) == []
    c.start(first)
    wait_until(lambda: leaders(c, list(c.nodes)) == [first], 30, "the node that holds every entry to lead")
    c.converged()
    commit(c, b"after")
    c.converged()
    assert all(m.entries == expected + [b"after"] for m in c.machines.values())
    # caught up, it votes again: without the first node, the other two elect a leader
    c.stop(first)
    wait_until(lambda: len(leaders(c, [keeper, behind])) == 1, 30, "a leader of the two others")


def test_a_follower_with_no_room_for_a_snapshot_it_loaded_stops_rather_than_apply_on_unlike_its_log(tmp_path, faults):
    """pysyncobj restores a leader's snapshot into the state, then puts its entries in the log,
    and swallows the error when there is no room for them: the state would be the snapshot's
    and the log and applied index the old ones, and the entries applied next would make a
    replica unlike the others. The engine stops instead, to start again from its disk."""
    fatal = []
    records.on_fatal(fatal.append)
    try:
        with follower_facing_a_fake_leader(tmp_path / "f") as (follower, machine, leader, entry):
            assert leader.append(1, (1, 0), [entry(i, 1) for i in range(2, 11)], commit=10)["success"]
            wait_until(lambda: len(machine.entries) == 9, what="entries 2-10 applied")
            path = tmp_path / "sent.bin"
            snapshot_file.write(path, last=entry(20, 1), prev=entry(19, 1),
                                cluster=[[follower.self_peer.raft_addr, "f"], [leader.addr, "ld"]],
                                state=cbor2.dumps([b"from the leader's snapshot"]))
            disk_faults.arm(faults, {"kind": "no_room", "path": str(tmp_path / "f" / "journal" / "seg-")})
            leader.send({"type": "append_entries", "term": 1, "commit_index": 20,
                         "serialized": (path.read_bytes(), True, True)})
            wait_until(lambda: fatal, 30, "the follower to stop")
            assert "snapshot up to index 20" in fatal[0]
    finally:
        records.on_fatal(None)


def test_a_failed_snapshot_is_tried_again_seconds_later_not_at_every_tick(cluster, caplog):
    """pysyncobj takes a snapshot again at the next tick after one failed: on a full disk, a
    fork and a failed write every few milliseconds."""
    c = cluster(compaction_min_entries=5).start_all()
    for machine in c.machines.values():
        machine.snapshot_fails = True              # the child raises, as on a full disk
    with caplog.at_level(logging.ERROR, logger="raftq.engine.raft.snapshots"):
        for n in range(20):
            commit(c, b"entry %d" % n)
        time.sleep(3)
    failed = [r for r in caplog.records if "the snapshot writer" in r.getMessage()]
    assert 1 <= len(failed) <= 2 * len(c.nodes)
    for machine in c.machines.values():
        machine.snapshot_fails = False
    leader = c.leader()
    assert leader.force_snapshot()                 # asked for, one is taken at once


def damage_the_snapshot(path: Path) -> None:
    """A bit flipped inside an entry's bytes: the file keeps its shape, its checksums fail."""
    data = bytearray(path.read_bytes())
    data[data.rindex(b"a5") + 1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_node_whose_own_snapshot_is_damaged_takes_the_leaders_and_votes_only_once_it_regained(cluster, caplog):
    """pysyncobj logged the failed load and went on with an empty state and the log that followed
    the lost one: the node applied nothing more, yet acknowledged appends, voted and could lead
    (found by the chaos campaign's bit rot of a stopped node). It gives the log up instead."""
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6).start_all()
    for i in range(20):
        commit(c, b"a%d" % i)
    c.converged()
    for node in c.nodes.values():          # the leader's log no longer starts at 1: it must send its snapshot
        assert node.force_snapshot()
    for i in range(10):
        commit(c, b"b%d" % i)
    c.converged()
    follower = next(i for i, n in c.nodes.items() if n is not c.leader())
    held = c.nodes[follower].status()["last_log_index"]
    c.stop(follower)
    path = c.root / follower / "snapshot.bin"
    damage_the_snapshot(path)
    with caplog.at_level(logging.WARNING):
        c.start(follower)
        for i in range(5):
            commit(c, b"c%d" % i)
        c.converged()
    assert len(c.machines[follower].entries) == 35 and c.machines[follower].entries[:1] == [b"a0"]
    assert (c.root / follower / "snapshot.bin.damaged").exists()
    said = [r.getMessage() for r in caplog.records]
    # said as damage in the log is, which the chaos checker reads (a log that shrank, allowed)
    given_up = next(i for i, line in enumerate(said) if GIVE_UP.search(line))
    assert GIVE_UP.search(said[given_up]).groups() == ("1", str(held))
    assert any(f"the log holds index {held} again" in line for line in said[given_up + 1:])   # it votes again


def test_the_only_replica_with_a_damaged_snapshot_stops_rather_than_serve_an_empty_state(cluster):
    fatal = []
    records.on_fatal(fatal.append)
    try:
        c = cluster(n=1, compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6).start_all()
        for i in range(10):
            commit(c, b"a%d" % i)
        assert c.nodes["n1"].force_snapshot()
        c.stop("n1")
        damage_the_snapshot(c.root / "n1" / "snapshot.bin")
        c.start("n1")
        wait_until(lambda: fatal, 30, "the node to stop")
        assert "no other replica" in fatal[0]
        c.nodes.pop("n1")._stop_loop()        # as the engine's exit would: nothing of it runs on
    finally:
        records.on_fatal(None)
