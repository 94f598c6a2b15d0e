"""engine.raft.consensus: real pysyncobj nodes on 127.0.0.1, in this process or in children.

Every node, proxy, socket and child process a test starts is closed by the
test itself (fixtures and try/finally), whether it passes or fails.
"""

import asyncio
import contextlib
import functools
import inspect
import pickle
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib
from pathlib import Path

import cbor2
import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import CONNECTION_STATE

from raftq.engine.config import Peer
from raftq.engine.raft import node as raft_node
from raftq.engine.raft.consensus import Consensus
from raftq.engine.raft.quiet import QUIET_AFTER_S
from raftq.engine.raft.sealer import Sealer
from raftq.engine.raft.wire import FRAME, Connection
from raftq.engine.storage import snapshot_file
from raftq.engine.storage.journal import RECENT_BYTES, DurableJournal
from raftq.engine.storage.records import DamagedFile
from raftq.local import free_ports as local_free_ports
from tests.tools import require_strace
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
SECRET = "test-cluster-secret"
CALM_ELECTIONS = (0.6, 1.2)


def free_ports(n):
    ports = sorted(local_free_ports(n))
    # pysyncobj orders nodes by their address strings (free_ports picks 5-digit ports)
    assert len({len(str(p)) for p in ports}) == 1
    return ports


class OnItsLoop:
    """A Consensus run as an engine runs it, on an asyncio loop of its own: here
    a thread of the test process, so that the test can wait and stall nodes
    one by one. Every call the test makes on it is carried out on that loop
    (awaited if it is a coroutine); calls from the loop itself (a state
    machine's apply) go straight through. It ticks once ``run`` is called."""

    def __init__(self, make, name):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()
        try:
            self.node = self.call(make)
        except BaseException:
            self._stop_loop()
            raise

    def run(self):
        self.call(self.node.start, self.loop)
        return self

    def call(self, function, *args, **kwargs):
        if threading.current_thread() is self.thread:
            return function(*args, **kwargs)

        async def run():
            result = function(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=180)

    def __getattr__(self, name):
        value = getattr(self.node, name)
        return functools.partial(self.call, value) if callable(value) else value

    def close(self):
        try:
            self.call(self.node.close)
        finally:
            self._stop_loop()

    def _stop_loop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


class Recorder:
    """A deterministic state machine: the list of entries applied."""

    def __init__(self, fail_on=None, failing_restores=0, snapshot_seconds=0.0, apply_seconds=0.0):
        self.entries = []
        self.apply_seconds = apply_seconds
        self.fail_on = fail_on
        self.failing_restores = failing_restores
        self.snapshot_seconds = snapshot_seconds
        self.snapshot_fails = False

    def apply(self, entry):
        if entry == self.fail_on:
            raise RuntimeError("the state machine refuses this entry")
        time.sleep(self.apply_seconds)        # a large entry takes this long to apply
        self.entries.append(entry)
        return len(self.entries)

    def write_snapshot(self, out):
        time.sleep(self.snapshot_seconds)     # a large state takes this long to encode
        if self.snapshot_fails:
            raise RuntimeError("the state machine cannot encode its state")
        cbor2.dump(self.entries, out)

    def restore(self, data):
        if self.failing_restores:
            self.failing_restores -= 1
            raise RuntimeError("restore failed")
        self.entries = cbor2.loads(data)

    def live_entries(self):
        return []


class Keeper(Recorder):
    """A Recorder whose state reads back the log entries that begin with b"keep" (as stored
    bodies are read from the entries that carried them), until an entry b"drop <entry>"."""

    def __init__(self, **knobs):
        super().__init__(**knobs)
        self.kept = {}            # entry -> its log index
        self.node = None

    def apply(self, entry):
        if entry.startswith(b"keep"):
            self.kept[entry] = self.node.applying_index()
        elif entry.startswith(b"drop "):
            self.kept.pop(entry[5:], None)
        return super().apply(entry)

    def write_snapshot(self, out):
        cbor2.dump([self.entries, self.kept], out)

    def restore(self, data):
        self.entries, self.kept = cbor2.loads(data)

    def live_entries(self):
        return sorted(self.kept.values())

    def read_back(self):
        """Each kept entry as this node reads it back from its log index."""
        return {entry: self.node.entry_at(index) for entry, index in self.kept.items()}


class Cluster:
    def __init__(self, root, n=3, **knobs):
        self.root = Path(root)
        self.machine_class = knobs.pop("machine_class", Recorder)
        self.peers = [Peer(f"n{i + 1}", f"127.0.0.1:{p}") for i, p in enumerate(free_ports(n))]
        self.knobs = knobs
        self.nodes = {}
        self.machines = {}

    def start(self, node_id, peers=None, run=True, **knobs):
        """`node_id` on its loop with `peers` as its first voters (default: all others); ticking
        unless `run` is false."""
        me = next(p for p in self.peers if p.id == node_id)
        machine = knobs.pop("machine_class", self.machine_class)(**knobs.pop("machine", {}))
        others = peers if peers is not None else [p for p in self.peers if p.id != node_id]
        # Every node of a Cluster shares this process: a stall of the test
        # process (load, GC) must not depose a leader unless a test wants it.
        settings = {"secret": SECRET, "election_timeout": CALM_ELECTIONS, **self.knobs, **knobs}
        node = OnItsLoop(lambda: Consensus(self_peer=me, peers=others, data_dir=self.root / node_id,
                                           apply=machine.apply, write_snapshot=machine.write_snapshot,
                                           restore=machine.restore, live_entries=machine.live_entries,
                                           **settings), node_id)
        machine.node = node
        if run:
            node.run()
        self.nodes[node_id] = node
        self.machines[node_id] = machine
        return node

    def start_all(self, **knobs):
        for p in self.peers:
            self.start(p.id, **knobs)
        return self

    def stop(self, node_id):
        self.nodes.pop(node_id).close()

    def close(self):
        for node_id in list(self.nodes):
            self.stop(node_id)

    def leader(self, timeout=20.0):
        def find():
            leaders = [n for n in self.nodes.values() if n.status()["role"] == "leader" and n.status()["quorum_ok"]]
            return leaders[0] if len(leaders) == 1 else None
        return wait_until(find, timeout, "a leader")

    def converged(self, ids=None, timeout=20.0):
        ids = ids or list(self.nodes)
        return wait_until(lambda: len({tuple(self.machines[i].entries) for i in ids}) == 1,
                          timeout, f"replicas {ids} to converge")


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(n=3, **knobs):
        c = Cluster(tmp_path / f"c{len(made)}", n, **knobs)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def propose_wait(node, entry, timeout=20.0, term=None):
    """Propose (for the node's current term unless told) and wait; returns the
    list of (result, error) callbacks seen."""
    calls = []
    done = threading.Event()

    def callback(result, error):
        calls.append((result, error))
        done.set()

    node.propose(entry, callback, term=node.term() if term is None else term)
    assert done.wait(timeout), "no callback"
    return calls


def commit(c, entry, timeout=20.0):
    """Commit `entry` through whichever node leads now. An election between
    finding the leader and submitting gets a refusal made before the log
    (`not_leader`, `no_quorum`: certainly not applied), so that is retried."""
    deadline = time.monotonic() + timeout
    while True:
        [(result, error)] = propose_wait(c.leader(), entry, timeout)
        if error not in ("not_leader", "no_quorum") or time.monotonic() > deadline:
            assert error is None, error
            return result


def test_replicates_and_answers_every_submitter_once(cluster):
    c = cluster().start_all()
    leader = c.leader()
    calls = {}
    done = threading.Semaphore(0)
    entries = [b"entry-%d" % i for i in range(200)]

    def callback_for(entry):
        def callback(result, error):
            calls.setdefault(entry, []).append((result, error, threading.current_thread().name))
            done.release()
        return callback

    for entry in entries:
        leader.propose(entry, callback_for(entry), term=leader.term())
    for _ in entries:
        assert done.acquire(timeout=20)
    c.converged()
    machine = c.machines[leader.status()["self_id"]]
    assert sorted(machine.entries) == sorted(entries)
    for entry in entries:
        [(result, error, thread)] = calls[entry]
        assert error is None
        assert machine.entries[result - 1] == entry    # the apply result of that very entry
        assert thread != threading.current_thread().name
    status = leader.status()
    assert status["commit_index"] == status["applied_index"] == status["last_log_index"]
    assert status["fsync_policy"] == "fsync-per-append"
    assert set(status["peers"]) == {p.id for p in c.peers} - {status["self_id"]}
    for peer in status["peers"].values():
        assert peer["connected"] and peer["match_index"] == status["last_log_index"]
    for node in c.nodes.values():
        assert node.leader_id() == status["self_id"]


def test_a_lone_voter_commits_a_write_as_it_syncs_it_not_at_a_later_tick(cluster):
    """A group of one replica hears no acknowledgement: its leader is the
    majority once its own append is synced. Left to pysyncobj's next tick,
    each lone write waited for a heartbeat (95 ms on a node's loop). Here
    nothing else would wake the node for a minute."""
    c = cluster(1)
    node = c.start("n1", peers=[])
    c.leader()
    ticker = node.node._node._ticker
    due = ticker._until_due
    ticker._until_due = lambda: due() and 60.0
    for i in range(3):
        assert propose_wait(node, b"alone-%d" % i) == [(i + 1, None)]
    status = node.status()
    assert status["commit_index"] == status["applied_index"] == status["last_log_index"]


def _quiet_leader_ticks(node):
    """Tick ``node`` again only when something must be applied, or a minute from now: nothing but
    a read wakes it otherwise (the timer pending now runs first)."""
    ticker = node.node._node._ticker
    due = ticker._until_due
    ticker._until_due = lambda: due() and 60.0
    time.sleep(0.12)    # a heartbeat: less than a majority's silence that would refuse proposals


def _caught_up(c, leader):
    status = leader.status()
    return all(peer["match_index"] == status["last_log_index"] for peer in status["peers"].values())


def test_a_lone_put_commits_without_a_tick_of_its_leader(cluster):
    """Item 17: the leader appends, sends and syncs a proposal as it comes, and counts the
    answers, commits and applies as it reads them; the followers write, sync and answer as they
    read. pysyncobj took a proposal off its queue only in a tick, and read the answers in others."""
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"first")
    wait_until(lambda: _caught_up(c, leader), what="the followers to hold everything")
    _quiet_leader_ticks(leader)
    before = leader.status()["leader_ticks"]
    for i in range(20):
        assert propose_wait(leader, b"lone-%d" % i) == [(i + 2, None)]
    assert leader.status()["leader_ticks"] - before <= 1
    c.converged()


def test_a_follower_applies_what_an_append_committed_without_a_tick(cluster):
    """Item 17, a follower's side: each lone put's append carries the commit of the put before
    it, and the follower applies that in the read that answered the append. A tick only for
    the apply cost a follower more than the apply, once per put."""
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"first")
    wait_until(lambda: _caught_up(c, leader), what="the followers to hold everything")
    followers = [node for node in c.nodes.values() if node is not leader]
    for node in followers:
        _quiet_leader_ticks(node)       # a follower's tick now only for what must be applied
    before = {id(node): node.status()["ticks"] for node in followers}
    for i in range(20):
        assert propose_wait(leader, b"lone-%d" % i) == [(i + 2, None)]
    wait_until(lambda: all(node.status()["applied_index"] >= 20 for node in followers),
               what="the followers to apply what the later appends committed")
    for node in followers:
        assert node.status()["ticks"] - before[id(node)] <= 1
    c.converged()


def test_a_follower_that_hears_its_leader_and_every_peer_ticks_at_its_election_deadline(cluster):
    """An idle follower reads its leader's heartbeats without a tick (item 17), and with every
    peer connected it has no connection to retry: its ticks fall at its election deadline,
    which each heartbeat pushes on, not every MAX_POLL_S. One peer gone, it ticks every
    MAX_POLL_S again, to dial it."""
    c = cluster(election_timeout=(2.0, 2.5)).start_all()
    leader = c.leader()
    commit(c, b"first")
    wait_until(lambda: _caught_up(c, leader), what="the followers to hold everything")
    follower, other = [node_id for node_id, node in c.nodes.items() if node is not leader]
    node = c.nodes[follower]
    before = node.status()["ticks"]
    time.sleep(3.0)
    assert node.status()["ticks"] - before <= 3        # MAX_POLL_S apart: 30
    c.stop(other)
    before = node.status()["ticks"]
    time.sleep(1.0)
    assert node.status()["ticks"] - before >= 5


def _appends_sent(node) -> int:
    return sum(node.status()["appends_sent"].values())


def test_an_idle_group_goes_quiet_keeps_its_leader_and_a_put_ends_the_quiet(cluster):
    """Item 18 (engine.raft.quiet): a leader with nothing to replicate heartbeats once a
    QUIET_HEARTBEAT_S, farther apart than its followers' election timeouts (0.6-1.2 s), and
    nobody stands: each heartbeat promised the next. Both sides count each other heard for
    that long. A put ends the quiet at once: the heartbeats come every 0.09 s again."""
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"first")
    wait_until(lambda: leader.status()["quiet"], 10, what="the idle group to go quiet")
    followers = [node for node in c.nodes.values() if node is not leader]
    term, sent = leader.status()["term"], _appends_sent(leader)
    asked = [node.status()["pre_votes"]["asked"] for node in followers]
    for _ in range(20):           # across three heartbeats: the lease holds between them too
        status = leader.status()
        assert status["quorum_ok"] and status["contact_slack_ms"] == 1000 and status["quiet"]
        time.sleep(0.15)
    status = leader.status()
    assert status["role"] == "leader" and status["term"] == term
    assert _appends_sent(leader) - sent <= 2 * (3 + 2)        # 0.09 s apart: 66
    # the followers waited for each promised heartbeat: none stood, nor even asked a pre-vote
    assert [node.status()["pre_votes"]["asked"] for node in followers] == asked
    for node in followers:
        assert node.status()["term"] == term and node.status()["quorum_ok"]
        assert node.status()["contact_slack_ms"] == 1000
    [(_, error)] = propose_wait(leader, b"wakes it")
    assert error is None and not leader.status()["quiet"]
    sent = _appends_sent(leader)
    time.sleep(1.0)
    assert _appends_sent(leader) - sent >= 2 * 5             # quiet on: 2 at most
    assert all(node.status()["contact_slack_ms"] == 0 for node in followers)


def test_a_quiet_leader_that_goes_silent_is_replaced(cluster):
    """A promise is bounded: a quiet leader whose loop stops (its connections stay open, as in a
    partition) is replaced by a follower once the promise and an election timeout have passed."""
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"first")
    wait_until(lambda: leader.status()["quiet"], 10, what="the idle group to go quiet")
    term = leader.status()["term"]
    followers = [node for node in c.nodes.values() if node is not leader]
    leader.loop.call_soon_threadsafe(time.sleep, 6.0)

    def new_leader():
        return next((node for node in followers if node.status()["role"] == "leader"
                     and node.status()["term"] > term), None)
    wait_until(new_leader, 20, what="a follower to take over from the silent quiet leader")


def test_a_leader_goes_quiet_only_while_every_voter_announced_the_quiet_wire(cluster):
    """A node of a release before quiet groups does not know to wait for a promise: while one is a
    voter the leader keeps heartbeating every 0.09 s."""
    c = cluster()
    for peer in c.peers[:2]:
        c.start(peer.id)
    leader = c.leader()
    older = c.start(c.peers[2].id, run=False)
    older.call(lambda: setattr(older.node._node.transport, "versions", (1, 2)))
    older.run()
    commit(c, b"first")
    wait_until(lambda: _caught_up(c, leader), what="every follower to hold everything")
    time.sleep(QUIET_AFTER_S + 1.5)
    assert not leader.status()["quiet"]
    sent = _appends_sent(leader)
    time.sleep(1.0)
    assert _appends_sent(leader) - sent >= 2 * 5


def logged_forms(node) -> dict[bytes, int]:
    """Each entry in `node`'s journal, with the type byte of the command that carries it."""
    def read():
        journal = node.node._journal
        commands = (journal.command(index) for index in range(1, (journal.last_index() or 0) + 1))
        return {node.node._entry_of(command): command[0]
                for command in commands if command is not None and command[:1] in raft_node.ENTRY_BYTES}
    return node.call(read)


def test_a_leader_logs_entries_without_pickle_once_told_every_node_applies_them(cluster):
    """engine.raft.node, item 19: a proposal is logged as pysyncobj's pickled call until the
    engine is told every node applies plain entries (api/features.py's gate), as its own bytes
    after; every replica applies both forms alike, and replays both after a restart."""
    c = cluster().start_all()
    commit(c, b"before")
    assert not c.leader().status()["plain_entries"]
    for node in c.nodes.values():
        node.allow_plain_entries(True)
    assert c.leader().status()["plain_entries"]
    commit(c, b"after")
    c.converged()
    for node_id, node in c.nodes.items():
        assert logged_forms(node) == {b"before": raft_node.REGULAR_COMMAND, b"after": raft_node.PLAIN_ENTRY}, node_id
    restarted = next(node_id for node_id, node in c.nodes.items() if node is not c.leader())
    c.stop(restarted)
    c.start(restarted)
    commit(c, b"last")
    c.converged()
    assert c.machines[restarted].entries == [b"before", b"after", b"last"]


def test_a_follower_behind_is_caught_up_by_the_ticks_and_sent_no_put_before(cluster):
    """A follower that was away is behind: the puts the leader sends as they come are not for
    it (it would refuse each, and its catch-up would start again from the last) but the
    ticks' sends, which catch it up while puts flow."""
    c = cluster().start_all()
    leader = c.leader()
    away = next(node_id for node_id, node in c.nodes.items() if node is not leader)
    commit(c, b"before")
    wait_until(lambda: _caught_up(c, leader), what="the followers to hold everything")
    c.stop(away)
    for i in range(100):
        [(_, error)] = propose_wait(leader, b"while-away-%d" % i)
        assert error is None, error
    c.start(away)
    stop = threading.Event()
    written = []

    def writer():
        while not stop.is_set():
            [(_, error)] = propose_wait(leader, b"flowing-%d" % len(written))
            assert error is None, error
            written.append(1)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_until(lambda: c.nodes[away].status()["applied_index"] >= 102, 30, what="the follower to catch up")
        time.sleep(0.2)
    finally:
        stop.set()
        thread.join(30)
    assert written
    c.converged()
    assert leader.node._node.appends_refused <= 2


def test_only_entries_of_the_leaders_term_commit_by_counting(cluster):
    """Raft commits by counting only entries of the leader's own term (an older one held by a
    majority may still be replaced, Raft's Figure 8); the answers a leader counts as they
    arrive (item 5) commit them with the first entry of its term."""
    c = cluster()
    node = c.start("n1", run=False)

    def check():
        raft = node.node._node
        first, _ = raft._journal.index_and_term(-1)     # the log's start, committed
        for index in (first + 1, first + 2):
            raft._journal.add(raft.command_of(b"old-%d" % index), index, 1)
        raft.set_current_term(2, None)
        raft.raft_state = raft_node.LEADER
        others = raft.other_nodes
        raft.match_indexes = {other: first + 2 for other in others}
        raft._commit_acknowledged()
        held_by_all = raft.commit_index
        raft._journal.add(raft.command_of(b"new"), first + 3, 2)
        raft.match_indexes = {other: first + 3 for other in others}
        raft._commit_acknowledged()
        raft.raft_state = raft_node.FOLLOWER
        return first, held_by_all, raft.commit_index
    first, held_by_all, committed = node.call(check)
    node.run()     # so that it closes at once
    assert held_by_all < first + 1 and committed == first + 3


def test_an_answer_of_an_earlier_term_is_not_counted(cluster):
    """An answer sent in an earlier term of this leader's (a slow link delivers it after a new
    election) tells what the follower held of that term's log: counted, it would commit this
    term's entry at that index on the leader's copy alone. The same answer in the leader's
    term commits it."""
    c = cluster()
    node = c.start("n1", run=False)

    def answer_from_each(raft, term, next_index):
        for other in raft.other_nodes:
            raft.on_message_received(other, {"type": "next_node_idx", "term": term, "next_node_idx": next_index,
                                              "reset": False, "success": True})

    def check():
        raft = node.node._node
        first, _ = raft._journal.index_and_term(-1)
        raft.set_current_term(3, None)
        raft.raft_state = raft_node.LEADER
        raft.match_indexes = {other: 0 for other in raft.other_nodes}
        raft._journal.add(raft.command_of(b"new"), first + 1, 3)
        answer_from_each(raft, 2, first + 2)
        stale = (raft.commit_index, sorted(raft.match_indexes.values()))
        answer_from_each(raft, 3, first + 2)
        current = (raft.commit_index, sorted(raft.match_indexes.values()))
        raft.raft_state = raft_node.FOLLOWER
        return first, stale, current
    first, stale, current = node.call(check)
    node.run()     # so that it closes at once
    assert stale == (first, [0, 0])
    assert current == (first + 1, [first + 1, first + 1])


def test_a_leader_answered_from_a_newer_term_steps_down_to_it(cluster):
    c = cluster()
    node = c.start("n1", run=False)

    def check():
        raft = node.node._node
        raft.set_current_term(3, None)
        raft.raft_state = raft_node.LEADER
        raft.match_indexes = {other: 0 for other in raft.other_nodes}
        other = next(iter(raft.other_nodes))
        raft.on_message_received(other, {"type": "next_node_idx", "term": 4, "next_node_idx": 1,
                                          "reset": False, "success": False})
        return raft.raft_state, raft.raftCurrentTerm, raft.raft_leader
    state, term, leader = node.call(check)
    node.run()     # so that it closes at once
    assert (state, term, leader) == (raft_node.FOLLOWER, 4, None)


def test_a_follower_whose_term_ran_ahead_of_its_group_rejoins_it(cluster):
    """A follower cut off just as it won a pre-vote stands alone in a new term; once it hears
    the group again, the leader's appends are of an older term than its own and the others,
    hearing that leader, refuse its pre-votes. Its refusal of those appends, carrying its term,
    makes the leader step down, and the next election brings it back: it follows, and holds
    what is committed after."""
    c = cluster().start_all()
    commit(c, b"before")
    leader = c.leader()
    follower_id = next(i for i, n in c.nodes.items() if n is not leader)
    follower = c.nodes[follower_id]
    ahead = follower.term() + 5
    follower.call(lambda: follower.node._node.set_current_term(ahead, None))

    def one_leader_followed_by_all():
        statuses = [n.status() for n in c.nodes.values()]
        leaders = {s["leader_id"] for s in statuses}
        return (len(leaders) == 1 and None not in leaders and min(s["term"] for s in statuses) >= ahead
                and len({s["term"] for s in statuses}) == 1)
    wait_until(one_leader_followed_by_all, 20, "every node to follow one leader at the term run ahead or later")
    commit(c, b"after")
    c.converged()
    assert c.machines[follower_id].entries == [b"before", b"after"]


def test_refusals_before_the_log(cluster):
    c = cluster(max_entry_bytes=1000).start_all()
    leader = c.leader()
    follower = next(n for n in c.nodes.values() if n is not leader)
    assert propose_wait(follower, b"x") == [(None, "not_leader")]
    assert propose_wait(leader, b"x" * 1001) == [(None, "too_large")]
    commit(c, b"x" * 1000)
    c.converged()
    assert all(m.entries == [b"x" * 1000] for m in c.machines.values())


def test_an_entry_prepared_for_another_term_never_enters_the_log(cluster):
    c = cluster().start_all()
    leader = c.leader()
    assert propose_wait(leader, b"stale", term=leader.term() - 1) == [(None, "not_leader")]
    commit(c, b"current")
    c.converged()
    assert all(m.entries == [b"current"] for m in c.machines.values())


def test_a_command_proposed_as_the_lead_is_lost_is_not_forwarded_to_the_new_leader(cluster):
    """A command proposed for a term this node has lost the lead of, before it
    has heard so, is never applied: pysyncobj would hand it to the new leader
    (its log time belongs to the old term); the old leader's log takes it in
    the old term, which the new leader's log replaces."""
    c = cluster().start_all()
    old = c.leader()
    old_term = old.term()
    holding, release = threading.Event(), threading.Event()
    calls = []

    def hold_the_loop_then_propose():
        holding.set()
        release.wait(20)
        old.propose(b"proposed-while-deposed", lambda result, error: calls.append(error), term=old_term)

    old.loop.call_soon_threadsafe(old.node._run_on_tick, hold_the_loop_then_propose)   # not waiting for the loop
    try:
        assert holding.wait(5)
        others = [n for n in c.nodes.values() if n is not old]
        wait_until(lambda: any(n.status()["role"] == "leader" and n.term() > old_term for n in others),
                   what="another node to take the lead")
    finally:
        release.set()
    new = c.leader()
    assert new is not old
    commit(c, b"after")
    wait_until(lambda: calls, what="the queued command's answer")
    c.converged()
    assert calls in (["not_leader"], ["leader_changed"], ["no_quorum"])
    assert all(m.entries == [b"after"] for m in c.machines.values())


def test_a_node_with_another_secret_takes_no_part(cluster):
    c = cluster()
    ids = [p.id for p in c.peers]
    for node_id in ids[:2]:
        c.start(node_id)
    c.start(ids[2], secret="not-the-cluster-secret")
    leader = c.leader()
    assert leader.status()["self_id"] in ids[:2]
    commit(c, b"sealed")
    c.converged(ids[:2])
    time.sleep(0.5)
    assert c.machines[ids[2]].entries == []
    assert c.nodes[ids[2]].leader_id() is None


def test_a_leader_cut_off_from_the_majority_refuses_before_another_could_lead(cluster):
    """The leader lease: without a majority heard within the minimum election
    timeout (here 1 s), the leader refuses (`no_quorum`) and is not ready,
    while it still leads (CheckQuorum waits the longest election timeout,
    5 s here): the refusal is the lease's, before any step-down."""
    c = cluster(election_timeout=(1.0, 5.0)).start_all()
    leader = c.leader()
    for node_id in [i for i, n in c.nodes.items() if n is not leader]:
        c.stop(node_id)
    wait_until(lambda: not leader.status()["quorum_ok"], what="the lease to run out")
    assert leader.status()["role"] == "leader"
    assert propose_wait(leader, b"lonely") == [(None, "no_quorum")]
    assert c.machines[leader.status()["self_id"]].entries == []


def test_an_apply_that_raises_becomes_a_result_and_the_log_goes_on(cluster):
    c = cluster().start_all(machine={"fail_on": b"boom"})
    result = commit(c, b"boom")
    assert result["error"] == "internal" and "refuses" in result["detail"]
    commit(c, b"after")
    c.converged()
    assert all(m.entries == [b"after"] for m in c.machines.values())


def test_a_callback_that_raises_does_not_reapply_the_entry(cluster):
    c = cluster().start_all()
    leader = c.leader()
    raised = threading.Event()

    def bad_callback(result, error):
        raised.set()
        raise RuntimeError("caller bug")

    leader.propose(b"once", bad_callback, term=leader.term())
    assert raised.wait(20)
    commit(c, b"twice?")
    c.converged()
    assert all(m.entries == [b"once", b"twice?"] for m in c.machines.values())


# -- the wire ---------------------------------------------------------------------------

def test_the_wire_refuses_backward_timestamps_and_foreign_frames():
    poller = createPoller("auto")
    ours, theirs = socket.socketpair()
    peer = Sealer(SECRET)

    def frame(message, stamp, sealer=peer):
        data = sealer.encrypt_at_time(pickle.dumps(message), stamp)
        return FRAME.pack(len(data)) + data

    def connection():
        ours.setblocking(False)      # as pysyncobj's server hands sockets over
        conn = Connection(poller=poller, socket=ours)
        conn.encryptor = Sealer(SECRET)
        conn.setOnMessageReceivedCallback(received.append)
        return conn

    def pump():
        for _ in range(20):
            poller.poll(0.01)

    try:
        received = []
        conn = connection()
        theirs.sendall(frame("first", 100) + frame("same second", 100))
        pump()
        assert received == ["first", "same second"]
        theirs.sendall(frame("from the past", 99))
        pump()
        assert received == ["first", "same second"] and conn.state == CONNECTION_STATE.DISCONNECTED

        ours, theirs = socket.socketpair()
        received = []
        conn = connection()
        theirs.sendall(frame("forged", 100, sealer=Sealer("not-the-cluster-secret")))
        pump()
        assert received == [] and conn.state == CONNECTION_STATE.DISCONNECTED
    finally:
        ours.close()
        theirs.close()


# -- the follower fix, driven over the wire by a test acting as the leader ------------

class FakeLeader:
    """Speaks the Raft wire format, unencrypted, to one follower: raftq's
    (pysyncobj's messages framed by engine.raft.wire.FRAME), or with
    ``pysyncobj_framing`` plain pysyncobj 0.3.17's (native int length, zlib)."""

    def __init__(self, own_addr, follower_addr, *, pysyncobj_framing=False):
        self.addr = own_addr
        host, port = follower_addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.buf = b""
        self.pysyncobj_framing = pysyncobj_framing
        self.frame = struct.Struct("i") if pysyncobj_framing else FRAME
        self.send(own_addr)          # the connecting side announces its address

    def send(self, message):
        data = pickle.dumps(message, 2)
        if self.pysyncobj_framing:
            data = zlib.compress(data, 3)
        self.sock.sendall(self.frame.pack(len(data)) + data)

    def recv(self):
        size = self.frame.size
        while True:
            if len(self.buf) >= size:
                (n,) = self.frame.unpack_from(self.buf)
                if len(self.buf) >= size + n:
                    data, self.buf = self.buf[size:size + n], self.buf[size + n:]
                    return pickle.loads(zlib.decompress(data) if self.pysyncobj_framing else data)
            chunk = self.sock.recv(65536)
            assert chunk, "follower closed the connection"
            self.buf += chunk

    def append(self, term, prev, entries, commit):
        self.send({"type": "append_entries", "term": term, "commit_index": commit,
                   "prevLogIdx": prev[0], "prevLogTerm": prev[1], "entries": entries})
        while True:
            reply = self.recv()
            if reply.get("type") == "next_node_idx":
                return reply

    def close(self):
        self.sock.close()


def follower_and_leader_addrs():
    follower_port, leader_port = free_ports(2)
    # the greater address dials: the follower must wait for our connection
    return f"127.0.0.1:{follower_port}", f"127.0.0.1:{leader_port}"


@contextlib.contextmanager
def follower_facing_a_fake_leader(data_dir):
    """A follower ("f", applying into a Recorder) and a FakeLeader ("ld") connected to it;
    yields them and an ``entry(index, term, tag=b"")`` maker of log entries it applies."""
    f_addr, l_addr = follower_and_leader_addrs()
    machine = Recorder()
    follower = OnItsLoop(lambda: Consensus(self_peer=Peer("f", f_addr), peers=[Peer("ld", l_addr)],
                                           data_dir=data_dir, apply=machine.apply,
                                           write_snapshot=machine.write_snapshot, restore=machine.restore,
                                           secret=None, election_timeout=(60.0, 90.0)), "f").run()
    leader = None
    try:
        leader = FakeLeader(l_addr, f_addr)
        fid = follower._node.apply_func_id

        def entry(idx, term, tag=b""):
            return (b"\x00" + pickle.dumps((fid, (b"e%d%s" % (idx, tag),)), 5), idx, term)

        yield follower, machine, leader, entry
    finally:
        if leader is not None:
            leader.close()
        follower.close()


def test_a_snapshot_of_entries_the_follower_holds_leaves_its_log_alone(tmp_path):
    """A leader resends its snapshot at every heartbeat until it hears back:
    over a slow link one arrives after the follower has appended (and
    acknowledged) entries beyond it. Loaded, it would erase them; one that
    ends past the follower's log is loaded as before."""
    with follower_facing_a_fake_leader(tmp_path / "f") as (follower, machine, leader, entry):
        def snapshot(last_idx, state):
            path = tmp_path / f"sent-{last_idx}.bin"
            snapshot_file.write(path, last=entry(last_idx, 1), prev=entry(last_idx - 1, 1),
                                cluster=[[follower.self_peer.raft_addr, "f"], [leader.addr, "ld"]],
                                state=cbor2.dumps(state))
            leader.send({"type": "append_entries", "term": 1, "commit_index": last_idx,
                         "serialized": (path.read_bytes(), True, True)})
            while (reply := leader.recv()).get("type") != "next_node_idx":
                pass
            return reply

        assert leader.append(1, (1, 0), [entry(i, 1) for i in range(2, 11)], commit=10)["next_node_idx"] == 11
        wait_until(lambda: len(machine.entries) == 9, what="entries 2-10 applied")
        reply = snapshot(5, [b"stale"])
        assert (reply["next_node_idx"], reply["success"]) == (6, True)
        assert follower.status()["last_log_index"] == 10
        assert machine.entries == [b"e%d" % i for i in range(2, 11)]
        assert not (tmp_path / "f" / "snapshot.bin.incoming").exists()

        reply = snapshot(20, [b"from the leader's snapshot"])
        assert (reply["next_node_idx"], reply["success"]) == (21, True)
        assert follower.status()["last_log_index"] == 20
        assert machine.entries == [b"from the leader's snapshot"]


def test_a_damaged_snapshot_from_the_leader_leaves_the_followers_own_in_place(tmp_path):
    """A snapshot whose first record is intact but whose state is damaged:
    pysyncobj would have replaced the follower's own snapshot with it and
    then failed to load it, leaving a node that cannot restart."""
    with follower_facing_a_fake_leader(tmp_path / "f") as (follower, machine, leader, entry):
        assert leader.append(1, (1, 0), [entry(i, 1) for i in range(2, 11)], commit=10)["success"]
        wait_until(lambda: len(machine.entries) == 9, what="entries 2-10 applied")
        assert follower.force_snapshot()
        own = tmp_path / "f" / "snapshot.bin"
        kept = own.read_bytes()

        path = tmp_path / "sent.bin"
        snapshot_file.write(path, last=entry(20, 1), prev=entry(19, 1),
                            cluster=[[follower.self_peer.raft_addr, "f"], [leader.addr, "ld"]],
                            state=cbor2.dumps([b"from the leader's snapshot"]))
        damaged = bytearray(path.read_bytes())
        damaged[-3] ^= 0x01                          # in the state, the last record
        leader.send({"type": "append_entries", "term": 1, "commit_index": 20,
                     "serialized": (bytes(damaged), True, True)})
        reply = leader.append(1, (10, 1), [], commit=10)     # answered after the snapshot was handled
        assert (reply["next_node_idx"], reply["success"]) == (11, True)
        assert own.read_bytes() == kept
        assert not (tmp_path / "f" / "snapshot.bin.incoming").exists()
        assert machine.entries == [b"e%d" % i for i in range(2, 11)]

        leader.send({"type": "append_entries", "term": 1, "commit_index": 20,
                     "serialized": (path.read_bytes(), True, True)})
        while (reply := leader.recv()).get("type") != "next_node_idx":
            pass
        assert (reply["next_node_idx"], reply["success"]) == (21, True)
        assert machine.entries == [b"from the leader's snapshot"]


def test_follower_truncates_only_on_a_real_conflict(tmp_path):
    with follower_facing_a_fake_leader(tmp_path) as (follower, machine, leader, entry):
        reply = leader.append(1, (1, 0), [entry(i, 1) for i in range(2, 7)], commit=1)
        assert reply == {"type": "next_node_idx", "term": 1, "next_node_idx": 7, "reset": False, "success": True}
        # An older, shorter batch overlapping what the follower holds: nothing
        # is deleted, and the reply names the leader's entries, not index 6.
        reply = leader.append(1, (1, 0), [entry(i, 1) for i in range(2, 4)], commit=1)
        assert (reply["next_node_idx"], reply["success"]) == (4, True)
        assert follower.status()["last_log_index"] == 6
        # A heartbeat that only vouches for index 3 lets the commit index reach
        # 3, not the leader's 6: entries 4..6 were not checked against it.
        reply = leader.append(1, (3, 1), [], commit=6)
        assert (reply["next_node_idx"], reply["success"]) == (4, True)
        assert follower.status()["commit_index"] == 3
        leader.append(1, (6, 1), [], commit=6)
        wait_until(lambda: follower.status()["applied_index"] == 6, what="apply up to 6")
        assert machine.entries == [b"e%d" % i for i in range(2, 7)]
        # A mismatching previous entry is refused, and nothing is touched.
        reply = leader.append(1, (6, 5), [entry(7, 5)], commit=6)
        assert (reply["next_node_idx"], reply["success"], reply["reset"]) == (6, False, True)
        assert follower.status()["last_log_index"] == 6
        # A real conflict (same index, different term) still truncates.
        leader.append(1, (6, 1), [entry(i, 1) for i in range(7, 10)], commit=6)
        assert follower.status()["last_log_index"] == 9
        reply = leader.append(2, (7, 1), [entry(8, 2, b"'")], commit=6)
        assert (reply["next_node_idx"], reply["success"]) == (9, True)
        status = follower.status()
        assert (status["last_log_index"], status["term"]) == (8, 2)
    # and on disk: the conflict's truncation and the new entry survive a reopen
    log = DurableJournal(tmp_path / "journal")
    try:
        assert [(e[1], e[2]) for e in log[:]] == [(1, 0)] + [(i, 1) for i in range(2, 8)] + [(8, 2)]
        assert b"e8'" in log[-1][0]
    finally:
        log._destroy()


def test_an_append_of_an_older_term_changes_nothing_on_the_follower(tmp_path):
    """Raft §5.1: a follower that knows a newer term refuses an append of an
    older one. A deposed leader's append still in flight must neither truncate
    nor extend the log the new term's leader wrote; it is answered with the
    newer term, refused, so that the leader that sent it steps down."""
    with follower_facing_a_fake_leader(tmp_path) as (follower, machine, leader, entry):
        reply = leader.append(2, (1, 0), [entry(i, 2) for i in range(2, 5)], commit=1)
        assert (reply["next_node_idx"], reply["success"]) == (5, True)
        # The old term's leader: its entry 2 conflicts with the follower's.
        refusal = leader.append(1, (1, 0), [entry(2, 1, b"stale")], commit=2)
        assert (refusal["term"], refusal["success"], refusal["reset"]) == (2, False, False)
        reply = leader.append(2, (4, 2), [], commit=4)
        assert (reply["term"], reply["next_node_idx"], reply["success"]) == (2, 5, True)
        status = follower.status()
        assert (status["term"], status["last_log_index"]) == (2, 4)
        wait_until(lambda: follower.status()["applied_index"] == 4, what="apply up to 4")
        assert machine.entries == [b"e2", b"e3", b"e4"]


def test_unpatched_pysyncobj_drops_acknowledged_entries(tmp_path):
    """The same drive against plain pysyncobj 0.3.17 shows the bug the test above guards."""
    f_addr, l_addr = follower_and_leader_addrs()
    conf = SyncObjConf(raftMinTimeout=60.0, raftMaxTimeout=90.0, connectionTimeout=120.0,
                       bindAddress=f_addr)
    plain = SyncObj(f_addr, [l_addr], conf)
    leader = None
    try:
        leader = FakeLeader(l_addr, f_addr, pysyncobj_framing=True)
        noop = b"\x01"
        leader.append(1, (1, 0), [(noop, i, 1) for i in range(2, 7)], commit=1)
        assert plain.getStatus()["log_len"] == 6
        leader.append(1, (1, 0), [(noop, i, 1) for i in range(2, 4)], commit=1)
        assert plain.getStatus()["log_len"] == 3
    finally:
        if leader is not None:
            leader.close()
        plain.destroy_synchronous()


def test_followers_that_lose_their_leaders_connection_elect_without_waiting_for_the_timeout(cluster):
    """A leader whose process ends closes its connections at once. With an
    election timeout of 30-40 s only the lost connection can make the
    followers stand within the 20 s this test waits; the new leader must
    also hold everything the old one committed."""
    c = cluster().start_all()
    leader = c.leader()
    for i in range(5):
        commit(c, b"before-%d" % i)
    for node in c.nodes.values():
        conf = node._node.conf
        conf.raftMinTimeout, conf.raftMaxTimeout = 30.0, 40.0   # from the next heartbeat on
    commit(c, b"the timeout is long now")
    leader_term = leader.status()["term"]
    c.stop(leader.status()["self_id"])
    survivor = c.leader(timeout=20)
    commit(c, b"after")
    c.converged()
    entries = c.machines[survivor.status()["self_id"]].entries
    assert entries[:5] == [b"before-%d" % i for i in range(5)] and entries[-1] == b"after"
    assert survivor.status()["term"] == leader_term + 1


def test_a_vote_request_goes_out_over_a_long_idle_link_between_followers(cluster):
    """Followers send each other nothing between elections. pysyncobj
    dropped a connection it had read nothing from for the connection
    timeout (30 s) when it next sent on it: the first vote request after a
    quiet spell closed the link instead of leaving, the followers split
    their votes and waited out the election timeout. Here connections time
    out after 0.3 s, the followers' link idles for 1 s, and the election
    after the leader stops must still take one term."""
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"the links are up")
    leader_addr = leader.self_peer.raft_addr
    dropped = []        # the followers' links to each other that were closed

    def watched(conn, peer):
        close = conn.disconnect

        def disconnect():
            dropped.append(peer)
            close()
        return disconnect

    for node in c.nodes.values():
        for peer, conn in list(node._node.transport._connections.items()):
            conn.timeout = 0.3
            if node is not leader and peer.id != leader_addr:
                conn.disconnect = watched(conn, peer.id)
    time.sleep(1.0)
    leader_term = leader.status()["term"]
    c.stop(leader.status()["self_id"])
    survivor = c.leader(timeout=20)
    commit(c, b"after")
    # PreVote retries a lost ask over a new link, so the term alone no longer shows a closed one.
    assert (survivor.status()["term"], dropped) == (leader_term + 1, [])


def test_a_backlog_of_slow_applies_costs_no_election(cluster):
    """Thirty entries that take 0.05 s each to apply, committed at once: 1.5 s
    of applying on every node, longer than the election timeout. Applied
    all in one tick, the leader sends no heartbeat meanwhile and each
    follower, waking late, calls an election over heartbeats it has not read."""
    c = cluster().start_all(machine={"apply_seconds": 0.05})
    leader = c.leader()
    term = leader.status()["term"]
    answered = threading.Semaphore(0)
    errors = []

    def callback(result, error):
        errors.append(error)
        answered.release()

    for i in range(30):
        leader.propose(b"slow-%d" % i, callback, term=term)
    for _ in range(30):
        assert answered.acquire(timeout=30)
    c.converged()
    assert errors == [None] * 30
    assert {n.status()["term"] for n in c.nodes.values()} == {term}
    assert leader.status()["role"] == "leader"


def test_a_follower_whose_tick_came_late_reads_its_leaders_heartbeats_before_electing(cluster):
    """A follower's tick stalls past its election timeout after its last poll (a
    slow fsync, a busy machine): the leader's heartbeats wait in its socket.
    Deciding first, it would depose a healthy leader."""
    c = cluster().start_all()
    leader = c.leader()
    term = leader.status()["term"]
    follower = next(n for n in c.nodes.values() if n is not leader)
    raft = follower.node._node
    tick = raft._onTick
    stall = threading.Event()

    def late_tick(time_to_wait):
        tick(time_to_wait)              # its last step is pysyncobj's poll: then it stalls
        if stall.is_set():
            stall.clear()
            time.sleep(2 * CALM_ELECTIONS[1])

    asked = follower.status()["pre_votes"]["asked"]
    raft._onTick = late_tick
    stall.set()
    wait_until(lambda: not stall.is_set(), what="the stalled tick")
    time.sleep(3 * CALM_ELECTIONS[1])
    commit(c, b"after")
    assert {n.status()["term"] for n in c.nodes.values()} == {term}
    assert c.leader() is leader
    # Not even a pre-vote: PreVote's peers would refuse it, but the follower must not ask.
    assert follower.status()["pre_votes"]["asked"] == asked


class SlowToApply(Recorder):
    """A Recorder whose apply of an entry beginning b"slow", once armed, holds its node's
    loop until released (as a large entry's apply does), noting whether the node's log
    already held an entry after it."""

    def __init__(self, **knobs):
        super().__init__(**knobs)
        self.armed = False
        self.release = threading.Event()
        self.stalled = threading.Event()
        self.held_more = None

    def apply(self, entry):
        if self.armed and entry.startswith(b"slow"):
            self.held_more = self.node.status()["last_log_index"] > self.node.applying_index()
            self.stalled.set()
            self.release.wait(30)
        return super().apply(entry)


def test_a_follower_answers_an_append_before_it_applies_what_that_append_committed(cluster):
    """With one follower down, every commit waits for the other's answer. A follower
    learns that an entry is committed from the next append (or a heartbeat) and then
    applies it, which may take long: its answer to that next append must not wait for
    the apply. Judged in the rounds where the next append, not a heartbeat, brought the
    news (the follower's log held the next entry as its apply began)."""
    c = cluster(machine_class=SlowToApply).start_all()
    leader = c.leader()
    follower, down = [node_id for node_id, node in c.nodes.items() if node is not leader]
    c.stop(down)
    machine = c.machines[follower]
    machine.armed = True
    judged = 0
    for round_ in range(8):
        machine.release.clear()
        machine.stalled.clear()
        answered, errors = threading.Event(), []

        def callback(result, error):
            errors.append(error)
            answered.set()
        try:
            commit(c, b"slow-%d" % round_)
            leader.propose(b"next-%d" % round_, callback, term=leader.term())
            assert machine.stalled.wait(20), "the follower never applied the slow entry"
            if machine.held_more:
                judged += 1
                assert answered.wait(20), "the next entry waited for the follower's apply"
        finally:
            machine.release.set()
        assert answered.wait(20) and errors == [None], errors
        if judged >= 2:
            break
    assert judged, "a heartbeat brought every commit: nothing judged"


# -- snapshots -------------------------------------------------------------------------
# -- snapshots -------------------------------------------------------------------------

def test_snapshots_restart_and_catch_up_a_wiped_node(cluster):
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6).start_all()
    leader = c.leader()
    for i in range(30):
        commit(c, b"a%d" % i)
    c.converged()
    for node in c.nodes.values():
        assert node.force_snapshot()
        wait_until(lambda: node.status()["log_entries"] <= 3, what="compaction")
        snap = node.status()["snapshot"]
        assert snap["index"] == node.status()["applied_index"] and snap["bytes"] > 0
    leader_id = leader.status()["self_id"]
    a, b = [i for i in c.nodes if i != leader_id]

    # a node restarts from its snapshot and journal, and catches up on what it missed
    c.stop(a)
    for i in range(10):
        commit(c, b"b%d" % i)
    c.start(a)
    c.converged()
    assert len(c.machines[a].entries) == 40

    # a wiped node is sent the snapshot: the entries it lacks are no longer in the log
    c.stop(b)
    shutil.rmtree(c.root / b)
    for i in range(10):
        commit(c, b"c%d" % i)
    assert leader.force_snapshot()
    wait_until(lambda: leader.status()["log_entries"] <= 3, what="compaction")
    # its first restore fails: it must not acknowledge, and gets the snapshot again
    c.start(b, machine={"failing_restores": 1})
    c.converged()
    assert c.machines[b].failing_restores == 0
    assert c.nodes[b].status()["snapshot"]["index"] >= leader.status()["snapshot"]["index"]

    # the whole cluster restarts from disk
    expected = list(c.machines[leader_id].entries)
    assert len(expected) == 50
    c.close()
    c.start_all()
    leader = c.leader()
    commit(c, b"after-restart")
    c.converged()
    assert c.machines[leader.status()["self_id"]].entries == expected + [b"after-restart"]


def snapshot_header(node):
    return cbor2.loads(snapshot_file.records.read_file(node._snapshot_path, snapshot_file.MAGIC, first=1)[0])


def test_live_entries_stay_in_the_journal_and_a_follower_missing_them_gets_them_with_the_snapshot(cluster):
    c = cluster(machine_class=Keeper, segment_bytes=2048,
                compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6).start_all()
    leader_id = c.leader().status()["self_id"]
    for i in range(60):
        commit(c, b"keep %d" % i if i % 10 == 0 else b"filler %d " % i + b"x" * 100)
    commit(c, b"drop keep 0")
    c.converged()
    expected = {b"keep %d" % i: b"keep %d" % i for i in range(10, 60, 10)}
    for node_id, node in c.nodes.items():
        assert node.force_snapshot()
        wait_until(lambda: node.status()["log_entries"] <= 3, what="compaction")
        header = snapshot_header(node)
        # the snapshot names the live entries, it does not carry them: the journal keeps them
        assert (header["entries"], header["journal"]) == ([], sorted(c.machines[node_id].kept.values()))
        assert c.machines[node_id].read_back() == expected
        assert node._journal.stats()["kept_entries"] == 5

    # a follower that lost its disk: the leader's journal holds the live entries, the follower is
    # sent the snapshot with them carried
    lost = next(i for i in c.nodes if i != leader_id)
    c.stop(lost)
    shutil.rmtree(c.root / lost)
    for i in range(60, 70):
        commit(c, b"keep %d" % i if i % 5 == 0 else b"filler %d" % i)
    expected.update({b"keep 60": b"keep 60", b"keep 65": b"keep 65"})
    assert c.nodes[leader_id].force_snapshot()
    c.start(lost)
    c.converged()
    assert c.machines[lost].read_back() == expected
    header = snapshot_header(c.nodes[lost])
    assert (header["entries"], header["journal"]) == (sorted(c.machines[lost].kept.values()), [])

    # its own next snapshot carries what only its snapshot held and names what its journal holds
    commit(c, b"keep 70")
    expected[b"keep 70"] = b"keep 70"
    c.converged()
    assert c.nodes[lost].force_snapshot()
    header = snapshot_header(c.nodes[lost])
    assert header["journal"] == [c.machines[lost].kept[b"keep 70"]]
    assert header["entries"] == sorted(set(c.machines[lost].kept.values()) - set(header["journal"]))
    assert c.machines[lost].read_back() == expected

    # every node restarts from its snapshot and journal with every live entry
    c.close()
    c.start_all()
    c.leader()
    commit(c, b"after restart")
    c.converged()
    for node_id in c.nodes:
        assert c.machines[node_id].read_back() == expected, node_id
    assert len({cbor2.dumps(sorted(m.kept.items())) for m in c.machines.values()}) == 1


def test_a_damaged_snapshot_is_refused_and_restores_nothing(cluster):
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6).start_all()
    for i in range(5):
        commit(c, b"entry-%d" % i)
    c.converged()
    node_id, reader_id = sorted(c.nodes)[:2]
    assert c.nodes[node_id].force_snapshot()
    path = c.root / node_id / "snapshot.bin"
    data = bytearray(path.read_bytes())
    data[data.rindex(b"entry-4") + 6] ^= 0x01      # "entry-4" becomes "entry-5": still valid CBOR
    damaged = c.root / "damaged.bin"
    damaged.write_bytes(bytes(data))
    reader = c.machines[reader_id]
    held = list(reader.entries)
    with pytest.raises(ValueError, match="damaged snapshot"):
        c.nodes[reader_id]._read_snapshot(str(damaged))
    assert reader.entries == held
    c.nodes[reader_id]._read_snapshot(str(path))    # the intact file loads
    assert reader.entries == held


def test_a_node_closed_with_a_long_log_compacts_it_first_and_restarts_from_the_snapshot(cluster):
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6,
                compaction_min_bytes=256 * 1024).start_all()
    leader = c.leader()
    leader_id = leader.status()["self_id"]
    # above a quarter of the (jittered) byte threshold, below the threshold itself
    for i in range(100):
        commit(c, b"%04d" % i + b"x" * 1020)
    c.converged()
    assert all(n.status()["snapshot"]["count"] == 0 for n in c.nodes.values())
    c.stop(leader_id)
    restarted = c.start(leader_id)
    wait_until(lambda: restarted.status()["applied_index"] >= 100, what="the restarted node to apply")
    assert restarted.status()["snapshot"]["index"] is not None
    assert restarted.status()["log_entries"] < 10
    commit(c, b"after")
    c.converged()
    assert c.machines[leader_id].entries[-1] == b"after" and len(c.machines[leader_id].entries) == 101


def test_a_crash_between_snapshot_and_compaction_keeps_the_entries_after_the_snapshot(cluster):
    """The window between writing a snapshot and dropping the log prefix it
    covers: pysyncobj would clear the whole log at the next start."""
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6).start_all()
    leader = c.leader()
    follower_id = next(i for i, n in c.nodes.items() if n is not leader)
    follower = c.nodes[follower_id]
    for i in range(20):
        commit(c, b"a%d" % i)
    c.converged()
    follower._journal.deleteEntriesTo = lambda entry_to: None     # the crash: the prefix is never dropped
    assert follower.force_snapshot()
    for i in range(10):
        commit(c, b"b%d" % i)
    c.converged()
    last = follower.status()["last_log_index"]
    c.close()
    alone = c.start(follower_id)                                   # no leader to catch up from
    def loaded():
        status = alone.status()
        return 0 < (status["snapshot"]["index"] or 0) <= status["applied_index"]
    wait_until(loaded, what="the snapshot to load")
    # at least: a new term's first entry may have reached it after `last` was read
    assert alone.status()["last_log_index"] >= last > alone.status()["snapshot"]["index"]
    assert alone.status()["log_entries"] < 20

def test_a_snapshot_of_another_format_stops_the_node_at_start(cluster):
    """pysyncobj would log a failed load and go on without the state the
    snapshot held: the node must refuse to start instead."""
    c = cluster()
    (c.root / "n1").mkdir(parents=True)
    (c.root / "n1" / "snapshot.bin").write_bytes(b"RAFTQSN1" + b"\0" * 64)
    with pytest.raises(DamagedFile, match="not a RAFTQSN3 snapshot"):
        c.start("n1")
    assert "n1" not in c.nodes

def test_a_leader_keeps_leading_and_committing_while_its_snapshot_is_written(cluster):
    """A snapshot is written by a forked child: the node taking it goes on
    ticking. Written in a tick, a snapshot that takes longer than the
    election timeout deposes the leader that takes it."""
    c = cluster(compaction_min_entries=20, compaction_min_seconds=10 ** 6).start_all(
        machine={"snapshot_seconds": 2 * CALM_ELECTIONS[1]})
    leader = c.leader()
    term = leader.status()["term"]
    # every node's jittered threshold is at most 1.5 x 20 = 30 entries
    for i in range(40):
        commit(c, b"e%d" % i)
    wait_until(leader._node.snapshots.busy, what="the leader writing a snapshot")
    commit(c, b"during")
    assert leader._node.snapshots.busy(), "the commit waited for the snapshot"
    wait_until(lambda: leader.status()["log_entries"] < 40, what="the leader's compaction")
    c.converged()
    status = leader.status()
    assert (status["role"], status["term"], status["snapshot"]["count"]) == ("leader", term, 1)
    assert c.machines[status["self_id"]].entries[-1] == b"during"


def test_a_failed_snapshot_keeps_the_log_and_the_next_one_succeeds(cluster):
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6).start_all()
    leader = c.leader()
    leader_id = leader.status()["self_id"]
    for i in range(20):
        commit(c, b"a%d" % i)
    machine = c.machines[leader_id]
    machine.snapshot_fails = True          # the child raises: it exits non-zero
    assert not leader.force_snapshot()
    assert leader.status()["snapshot"]["count"] == 0 and leader.status()["log_entries"] > 20
    machine.snapshot_fails = False
    assert leader.force_snapshot()
    assert leader.status()["snapshot"]["count"] == 1 and leader.status()["log_entries"] < 20


def test_compaction_by_journal_bytes_with_few_large_entries(cluster):
    """Group commit makes entries large: a node must compact by bytes even
    when the entry count stays far below its threshold."""
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6,
                compaction_min_bytes=16 * 1024).start_all()
    # 16 KiB x jitter (1-1.5) is crossed by 30 entries of 1 KiB
    for i in range(30):
        commit(c, b"%04d" % i + b"x" * 1020)
    c.converged()
    nodes = list(c.nodes.values())
    for node in nodes:
        wait_until(lambda: node.status()["snapshot"]["count"] > 0 and node.status()["log_entries"] < 30,
                   what="a compaction by bytes")
    # nothing new applied, nothing to compact: no snapshot on every tick
    counts = [n.status()["snapshot"]["count"] for n in nodes]
    time.sleep(0.5)
    assert [n.status()["snapshot"]["count"] for n in nodes] == counts


def test_a_node_holds_few_of_its_log_commands_in_memory_and_reads_the_others_back(cluster):
    """Issue 25: the log not yet compacted stays on disk; every node holds the commands of its
    newest entries (RECENT_BYTES, whatever the largest entry may be) and of its first."""
    c = cluster(compaction_min_entries=10 ** 6, compaction_min_seconds=10 ** 6,
                compaction_min_bytes=1 << 30, max_entry_bytes=16 << 20).start_all()
    entries = [b"%04d" % i + b"x" * 1_000_000 for i in range(12)]
    for entry in entries:
        commit(c, entry)
    c.converged()
    for node in c.nodes.values():
        journal = node._journal
        last = journal.last_index()
        assert journal.stats()["entries"] > len(entries)                  # nothing compacted
        assert journal.held_command_bytes() <= RECENT_BYTES + 2 * len(entries[0])
        assert [node.entry_at(index) for index in range(last - 11, last + 1)] == entries


# -- proxies between nodes -------------------------------------------------------------

class Proxy:
    """A TCP forwarder with a pause switch (data waits, connections stay up)."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.pairs = {}
        self.paused = False
        self.accepted = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping:
            for key, _ in self.sel.select(0.02):
                sock = key.fileobj
                if sock is self.listener:
                    client, _ = self.listener.accept()
                    host, port = self.target.rsplit(":", 1)
                    try:
                        upstream = socket.create_connection((host, int(port)), timeout=2)
                    except OSError:
                        client.close()
                        continue
                    self.accepted += 1
                    self.pairs[client], self.pairs[upstream] = upstream, client
                    self.sel.register(client, selectors.EVENT_READ)
                    self.sel.register(upstream, selectors.EVENT_READ)
                elif not self.paused and sock in self.pairs:
                    try:
                        data = sock.recv(65536)
                        if data:
                            self.pairs[sock].sendall(data)
                            continue
                    except OSError:
                        pass
                    self._drop(sock)
            if self.paused:
                time.sleep(0.005)

    def _drop(self, sock):
        other = self.pairs.pop(sock, None)
        for s in (sock, other):
            if s is not None:
                self.pairs.pop(s, None)
                self.sel.unregister(s)
                s.close()

    def close(self):
        self.stopping = True
        self.thread.join()
        for sock in list(self.pairs):
            if sock in self.pairs:
                self._drop(sock)
        self.sel.close()
        self.listener.close()


@pytest.fixture
def proxied_cluster(cluster):
    """Three nodes whose every link goes through its own proxy."""
    proxies = []

    def make(**knobs):
        c = cluster(**knobs)
        real = {p.id: p for p in c.peers}
        dials = {}
        for a in c.peers:
            for b in c.peers:
                if a.raft_addr > b.raft_addr:      # a dials b
                    proxy = Proxy(b.raft_addr)
                    proxies.append(proxy)
                    dials[(a.id, b.id)] = proxy
        for a in c.peers:
            peers = [Peer(b.id, b.raft_addr, dials[(a.id, b.id)].addr if (a.id, b.id) in dials else None)
                     for b in real.values() if b.id != a.id]
            c.start(a.id, peers=peers)
        c.link = lambda x, y: dials.get((x, y)) or dials[(y, x)]   # the proxy between two nodes
        return c, proxies

    yield make
    for proxy in proxies:
        proxy.close()


def test_nodes_dial_proxies_but_keep_their_identity(proxied_cluster):
    c, proxies = proxied_cluster()
    for i in range(20):
        commit(c, b"p%d" % i)
    c.converged()
    assert all(proxy.accepted >= 1 for proxy in proxies)
    # every link is a proxied one: the nodes know each other by Raft address
    for node in c.nodes.values():
        status = node.status()
        assert all(p["connected"] for p in status["peers"].values())
        assert {p["raft_addr"] for p in status["peers"].values()} <= {p.raft_addr for p in c.peers}


def test_a_timed_out_submission_is_answered_once(proxied_cluster):
    # Long election timeouts keep the leader in place while its links pause.
    c, proxies = proxied_cluster(election_timeout=(4.0, 5.0), submit_timeout=0.5)
    leader = c.leader()
    commit(c, b"first")
    for proxy in proxies:
        proxy.paused = True
    calls = propose_wait(leader, b"stalled")
    assert calls == [(None, "timeout")]
    for proxy in proxies:
        proxy.paused = False
    c.converged()
    wait_until(lambda: all(m.entries == [b"first", b"stalled"] for m in c.machines.values()),
               what="the stalled entry to commit after all")
    assert calls == [(None, "timeout")]    # the late commit is not reported again


def confirm_read_wait(node, timeout=20.0):
    calls = []
    done = threading.Event()

    def callback(result, error):
        calls.append(error)
        done.set()

    node.confirm_read(callback)
    assert done.wait(timeout), "no callback"
    return calls


def test_a_leader_cut_off_from_its_followers_confirms_no_read(proxied_cluster):
    """While its lease still holds (answers heard within 2 s), a leader cut
    off from both followers must not confirm a read: only answers to appends
    sent after the read arrived count, and none can come. (Answers from
    before the cut would have confirmed it; with the followers electing
    another, its state would lack their writes.)"""
    c, proxies = proxied_cluster(election_timeout=(2.0, 2.5), leader_lease=2.0, submit_timeout=1.0)
    old = c.leader()
    commit(c, b"before")
    assert confirm_read_wait(old) == [None]
    old_id = old.status()["self_id"]
    for other in [i for i in c.nodes if i != old_id]:
        c.link(old_id, other).paused = True
    assert old.status()["role"] == "leader" and old.status()["quorum_ok"], "the lease should still hold"
    assert confirm_read_wait(old) != [None]


def test_a_follower_cut_off_from_the_leader_alone_does_not_depose_it(proxied_cluster):
    """PreVote, with a live leader: the cut-off follower asks the other one,
    which still hears the leader and says no, so nobody stands. pysyncobj
    alone elected the cut-off follower with that vote, deposing a healthy
    leader. Terms do not move; the leader commits with the other follower
    throughout, and the cut-off one catches up once the link is back."""
    c, proxies = proxied_cluster()
    leader = c.leader()
    commit(c, b"before")
    leader_id, term = leader.status()["self_id"], leader.status()["term"]
    cut_off, other = [i for i in c.nodes if i != leader_id]
    c.link(leader_id, cut_off).paused = True
    time.sleep(3 * CALM_ELECTIONS[1])
    assert leader.status()["role"] == "leader"
    assert c.nodes[other].status()["leader_id"] == leader_id
    assert [c.nodes[i].status()["term"] for i in c.nodes] == [term] * 3
    asked = c.nodes[cut_off].status()["pre_votes"]
    assert asked["asked"] >= 2 and asked["won"] == 0, asked
    commit(c, b"during")
    c.link(leader_id, cut_off).paused = False
    commit(c, b"after")
    c.converged()
    assert c.machines[cut_off].entries == [b"before", b"during", b"after"]
    assert [c.nodes[i].status()["term"] for i in c.nodes] == [term] * 3


def test_a_follower_cut_off_from_everyone_rejoins_without_an_election(proxied_cluster):
    """PreVote, with nobody to answer: the cut-off follower asks at every
    election timeout but never raises its term. pysyncobj alone raised it at
    each timeout, and once back that higher term deposed the leader."""
    c, proxies = proxied_cluster()
    leader = c.leader()
    commit(c, b"before")
    leader_id, term = leader.status()["self_id"], leader.status()["term"]
    cut_off = next(i for i in c.nodes if i != leader_id)
    links = [c.link(cut_off, i) for i in c.nodes if i != cut_off]
    # the counts are since the node started: it may have won a pre-vote in the first election
    before = c.nodes[cut_off].status()["pre_votes"]
    for link in links:
        link.paused = True
    time.sleep(3 * CALM_ELECTIONS[1])
    assert c.nodes[cut_off].status()["term"] == term
    after = c.nodes[cut_off].status()["pre_votes"]
    asked, won = after["asked"] - before["asked"], after["won"] - before["won"]
    assert asked >= 2 and won == 0, (before, after)
    for link in links:
        link.paused = False
    commit(c, b"after")
    c.converged()
    assert c.leader() is leader
    assert [c.nodes[i].status()["term"] for i in c.nodes] == [term] * 3



def test_a_leader_cut_off_from_everyone_steps_down_and_says_it_is_cut_off(proxied_cluster):
    """CheckQuorum. No answer to its appends reaches the leader (its links
    paused: connections stay up, nothing passes): within the longest
    election timeout it steps down, counts it, and says it is cut off, so
    its fronts refuse at once; what it is asked now is refused before the
    log. The other two elect a leader; once the links pass again the old
    leader follows it and is no longer cut off. pysyncobj's own fallback is
    off: without raftq's check the cut-off leader would lead on."""
    c, proxies = proxied_cluster()
    old = c.leader()
    commit(c, b"before")
    old_id = old.status()["self_id"]
    links = [c.link(old_id, i) for i in c.nodes if i != old_id]
    for link in links:
        link.paused = True
    wait_until(lambda: old.status()["role"] != "leader", timeout=10 * CALM_ELECTIONS[1],
               what="the cut-off leader to step down")
    status = old.status()
    assert status["cut_off"] and status["quorum_step_downs"] == 1 and not status["quorum_ok"]
    assert old.route()[4] is True
    assert propose_wait(old, b"lonely") == [(None, "not_leader")]
    new = wait_until(lambda: next((n for i, n in c.nodes.items() if i != old_id
                                   and n.status()["role"] == "leader"), None), what="a new leader")
    assert new.status()["term"] > status["term"]
    for link in links:
        link.paused = False
    commit(c, b"after")
    c.converged()
    wait_until(lambda: not old.status()["cut_off"], what="the old leader to hear the new one")
    assert c.machines[old_id].entries == [b"before", b"after"]
    assert [n.status()["quorum_step_downs"] for i, n in c.nodes.items() if i != old_id] == [0, 0]


# -- membership and leadership -----------------------------------------------------------

def test_add_and_remove_a_node(cluster):
    c = cluster(4)
    first3, newcomer = c.peers[:3], c.peers[3]
    for p in first3:
        c.start(p.id, peers=[q for q in first3 if q != p])
    leader = c.leader()
    commit(c, b"before")
    c.start(newcomer.id, peers=first3)

    def membership(call, arg):
        out = []
        done = threading.Event()
        call(arg, lambda r, e: (out.append(e), done.set()))
        assert done.wait(20)
        return out

    assert membership(leader.add_node, newcomer) == [None]
    commit(c, b"with-four")
    c.converged()
    assert c.machines[newcomer.id].entries == [b"before", b"with-four"]
    assert newcomer.id in leader.status()["peers"]
    wait_until(lambda: c.nodes[newcomer.id].leader_id() == leader.status()["self_id"], what="n4 to follow")

    assert membership(leader.remove_node, "nobody") == ["denied"]
    assert membership(leader.remove_node, newcomer.id) == [None]
    c.stop(newcomer.id)
    assert newcomer.id not in leader.status()["peers"]
    commit(c, b"three-again")
    c.converged()


class VoterProbe(Recorder):
    """A Recorder that notes, at each entry it applies, the voters its node counts."""

    def __init__(self, **knobs):
        super().__init__(**knobs)
        self.voters_seen = []

    def apply(self, entry):
        self.voters_seen.append(voters(self.node))
        return super().apply(entry)


def voters(node) -> set[str]:
    status = node.status()
    return {status["self_id"], *status["peers"]}


def change_membership(call, arg):
    out = []
    done = threading.Event()
    call(arg, lambda r, e: (out.append(e), done.set()))
    assert done.wait(20)
    assert out == [None]


@pytest.mark.parametrize("snapshot", [False, True], ids=["log-only", "after-a-snapshot"])
def test_a_restarted_node_counts_by_its_logs_membership_from_its_first_tick(cluster, snapshot):
    """Raft counts votes and acknowledgements by the newest configuration in a node's log,
    committed or not. A node restarted with the voters it first had (cluster.toml as written
    before `raftq cluster add`) counts by the membership in its snapshot and log from its first
    tick, before it has applied the entries that changed it, and applying them again never
    brings back a configuration the log has moved past."""
    c = cluster(4)
    first3, newcomer = c.peers[:3], c.peers[3]
    for p in first3:
        c.start(p.id, peers=[q for q in first3 if q != p])
    leader = c.leader()
    leader_id = leader.status()["self_id"]
    me, gone = [p for p in first3 if p.id != leader_id]
    for n in range(4):
        commit(c, b"e%d" % n)
    if snapshot:
        c.converged()
        assert c.nodes[me.id].force_snapshot()
    c.start(newcomer.id, peers=first3)
    change_membership(leader.add_node, newcomer)
    change_membership(leader.remove_node, gone.id)
    commit(c, b"probe")
    change_membership(leader.add_node, gone)      # back again: the last change is an add
    commit(c, b"after")
    everyone = {p.id for p in c.peers}
    c.converged([leader_id, me.id, newcomer.id])
    assert voters(c.nodes[me.id]) == everyone
    c.close()

    # applying takes 0.1 s an entry: its first tick applies only the first of those after the
    # snapshot, all of them before the changes
    node = c.start(me.id, peers=[p for p in first3 if p != me], run=False,
                   machine_class=VoterProbe, machine={"apply_seconds": 0.1})
    node.call(node._node.tick)
    assert node.status()["snapshot"]["index"] is not None if snapshot else True
    assert voters(node) == everyone
    node.run()
    probe = c.machines[me.id]
    wait_until(lambda: probe.entries[-1:] == [b"after"], 30, "the log to be applied")
    assert probe.voters_seen and all(seen == everyone for seen in probe.voters_seen), probe.voters_seen


def test_transfer_leadership(cluster):
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"x")
    old = leader.status()["self_id"]
    assert leader.transfer_leadership(5.0)
    new = c.leader()
    assert new.status()["self_id"] != old
    commit(c, b"y")
    c.converged()



def test_a_transfer_under_a_steady_stream_of_writes_lands_on_its_target_in_one_election(cluster):
    """Raft thesis 3.10: the leader takes no new entries while it hands over. Were its log
    to grow after it sent TimeoutNow, the target would stand with a shorter log, be refused
    by the others and leave the group to elections it did not ask for (seen in chaos: a
    balancing hand-off under load took three terms and 3 s)."""
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"x")
    old = leader.status()["self_id"]
    target = next(p.id for p in c.peers if p.id != old)
    answered, stop = [], threading.Event()

    def write_steadily():
        n = 0
        while not stop.is_set():
            n += 1
            leader.propose(b"w-%d" % n, lambda result, error: answered.append(error), term=term)
            time.sleep(0.002)

    term = leader.term()
    writer = threading.Thread(target=write_steadily)
    writer.start()
    try:
        time.sleep(0.3)
        moved = leader.transfer_leadership(2.0, to=target, step_down=False)
    finally:
        stop.set()
        writer.join()
    assert moved
    new = c.leader()
    assert new.status()["self_id"] == target
    assert new.term() == term + 1
    # every write is answered: written, refused before the log (what the old leader held back
    # while it handed over: not_leader), or in flight as the lead moved (leader_changed)
    wait_until(lambda: len(answered) > 0 and all(e in (None, "not_leader", "no_quorum", "leader_changed")
                                                 for e in answered), 20, "every write answered")
    c.converged()



def test_writes_held_for_a_hand_off_that_fails_are_written_once_the_hold_ends(cluster):
    c = cluster().start_all()
    leader = c.leader()
    commit(c, b"x")
    old = leader.status()["self_id"]
    gone = next(p.id for p in c.peers if p.id != old)
    c.stop(gone)
    outcome = {}
    transfer = threading.Thread(target=lambda: outcome.setdefault(
        "moved", leader.transfer_leadership(3.0, to=gone, step_down=False)))
    transfer.start()
    try:
        time.sleep(0.1)
        [(result, error)] = propose_wait(leader, b"during the hand-off")
    finally:
        transfer.join()
    assert error is None
    assert outcome["moved"] is False
    assert c.leader().status()["self_id"] == old
    c.converged()
    assert c.machines[old].entries == [b"x", b"during the hand-off"]


# -- fsync before acknowledgement, observed from outside -----------------------------------

CHILD = textwrap.dedent("""
    import asyncio, os, sys
    sys.path.insert(0, {root!r})
    from raftq.engine.config import Peer
    from raftq.engine.raft.consensus import Consensus
    me, data_dir, *others = sys.argv[1:]
    peers = [Peer(*o.split("=")) for o in others]
    applied = []

    async def main():
        loop = asyncio.get_running_loop()
        node = Consensus(self_peer=Peer(*me.split("=")), peers=peers, data_dir=data_dir,
                         apply=applied.append, write_snapshot=lambda out: None, restore=lambda b: None,
                         secret={secret!r}, election_timeout=(60.0, 90.0))
        node.start(loop)
        stdin_closed = asyncio.Event()
        loop.add_reader(0, lambda: os.read(0, 4096) or stdin_closed.set())
        print("ready", flush=True)
        await stdin_closed.wait()
        loop.remove_reader(0)
        await node.close()

    asyncio.run(main())
""")


def test_a_follower_syncs_its_journal_before_any_acknowledgement(cluster, tmp_path):
    require_strace()
    c = cluster()
    child_peer = c.peers[2]
    for p in c.peers[:2]:
        c.start(p.id)
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(root=str(ROOT), secret=SECRET))
    trace = tmp_path / "trace"
    args = [f"{child_peer.id}={child_peer.raft_addr}", str(tmp_path / "child"),
            *[f"{p.id}={p.raft_addr}" for p in c.peers[:2]]]
    proc = subprocess.Popen(["strace", "-f", "-y", "-o", str(trace), "-e",
                             "trace=write,pwrite64,fsync,fdatasync,sendto,sendmsg",
                             sys.executable, str(script), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        leader = c.leader()
        for i in range(30):
            commit(c, b"s%d" % i)
        wait_until(lambda: leader.status()["peers"][child_peer.id]["match_index"] ==
                   leader.status()["last_log_index"], what="the child to acknowledge everything")
        # what was watched is the binary wire: the child announced it, and the appends went so
        transport = leader.node._node.transport
        to_child = next(conn for node, conn in transport._connections.items() if node.id == child_peer.raft_addr)
        assert to_child.peer_binary and leader.status()["appends_sent"]["binary"] >= 30
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    unsynced = False
    appends = sends_after_appends = 0
    for line in trace.read_text().splitlines():
        m = re.search(r"\b(write|pwrite64|fsync|fdatasync|sendto|sendmsg)\(\d+<([^>]*)>", line)
        if m is None:
            continue
        call, target = m.groups()
        if re.search(r"/seg-\d+\.log$", target):
            if call in ("fsync", "fdatasync"):
                unsynced = False
            else:
                unsynced = True
                appends += 1
        elif target.startswith(("TCP", "socket")) and call in ("sendto", "sendmsg", "write"):
            assert not unsynced, "sent to a peer while journal writes were not yet synced"
            sends_after_appends += appends > 0
    # (a slowed-down child gets several entries per message, hence fewer replies)
    assert appends >= 30 and sends_after_appends >= 1
