"""raftq's Raft node: pysyncobj's SyncObj with the protocol fixes raftq needs.

pysyncobj 0.3.17 runs the Raft protocol in *ticks* (network I/O, elections,
replication, commit, apply); raftq runs them on the engine's asyncio loop
(``engine.raft.ticking``), not on pysyncobj's own tick thread. ``RaftNode``
subclasses it and closes these gaps (docs/guarantees.md, "What pysyncobj
0.3.17 lacks"); ``engine.raft.consensus`` drives it.

1. Durability. ``engine.storage.journal.DurableJournal`` (checksummed, fsynced
   segments; term/vote/commit index in an fsynced meta file) replaces
   pysyncobj's mmap journal through pysyncobj's single injection point,
   ``createJournal`` as imported into ``pysyncobj.syncobj``: it is wrapped once,
   when the first ``RaftNode`` is built, so that a journal *object* passed as
   ``conf.journalFile`` is used as is, while any other value gets pysyncobj's
   own behaviour -- per instance, and inert for other users of pysyncobj in
   the process. Syncs are grouped but never skipped: the leader appends a
   round of commands, sends them to the followers and fsyncs while they do
   (Raft allows the leader's own write in parallel; it counts itself only at
   the next tick, after the sync); a follower appends what one network poll
   brought, fsyncs once, and only then sends the acknowledgements it queued
   meanwhile. Anything that could make a queued acknowledgement untrue
   (truncation, clear, a new term) first flushes the queue.
2. Follower truncation. A follower handles AppendEntries and snapshots
   itself (``engine.raft.follower``): it deletes entries only on a real
   conflict and loads a snapshot only over a log that lacks its last entry;
   pysyncobj dropped acknowledged entries in both cases.
3. Compaction. Snapshots are ``engine.storage.snapshot_file``'s (no pickle of live
   objects), written by a forked child (``engine.raft.snapshots``) so that
   no node stops ticking while one is taken. A node compacts once its log
   holds more entries *or more bytes* than its thresholds (pysyncobj counts
   entries only, and group commit makes entries large). A snapshot that
   failed is taken again ``SNAPSHOT_RETRY_S`` later, not at the next tick.
4. No forwarding. pysyncobj sends a command queued on a node that has lost
   the lead to the new leader; raftq entries carry their proposer's log
   time, valid for one term only, so ``TermCheckedQueue`` refuses them.
5. Apply. A tick applies committed entries for at most ``APPLY_BUDGET_S``
   before it sends heartbeats and reads messages again (pysyncobj applies
   every committed entry first, however long that takes). Followers learn
   the commit index with the next append or heartbeat rather than by an
   extra round after every apply. A leader commits and applies as the
   acknowledgement that makes a majority arrives, not at its next tick.
6. Never raise. Every pysyncobj callback resolves a ``Ticket``, whose
   callback is wrapped (an exception in one would otherwise make pysyncobj
   apply the entry again).
7. Idle wake-ups. The next tick falls at the next heartbeat (leader) or
   election deadline (follower), at most ``MAX_POLL_S`` away while a
   connection is to be retried or no leader is heard, or as soon as
   a socket is ready or a proposal or task arrives, rather than every few
   milliseconds: an idle node wakes for heartbeats only, and a follower that
   hears its leader and every peer reads the heartbeats without a tick and
   ticks at its election deadline. A tick whose last
   poll read only routine messages (``ROUTINE``) is not followed by another
   at once: a misjudged message costs at most that wait, never an outcome.
8. Late ticks. A follower whose own tick came late (a long apply, a busy
   machine) reads the messages waiting in its sockets before it decides
   that its leader is gone: pysyncobj would call an election at once, over
   the heartbeats it had not read yet.
9. A leader's connection that closes. A killed leader's sockets close at
   once (the kernel resets them), long before the election timeout ends. A
   follower that loses its connection to its leader stands at once (its
   pre-vote, item 11, is granted: the others lost that connection too), the
   followers one after the other (``LOST_LEADER_STAGGER_S``) so
   that their votes do not split. Nothing waits for a lease to run out:
   leader reads are confirmed by a round of answers (item 10), not by a
   lease. A leader silenced by a partition, whose connections stay open,
   is still found by the election timeout; so the timeout can be generous
   (elections under load are rare) while a crashed leader is replaced
   quickly.
10. Confirmed leader reads (``engine.raft.read_index``). Appends carry the time
   the leader sent them (``sent_at``), echoed in the answers; a read is
   answered once a majority answered an append sent after it arrived, and
   the leader applied up to its commit index of that moment (ReadIndex).
11. PreVote (``engine.raft.prevote``). A node whose election timeout runs
   out first asks whether a majority would vote for it, and stands only if
   so: a node cut off from the others no longer deposes a healthy leader
   when it comes back, nor is one that lost only the leader elected.
12. CheckQuorum: a leader that hears from no majority for an election
   timeout steps down (``_check_quorum``).
13. Membership at restart. Raft counts votes and acknowledgements by the
   newest configuration in a node's log, committed or not. pysyncobj
   restarts with the snapshot's (or, without one, the voters it is given:
   cluster.toml's, or those a group first started with) and takes on the
   changes in its log only as it applies them again -- up to the commit
   index it last wrote down, which it writes lazily, and 20 ms of applying
   per tick -- so a node restarted right after ``raftq cluster add`` could
   vote, stand and count a majority by the configuration before it. A
   node now takes on its log's membership changes before its first vote
   (``_adopt_logged_membership``; the journal notes where they are as it
   opens), and applying an entry no longer changes the configuration:
   appending it did (leader, follower) or opening the log did.
14. A full disk. A leader whose journal has no room for an entry refuses
   the proposals in it (``insufficient_storage``: certainly not applied)
   and counts it nowhere -- not in the journal, not among pysyncobj's
   entries waiting for their commit, not as a membership change -- where
   pysyncobj's tick would have raised with the proposal's callback lost;
   a new leader with no room for its no-op steps down. A follower with no
   room acknowledges what it could write and takes the rest again when
   the leader resends it (``engine.raft.follower``).
15. Damage found at start-up (``engine.storage.journal``, "Start-up"): a
   node that gave up entries it may have acknowledged neither votes, nor
   answers pre-votes, nor stands for election (a leadership transfer
   included) until its log holds them again, catching up from the leader
   as any follower that lags: a voter never forgets an entry it
   acknowledged.
16. Damaged records while running. The journal checks every record it
   reads back (``engine.storage.damage``); one that fails is fetched from
   another replica (``engine.raft.repair``: ``EntryRepair`` answers and asks over
   the Raft port) and written back in place. Meanwhile nothing stops: the
   applies wait at the damaged entry without spinning (``apply_waits_for``),
   a follower whose next entry the leader cannot read is sent what precedes
   it and then heartbeats (``send_append_entries``: pysyncobj's
   indexed the empty batch, and the tick failed with the heartbeats of
   every follower after it), and what reads only the first entry's index
   reads no command.
17. A put's own path. pysyncobj takes a proposal off its queue in a tick and
   reads each answer in another: a lone put cost its leader's engine about
   four ticks (docs/benchmarks.md). In the steady state -- this node leads
   the proposal's term, no command waits in the queue, no membership change
   is unapplied, and a majority holds everything before the entry -- the
   proposal is appended, sent to each follower that holds everything
   before it, and synced in the turn of the loop that proposes it
   (``_append_at_once``); a follower that is behind, or is being sent a
   snapshot, gets it from the ticks' sends, which catch it up. A socket
   that is ready is read without a tick (``read``): a follower writes,
   syncs and answers the appends in it, a leader counts the answers
   (``_on_answer``: its own code, which drops an answer of an earlier
   term and steps down on one of a newer term; pysyncobj counted any, and
   a follower now refuses an append of an older term with its own),
   commits (entries of its own term only,
   itself once synced) and applies.
   A tick follows only a read that brought news. A follower applies what an
   append committed in the read that answered it. Ticks remain for
   heartbeats, elections, PreVote, CheckQuorum, compaction and catch-up;
   ``ticks`` counts them, ``leader_ticks`` those a leader runs.
18. Quiet groups (``engine.raft.quiet``). A leader with nothing to
   replicate for a while heartbeats once a ``QUIET_HEARTBEAT_S``, each
   heartbeat promising the next within that long; its followers wait that
   much longer before they stand, and both sides count each other heard
   that much longer (``contact_slack``). Anything sent without the promise
   ends the quiet, and the next heartbeat falls within the usual period.
19. Entries without pickle. pysyncobj logs a call of a replicated method
   as a pickle of ``(method id, args)`` behind its REGULAR type byte, and
   unpickles it to apply it, on every replica. Once every node runs a
   release that applies them (``allow_plain_entries``, told by the front's
   feature gate, api/features.py), a proposal is logged as the
   ``PLAIN_ENTRY`` type byte and the entry's own bytes, and applied
   without pysyncobj's call machinery (``do_apply_command``). Both forms are
   read for as long as a log holds them (``Consensus._entry_of``); a release before
   this one would apply a plain entry as nothing, hence the gate.
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import random
import socket
import types
from typing import Callable

from . import pysyncobj_pin  # noqa: F401  -- the release these overrides were written for
import pysyncobj.syncobj as _syncobj
from pysyncobj import replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.fast_queue import FastQueue
from pysyncobj.journal import Journal
from pysyncobj.node import TCPNode

from ..outcome import INSUFFICIENT_STORAGE
from ..storage.damage import DamagedRecord
from ..storage.journal import DurableJournal
from ..storage import records
from ..storage.records import InsufficientStorage
from .follower import FollowerSide
from .internals import SyncObjInternals, monotonic
from .prevote import PRE_VOTE, PRE_VOTE_ANSWER, PreVote
from .quiet import QuietLeader
from .snapshots import ForkedSnapshots
from .wire import DialingTransport
from .read_index import ReadConfirmations
from .repair import ENTRY_COPY, FETCH_ENTRY, EntryRepair
from .sealer import Sealer
from .ticking import LateTicks, LoopTicker, WatchedPoller

logger = logging.getLogger(__name__)


def _install_journal_hook() -> None:
    original = _syncobj.createJournal
    if getattr(original, "raftq_hook", False):
        return

    def createJournal(journalFile=None):
        if isinstance(journalFile, Journal):
            return journalFile
        return original(journalFile)

    createJournal.raftq_hook = True
    _syncobj.createJournal = createJournal


FOLLOWER, CANDIDATE, LEADER = _syncobj._RAFT_STATE.FOLLOWER, _syncobj._RAFT_STATE.CANDIDATE, _syncobj._RAFT_STATE.LEADER
ROLE_NAMES = {FOLLOWER: "follower", CANDIDATE: "candidate", LEADER: "leader"}
# How far apart ticks fall when nothing wakes the node sooner: at least
# MIN_POLL_S (never a busy loop, e.g. a follower past its deadline with no
# peer connected), at most MAX_POLL_S (connection retries, handshake and
# ticket deadlines).
MIN_POLL_S = 0.002
MAX_POLL_S = 0.1
# A follower that hears its leader and holds a connection to every peer has no
# retry to make: it ticks at its election deadline (0.3-0.6 s away, pushed on by
# every heartbeat), which comes before this.
QUIET_POLL_S = 1.0
# How long after a failed snapshot the next one is taken unless one is asked for.
SNAPSHOT_RETRY_S = 5.0
# The longest a tick applies committed entries before it sends heartbeats and
# reads messages again: far below the election timeout.
APPLY_BUDGET_S = 0.02
# Followers that lost their leader's connection stand for election one after
# the other, in the order of their addresses, this far apart (plus a little
# jitter): the first one's vote request reaches the others before they stand,
# so their votes do not split.
LOST_LEADER_STAGGER_S = 0.05
LOST_LEADER_JITTER_S = 0.01
# Messages that need no tick after the one that reads them, by the reader's
# role: a follower answers an append as it reads it (its replies go out at
# the end of that tick, and entries it learns are committed make the next
# tick due at once: _until_due); a leader counts an answer, commits and
# applies as it reads it (_commit_acknowledged). Unless the message changed
# the reader's role, term or leader, or came from a peer the facade no
# longer counted as heard (``heard_within``): then whether a majority is
# heard may have changed, which the next tick reports.
ROUTINE = {FOLLOWER: frozenset({"append_entries"}), CANDIDATE: frozenset(), LEADER: frozenset({"next_node_idx"})}
REGULAR_COMMAND = _syncobj._COMMAND_TYPE.REGULAR
REGULAR_BYTE = bytes([REGULAR_COMMAND])
NO_OP = bytes([_syncobj._COMMAND_TYPE.NO_OP])
# Item 19: an entry logged as it is, after a type byte none of pysyncobj's command types use.
PLAIN_ENTRY = 0x45
PLAIN_BYTE = bytes([PLAIN_ENTRY])
ENTRY_BYTES = frozenset({PLAIN_BYTE, REGULAR_BYTE})    # the type bytes of a command that carries an entry
# What a node's own snapshot that failed its checks at start is renamed with.
DAMAGED_SUFFIX = ".damaged"
MEMBERSHIP_COMMAND = _syncobj._COMMAND_TYPE.MEMBERSHIP
MEMBERSHIP_BYTE = bytes([MEMBERSHIP_COMMAND])

FAIL_REASONS = {
    FAIL_REASON.QUEUE_FULL: "overloaded",
    FAIL_REASON.MISSING_LEADER: "no_quorum",
    FAIL_REASON.DISCARDED: "discarded",
    FAIL_REASON.NOT_LEADER: "not_leader",
    FAIL_REASON.LEADER_CHANGED: "leader_changed",
    FAIL_REASON.REQUEST_DENIED: "denied",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown_outcome",
}


class AddressNode(str, TCPNode):
    """pysyncobj's ``TCPNode``, hashed and compared as its address string is, in C. A leader looks
    its followers up in pysyncobj's dicts dozens of times per entry, and ``Node.__hash__`` is two
    Python calls each time (the hash, then the ``id`` property). It is equal to every node of its
    address, as a ``TCPNode`` is, and to the address itself."""

    def __new__(cls, address: str, **kwargs):
        return super().__new__(cls, address)

    __repr__ = TCPNode.__repr__


class Ticket:
    """One caller's callback, resolved exactly once, in a tick.

    ``term`` is the term the caller prepared its entry for: the entry may enter
    the log only while this node leads that term.
    """

    __slots__ = ("callback", "deadline", "term", "done")

    def __init__(self, callback, deadline: float, term: int):
        self.callback = callback
        self.deadline = deadline
        self.term = term
        self.done = False

    def resolve(self, result, error: str | None) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.callback(result, error)
        except Exception:
            logger.exception("a consensus callback raised; ignored so the entry is not applied again")

    def on_pysyncobj_result(self, result, fail_reason) -> None:
        if fail_reason == FAIL_REASON.SUCCESS:
            self.resolve(result, None)
        else:
            self.resolve(None, FAIL_REASONS.get(fail_reason, "unknown_outcome"))


class TermCheckedQueue(FastQueue):
    """pysyncobj's command queue, handing out only what may enter the log now.

    pysyncobj takes a queued command off this queue in a tick and,
    if the node has meanwhile lost the lead, sends it to the new leader
    (``apply_command``), which appends it to its log. A raftq entry carries
    its proposer's log time (``now_ms``), which is only right for the term it
    was stamped in: forwarded, an old leader's clock would run the new term's
    log time ahead of real time and expire leases early (found by the chaos
    suite: a paused leader woke up and put its tick into the new leader's
    log, 223 ms ahead). So a command is handed out only while this node leads
    the term it was proposed for; any other is refused, definitely not
    applied, and its caller retries with the current leader. The check runs
    in the tick, at the moment pysyncobj decides, so no role change can
    slip in between.
    """

    def __init__(self, node: "RaftNode", max_size: int):
        super().__init__(max_size)
        self._node = node
        # Commands queued and not yet handed out: while there are any, a proposal queues behind
        # them rather than entering the log at once (RaftNode._append_at_once), keeping their order.
        self.waiting = 0

    def put_nowait(self, value):
        super().put_nowait(value)
        self.waiting += 1

    def get_nowait(self):
        while True:
            command, callback = super().get_nowait()
            self.waiting -= 1
            ticket = getattr(callback, "__self__", None)
            if not isinstance(ticket, Ticket) or self._node.leads(ticket.term):
                self._node.taken = (command, callback)   # what the leader is about to append
                if command[:1] == MEMBERSHIP_BYTE:
                    self._node.membership_at = (self._node._journal.last_index() or 0) + 1
                return command, callback
            ticket.resolve(None, "not_leader")


class RaftNode(FollowerSide, PreVote, EntryRepair, QuietLeader, SyncObjInternals):
    """SyncObj with raftq's follower fix, PreVote, repairs from peers, grouped fsyncs and one
    replicated method.

    It and its mixins read and steer pysyncobj's private state by the names
    ``engine.raft.internals`` gives it (pysyncobj 0.3.17's, pinned by
    engine/raft/pysyncobj_pin.py) and override the hooks named there; the
    facade (``engine.raft.consensus``) reads and steers it through the
    methods under "what the facade reads" and "what the facade steers".

    ``apply_entry(entry)`` applies a committed entry (in a tick);
    ``snapshot_written(last_index, seconds)`` runs once a snapshot is in place;
    ``ship_snapshot(path)`` is what a follower is sent of it (``engine.raft.snapshots``);
    ``snapshot_damaged(damage)`` is told of a damaged carried entry its writer found;
    ``copy_for_peer`` and ``copy_arrived`` answer and take repairs (``engine.raft.repair``).
    """

    def __init__(self, self_node, other_nodes, conf, journal: DurableJournal, dial_addrs, *,
                 apply_entry: Callable[[bytes], object], snapshot_written: Callable[[int, float], None],
                 ship_snapshot: Callable, snapshot_damaged: Callable[[DamagedRecord], None],
                 copy_for_peer: Callable, copy_arrived: Callable,
                 sealer: Sealer | None, max_frame: int, compaction_min_bytes: int,
                 heard_within: float, group: int = 0, handoff: socket.socket | None = None):
        _install_journal_hook()
        self._apply_entry = apply_entry
        self._copy_for_peer = copy_for_peer
        self._copy_arrived = copy_arrived
        # The committed entry this node cannot apply until its damaged record is repaired
        # (item 16), None while nothing holds the applies back.
        self.apply_waits_for: int | None = None
        self._sealer = sealer
        self._journal = journal
        self._acks_apply_until: float | None = None   # see _commit_acknowledged
        self.reads = ReadConfirmations()
        # When each peer (by Raft address) was last heard from, and when this
        # node last heard from a leader it follows: what the facade judges a
        # majority by (engine.raft.consensus, quorum_ok) and PreVote a live leader.
        self.last_heard: dict[str, float] = {}
        self.leader_contact = 0.0
        # The facade counts a peer heard (a majority, a live leader) if it was
        # within this long: a peer heard again sooner changes nothing it judges.
        self._heard_within = heard_within
        # The last entry of the snapshot loaded last (set by the snapshot
        # reader): how a follower knows that a leader's snapshot loaded.
        self.loaded_snapshot: tuple | None = None
        self._damaged_snapshot: str | None = None     # this node's own, found so as it was loaded
        # CheckQuorum (item 12): when this node last stepped down for want of a
        # majority, until it follows a leader or leads again; and how often.
        self.quorum_lost_at: float | None = None
        self.quorum_step_downs = 0
        self.compaction_min_bytes = compaction_min_bytes
        self.declines_leadership = False   # see decline_leadership
        self.taken: tuple | None = None     # the command the leader took off its queue last (item 14)
        # Where the last membership change this leader took off its queue went into the log: until
        # it is applied, proposals take the tick's way (item 17), whose sends reach every voter.
        self.membership_at = 0
        self.ticks = 0            # every tick (item 17: a follower's none on a lone put's path)
        self.leader_ticks = 0     # ticks run while leading (item 17: none on a lone put's path)
        self.appends_refused = 0  # answers to this leader's appends that the follower could not take
        journal.before_rewrite = self._flush_replies
        self._ticker: LoopTicker | None = None     # set by run_on
        super().__init__(self_node, other_nodes, conf, nodeClass=AddressNode,
                         transportClass=functools.partial(DialingTransport, dial_addrs=dial_addrs,
                                                         max_frame=max_frame, group=group, handoff=handoff))
        # pysyncobj wakes its tick thread's poll through a pipe when a command
        # is queued; on the loop, a wake-up is a tick scheduled (wake).
        self.replace_pipe_notifier(types.SimpleNamespace(notify=self.wake))
        # Replaced before the first tick, which reads it first.
        self.commands_queue = TermCheckedQueue(self, conf.commandsQueueSize)
        self._read_snapshot = conf.deserializer
        self.snapshots = ForkedSnapshots(conf.fullDumpFile, conf.logCompactionBatchSize,
                                         write=conf.serializer, read=self._load_snapshot,
                                         on_written=snapshot_written, ship=ship_snapshot,
                                         on_damaged=snapshot_damaged)
        self.snapshot_serializer = self.snapshots
        self.apply_func_id = self._methodToID[self._getFuncName("_raftq_apply")]
        self.plain_entries = False    # item 19: until every node is known to apply them
        # Item 13: the membership changes in the log as it was opened, taken on once, before the
        # first tick can vote -- now, or once the first tick has loaded the snapshot they follow.
        self._logged_membership = journal.noted_at_open
        if not os.path.isfile(conf.fullDumpFile):
            self._adopt_logged_membership()

    @property
    def _poller(self) -> WatchedPoller:
        return self._watched_poller

    @_poller.setter
    def _poller(self, poller) -> None:
        # pysyncobj builds its poller in __init__, before its transport and its
        # wake-up pipe subscribe to it: every subscription goes through this one
        self._watched_poller = WatchedPoller(poller)

    @replicated
    def _raftq_apply(self, entry):
        return self._apply_entry(entry)

    # -- membership at restart (item 13) ---------------------------------------

    def load_dump_file(self, clear_journal):
        # pysyncobj's sets the snapshot's membership; the log's changes after it come on top
        self._damaged_snapshot = None
        super().load_dump_file(clear_journal)
        if self._damaged_snapshot is not None and not clear_journal:
            self._start_without_own_snapshot(self._damaged_snapshot)
            return
        loaded = self.loaded_snapshot
        if loaded is not None and self.last_applied != loaded[1]:
            # pysyncobj restored the snapshot's state, then could not put its entries in the journal
            # (no room on the disk) and swallowed the error: the state is the snapshot's, the log
            # and the applied index are not, and applying on would make a replica unlike the others.
            reason = f"a snapshot up to index {loaded[1]} was loaded but its entries could not be written to the log"
            records.fatal(reason)
            raise RuntimeError(reason)
        self._adopt_logged_membership()

    def _adopt_logged_membership(self) -> None:
        """Take on the membership changes of the log entries after the last one applied (the
        snapshot's), in log order, as a follower does when it appends them; once, at open."""
        noted, self._logged_membership = self._logged_membership, []
        journal = self._journal
        for index in noted:
            if index <= self.last_applied:
                continue
            command = journal.command(index)
            change = self.parse_change_cluster_request(command) if command is not None else None
            if change is not None:
                self.do_change_cluster(change)
        if journal.regain_index is not None and not self.other_nodes:
            # item 15 waits for a peer's copy: a group of one replica has none
            logger.critical("journal %s: this group's only replica gave up damaged entries up to index %d that "
                            "no other replica holds: they are lost (restore the data directory from a backup "
                            "to have them back); it serves what it kept", journal.directory, journal.regain_index)
            journal.forget_regain()

    def do_apply_command(self, command):
        kind = command[:1]
        if kind == PLAIN_BYTE:
            return self._apply_entry(command[1:])
        if kind == MEMBERSHIP_BYTE:
            return None     # the configuration changed when the entry was appended, or at open
        return super().do_apply_command(command)

    def _load_snapshot(self, filename: str):
        """The snapshot reader (``conf.deserializer``), noting what it loaded, or that the file
        failed its checks (pysyncobj logs the error and goes on without the state)."""
        try:
            loaded = self._read_snapshot(filename)
        except ValueError:
            self._damaged_snapshot = filename
            raise
        self.loaded_snapshot = loaded[0]
        return loaded

    def _start_without_own_snapshot(self, path: str) -> None:
        """This node's own snapshot failed its checks as it started (a damaged disk). pysyncobj
        would go on with an empty state and a log that follows the lost one: it applied nothing
        more, yet acknowledged appends, voted, and could lead and serve that empty state. The log
        is given up whole instead (item 15: no vote until it holds its last index again) and
        the node starts as a new one, whose log the leader replaces with its own snapshot."""
        if not self.other_nodes:
            reason = (f"snapshot {path} is damaged and this group has no other replica to take its "
                      "state from: restore the data directory from a backup")
            records.fatal(reason)
            raise RuntimeError(reason)
        journal = self._journal
        os.replace(path, path + DAMAGED_SUFFIX)       # kept for whoever looks into the disk, never loaded
        journal.give_up_everything()
        journal.add(NO_OP, 1, 0)                      # a new node's log, as pysyncobj starts one
        journal.setRaftCommitIndex(1)
        self.last_applied = self.commit_index = 1
        logger.error("snapshot %s was moved to %s%s. This node gives up entries 1 to %d and takes them again "
                     "from the leader (its snapshot, then the log); until its log holds index %d again it "
                     "neither votes nor stands for election (docs/operations.md, \"A damaged or full disk\")",
                     path, path, DAMAGED_SUFFIX, journal.regain_index, journal.regain_index)

    # -- what the facade reads ------------------------------------------------

    def role(self):
        """FOLLOWER, CANDIDATE or LEADER (``ROLE_NAMES`` names them)."""
        return self.raft_state

    def is_leader(self) -> bool:
        return self.raft_state == LEADER

    def leader(self):
        """The leader this node knows of (a pysyncobj node), or None."""
        return self.raft_leader

    def others(self) -> list:
        """The other voters (pysyncobj nodes)."""
        return list(self.other_nodes)

    def replication(self) -> tuple[dict, dict]:
        """A leader's match and next index per follower (empty on a follower)."""
        if self.raft_state != LEADER:
            return {}, {}
        return dict(self.match_indexes), dict(self.next_indexes)

    def appends_sent(self) -> dict[str, int]:
        """Appends sent to the followers in each form, binary or pickled (``engine.raft.wire``)."""
        return dict(self.transport.appends_sent)

    def applying_index(self) -> int:
        """Inside ``apply_entry``: the log index of the entry being applied
        (pysyncobj counts an entry applied only once apply has returned)."""
        return self.last_applied + 1

    def compaction_pending(self) -> bool:
        """A compaction was asked for and its snapshot is not taken yet."""
        return self.compaction_forced

    # -- what the facade steers ----------------------------------------------

    def propose(self, entry: bytes, callback) -> None:
        """Put ``entry`` in the log (``command_of``): at once in the steady state (item 17), else
        queued for the next tick; ``callback(result, fail_reason)`` runs once it is committed and
        applied (or refused)."""
        command = self.command_of(entry)
        if not self._append_at_once(command, callback):
            self._applyCommand(command, callback)

    def _append_at_once(self, command: bytes, callback) -> bool:
        """Item 17: append ``command``, send it to the followers that hold everything before it
        and sync, in this turn of the loop, if this node leads the proposal's term in the steady
        state; whether it did. pysyncobj would wait for the next tick to take the command off its
        queue. A follower that is behind, or is being sent a snapshot (its next index is then
        below the log's), is left to the tick's sends and their catch-up; so is the whole
        proposal when fewer than a majority hold everything, or while commands wait in the queue
        (they go first) or a membership change is not applied yet."""
        ticket = callback.__self__
        others = self.other_nodes
        log = self._journal
        if (not others or not self.leads(ticket.term) or self.commands_queue.waiting
                or self.membership_at > self.last_applied):
            return False
        last, last_term = log.index_and_term(-1)
        index = last + 1
        next_indexes, connected = self.next_indexes, self.connected_nodes
        # a next index is only a guess until the follower has answered this leader (match above 0)
        match = self.match_indexes
        holding = [node for node in others
                   if node in connected and next_indexes[node] == index and match[node] > 0]
        if len(holding) + 1 <= (len(others) + 1) / 2:
            return False
        transport = self.transport
        with log.deferred():    # the leader syncs as its followers write: it counts itself after
            try:
                log.add(command, index, ticket.term)
            except InsufficientStorage:
                return False    # the tick refuses it (item 14)
            self.waiting_commit[index].append((ticket.term, callback))
            now = monotonic()
            self._end_quiet(now)
            entries, commit = [(command, index, ticket.term)], self.commit_index
            for node in holding:
                transport.send_append(node, ticket.term, last, last_term, commit, entries, now)
                next_indexes[node] = index + 1
        return True

    def command_of(self, entry: bytes, *, plain: bool | None = None) -> bytes:
        """The log command that proposes ``entry`` (pysyncobj puts the command's type first):
        plain once every node applies that form (item 19), else a pickled call of
        ``_raftq_apply``; `plain` asks for one form. A replica that holds only the entry (carried
        by its snapshot) gives a copy in its own form, and the record it repairs may hold the
        other (``engine.raft.consensus``)."""
        if self.plain_entries if plain is None else plain:
            return PLAIN_BYTE + entry
        return REGULAR_BYTE + pickle.dumps((self.apply_func_id, (entry,)), protocol=5)

    def allow_plain_entries(self, allowed: bool) -> None:
        """Whether every node runs a release that applies a plain entry (item 19)."""
        self.plain_entries = allowed

    def may_vote(self) -> bool:
        """False while this node's log lacks entries it gave up to damage (item 15)."""
        return self._journal.regain_index is None

    def replace_snapshot(self) -> None:
        """Write a new snapshot at the next tick, even if nothing was applied since the last one
        (pysyncobj writes none then): the last one's file is damaged (in a tick)."""
        self.last_serialized_entry = None
        self.compaction_forced = True

    def decline_leadership(self) -> None:
        """From now on ignore a leader's request to take over (``timeout_now``):
        a node shutting down must not lead again, and a leader balancing its
        groups may ask it before it has gone (in a tick)."""
        self.declines_leadership = True

    def hold_back(self, seconds: float) -> None:
        """Stand for no election for ``seconds`` (in a tick)."""
        self.election_deadline = monotonic() + seconds

    def step_down(self, hold_back_s: float) -> None:
        """Stop leading, and stand for no election for ``hold_back_s``:
        without that, this node would win the next election itself (in a tick)."""
        if self.raft_state != LEADER:
            return
        self.set_state(FOLLOWER)
        self.raft_leader = None
        self.hold_back(hold_back_s)

    def run_on(self, loop) -> None:
        """Tick on `loop` from now on (engine.raft.ticking); the first tick loads
        the snapshot and replays the log."""
        self._ticker = LoopTicker(loop, self.tick, self.until_due, self.read)
        self._poller.watch(loop, self._ticker.ready)
        self._ticker.soon()

    def late_ticks(self) -> LateTicks:
        return self._ticker.late if self._ticker is not None else LateTicks()

    def tick(self) -> bool:
        """One tick; whether its last poll read something the next tick must act on."""
        self._onTick(0.0)
        return self._poller.news

    def read(self) -> bool:
        """Read what the sockets hold and act on it without a tick (item 17): a follower writes,
        syncs and answers the appends, a leader counts the answers, commits and applies. Whether
        a tick must follow: the read brought news (anything but those), or nothing was read
        before the first tick loaded the snapshot, or the transport is not ready."""
        if self.snapshot_to_load or not self.transport.ready:
            return True
        self._acks_apply_until = None
        with self._answering():
            self._poller.poll(0)
        # What the appends committed is applied here, after their answers went out, in one
        # slice of APPLY_BUDGET_S: a tick only for this would cost a follower more than the
        # apply itself, once per put. A backlog beyond the slice is left to the ticks.
        if self.raft_state != LEADER and self.apply_waits_for is None:
            self.apply_log_entries()
        return self._poller.news

    def until_due(self) -> float:
        """Seconds until the next tick must run if nothing wakes the node sooner."""
        return self._until_due(QUIET_POLL_S if self._quiet() else MAX_POLL_S)

    def _quiet(self) -> bool:
        # no connection to retry, no ticket to time out: a follower that hears its leader and
        # every peer, or a quiet leader (every voter connected, nothing proposed)
        state = self.raft_state
        if state == LEADER:
            return self.is_quiet()
        return (state == FOLLOWER and self.raft_leader is not None
                and self.other_nodes <= self.connected_nodes)

    def wake(self) -> None:
        """Tick at the loop's next turn."""
        if self._ticker is not None:
            self._ticker.soon()

    def stop(self) -> None:
        """Tick no more, close the connections and the journal, and stop a snapshot writer."""
        if self._ticker is not None:
            self._ticker.stop()
        self._poller.unwatch()
        self.destroy()
        self.snapshots.abandon()

    @property
    def encryptor(self):
        # pysyncobj's transport encrypts with whatever this returns (Fernet
        # when conf.password is set); raftq's Sealer is AES-GCM (see sealer.py).
        return self._sealer

    def leads(self, term: int) -> bool:
        return self.raft_state == LEADER and self.raftCurrentTerm == term

    # -- confirmed leader reads (item 10) ------------------------------------

    def confirm_read(self, ticket: Ticket, asked_at: float) -> None:
        """Resolve ``ticket`` once a read that arrived at ``asked_at`` may be
        answered from this leader's state (``engine.raft.read_index``)."""
        if not self.leads(ticket.term):
            ticket.resolve(None, "not_leader")
            return
        self.reads.ask(asked_at, self.commit_index, ticket)
        self._resolve_reads()

    def _resolve_reads(self) -> None:
        if self.raft_state != LEADER:
            return    # reads pending from a lost lead are answered by their tickets' end
        voters = len(self.other_nodes) + 1
        for ticket in self.reads.confirmed(voters, self.last_applied):
            ticket.resolve(None, None)
        if self.reads.wants_round(voters):
            self.send_append_entries()

    def send_append_entries(self):
        # pysyncobj's, less its chunked path (raftq's entries stay below the batch size: never
        # taken), sending only entries whose records verify (item 16): a follower whose next entry
        # this leader cannot read is sent what precedes it, then heartbeats, until the record is
        # repaired from another replica (pysyncobj indexed the empty batch and the tick failed,
        # with the heartbeats of every follower after it).
        started = monotonic()
        conf = self.conf
        promise = self._plan_heartbeats(started)
        transport, next_indexes = self.transport, self.next_indexes
        for node in self.other_nodes | self.readonly_nodes:
            if node not in self.connected_nodes:
                self.snapshot_serializer.cancelTransmisstion(node)
                continue
            send_single, sending_snapshot = True, False
            next_index = next_indexes[node]
            while next_index <= self.last_log_index() or send_single or sending_snapshot:
                term, commit, quiet_s = self.raftCurrentTerm, self.commit_index, promise or None
                blocked = shipping = False
                if next_index > self._journal.index_and_term(0)[0]:
                    prev_index, prev_term = self.prev_log_index_term(next_index)
                    entries = []
                    if next_index <= self.last_log_index():
                        entries = self.get_entries(next_index, None, conf.appendEntriesBatchSizeBytes)
                        if entries:
                            next_indexes[node] = entries[-1][1] + 1
                        blocked = len(entries) == 0
                    transport.send_append(node, term, prev_index, prev_term, commit, entries, started, quiet_s)
                else:
                    shipping = True
                    shipped = self.snapshot_serializer.getTransmissionData(node)
                    message = {"type": "append_entries", "term": term, "commit_index": commit,
                               "serialized": shipped, "sent_at": started}
                    if quiet_s is not None:
                        message["quiet_s"] = quiet_s
                    transport.send(node, message)
                if node not in self.connected_nodes or blocked:
                    break
                if shipping:
                    sending_snapshot = shipped is not None and not shipped[2]
                    if shipped is not None and shipped[2]:    # its last chunk
                        next_indexes[node] = self._journal.index_and_term(1)[0] + 1
                next_index = next_indexes[node]
                send_single = False
                if monotonic() - started > conf.appendEntriesPeriod:
                    break
        self.reads.round_sent(started)

    # -- the log ------------------------------------------------------------
    # The journal holds few commands in memory (engine.storage.journal): what
    # asks only for an entry's index or term does not read its command.

    def get_entries(self, from_index, count=None, max_size_bytes=None):
        # pysyncobj's slices the whole tail of the log, then cuts it to max_size_bytes
        return self._journal.entries(from_index, count, max_size_bytes) if from_index is not None else []

    def prev_log_index_term(self, next_index):
        # pysyncobj's reads the entry before each append it sends, command and all, for its term
        log, prev = self._journal, next_index - 1
        first, last = log.index_and_term(0)[0], log.last_index()
        if not first <= prev <= last:
            return None, None
        return prev, log.index_and_term(prev - first)[1]

    def delete_entries_from(self, from_index):
        # pysyncobj's reads the first entry, command and all, for its index
        position = from_index - self._journal.index_and_term(0)[0]
        if position >= 0:
            self._journal.deleteEntriesFrom(position)

    def delete_entries_to(self, to_index):
        position = to_index - self._journal.index_and_term(0)[0]
        if position >= 0:
            self._journal.deleteEntriesTo(position)

    def last_log_index(self):
        return self._journal.index_and_term(-1)[0]

    def last_log_term(self):
        return self._journal.index_and_term(-1)[1]

    def on_become_leader(self):
        self.quorum_lost_at = None
        self._promise_nothing()
        for ticket in self.reads.begin_leading(monotonic()):
            ticket.resolve(None, "leader_changed")
        try:
            super().on_become_leader()
        except InsufficientStorage:
            # A leader commits nothing before its no-op; without room for it, another node may lead.
            logger.error("elected leader of term %d with no room on the disk for its first entry; stepping down",
                         self.raftCurrentTerm)
            self.step_down(hold_back_s=10 * self.conf.raftMaxTimeout)

    # -- snapshots ---------------------------------------------------------

    def try_log_compaction(self):
        # pysyncobj counts entries only; group commit makes entries large (a
        # batch put of 1 000 messages is one), so a node holding a million
        # messages may have a thousand entries and never compact: its restart
        # then replays everything. Bytes that a compaction would drop count
        # as well. (While a snapshot is being written pysyncobj only checks
        # on it, and must: its success drops the log prefix.)
        #
        # A snapshot that failed (a full disk, mostly) is not tried again at the
        # next tick, as pysyncobj would -- a fork and a failed write per tick --
        # but SNAPSHOT_RETRY_S later, unless one is asked for (force_snapshot).
        if not self.snapshots.busy():
            failed_at = self.snapshots.failed_at
            if (failed_at is not None and monotonic() - failed_at < SNAPSHOT_RETRY_S
                    and not self.compaction_forced):
                return
            if self.compactable_bytes() > self.compaction_min_bytes:
                self.compaction_forced = True
        super().try_log_compaction()

    def compactable_bytes(self) -> int:
        """Journal bytes before the last applied entry (a snapshot can only
        replace applied entries: counting the rest would snapshot again on
        every tick while a slow follower applies)."""
        log = self._journal
        if not len(log):
            return 0
        return log.bytes_before(max(0, self.last_applied - log.index_and_term(0)[0]))

    # -- apply ----------------------------------------------------------

    def apply_log_entries(self):
        # pysyncobj applies every committed entry before the tick goes on to
        # send heartbeats and read messages. A backlog (a restart replaying
        # its log, a follower catching up, a burst of large puts) then holds
        # the tick (and the loop) for as long as it takes: a leader's followers call
        # an election, a follower stops acknowledging. So a tick applies for
        # at most APPLY_BUDGET_S (and at least one entry); the next tick goes
        # on at once (_until_due). Committed entries are durable on a
        # majority already: nothing waits on apply but the answers to clients.
        #
        # pysyncobj would also answer "send AppendEntries now" after every
        # apply, only to tell the followers the new commit index: two more
        # messages and two more acknowledgements per lone write, on the
        # leader's CPU while it answers the client. Followers learn the
        # commit index with the next append or heartbeat instead
        # (appendEntriesPeriod), as in most Raft implementations.
        applied = self.last_applied
        committed = self.commit_index
        if committed <= applied:
            return False
        waiting = self.waiting_commit
        deadline = monotonic() + APPLY_BUDGET_S
        self.apply_waits_for = None
        try:
            for command, index, term in self._journal.iterate(applied + 1, committed - applied):
                subscribers = waiting.pop(index, ())
                result = self.do_apply_command(command)
                self.last_applied = index
                for subscribed_term, callback in subscribers:
                    if subscribed_term == term:
                        callback(result, FAIL_REASON.SUCCESS)
                    else:
                        callback(None, FAIL_REASON.DISCARDED)
                if monotonic() >= deadline:
                    break
        except DamagedRecord as damage:
            # item 16: the journal told the facade, which fetches an intact copy; the applies go on
            # from this entry once it is written back (wake)
            self.apply_waits_for = damage.index
        self._resolve_reads()
        return False

    def _commit_acknowledged(self) -> None:
        # pysyncobj advances the commit index at its next tick, after the
        # poll that read this acknowledgement has dispatched everything else
        # it returned; a lone write then waits for the other followers'
        # answers and a whole tick. Committing as the acknowledgement that
        # makes a majority arrives answers it sooner. The leader counts
        # itself: its appends are synced before its tick polls
        # (_checkCommandsToApply), and the sync here makes sure of it.
        # A lone voter (a group of one replica) is its own majority.
        others = self.other_nodes
        log = self._journal
        if others:
            match = self.match_indexes
            # the highest index held by a majority, this node's log among them
            held = sorted((match[node] for node in others), reverse=True)[(len(others) + 1) // 2 - 1]
        else:
            held = log.last_index()
        index = min(held, log.last_index())
        if index <= self.commit_index:
            return
        # Raft commits by counting only entries of the leader's own term;
        # terms never decrease along the log, so if this one is older, so
        # are all the entries before it.
        if log.index_and_term(index - log.index_and_term(0)[0])[1] != self.raftCurrentTerm:
            return
        log.sync()
        caught_up = self.last_applied == self.commit_index
        self.commit_index = self.leader_commit_index = index
        log.setRaftCommitIndex(index)
        # One read may bring many acknowledgements, each committing a little
        # more: between two ticks, these applies share one APPLY_BUDGET_S,
        # and a backlog is left to the tick's slices, between heartbeats.
        if caught_up:
            now = monotonic()
            if self._acks_apply_until is None:
                self._acks_apply_until = now + APPLY_BUDGET_S
            if now < self._acks_apply_until:
                self.apply_log_entries()

    # -- grouped fsyncs --------------------------------------------------

    def _onTick(self, timeToWait=0.0):
        self._acks_apply_until = None
        self.ticks += 1
        if self.raft_state == LEADER:
            self.leader_ticks += 1
        with self._answering():
            # pysyncobj polls at the end of its tick and acts on what it read in
            # the next one; a tick on the loop runs because a socket is ready, so
            # it reads first and acts on it now (after the first tick, which loads
            # the snapshot before anything is read: pysyncobj's order). A tick that
            # came late (a slow fsync, a busy machine) so reads its leader's
            # heartbeats before it judges the election deadline they extend.
            if not self.snapshot_to_load:
                self._poller.poll(0)
            # A follower answers the appends it just read before it applies what
            # they committed: the leader waits for the answer, not for the apply.
            if self._replies:
                self._flush_replies()
            self._check_quorum()
            if not self.may_vote():
                self._hold_off_election()
            self._ask_before_standing()
            super()._onTick(self._until_due(timeToWait))

    def _until_due(self, longest: float) -> float:
        # How long this tick may poll: until the next heartbeat (leader) or
        # election deadline (follower), not a fixed period. Messages, proposals
        # and tasks end the poll early through their sockets and the pipe.
        # Judged before the tick: a heartbeat or election due now goes out in it.
        if self.last_applied < self.commit_index and self.apply_waits_for is None:
            return 0.0     # committed entries wait to be applied
        now = monotonic()
        conf = self.conf
        if self.raft_state == LEADER:
            due = self.next_heartbeat_at
            due = due if due > now else now + conf.appendEntriesPeriod
        else:
            due = self.election_deadline
            due = due if due > now else now + conf.raftMinTimeout
        return min(max(due - now, MIN_POLL_S), longest)

    def _checkCommandsToApply(self):
        # A command the leader's journal has no room for is refused, and the
        # commands queued behind it are tried in turn (item 14).
        while True:
            try:
                super()._checkCommandsToApply()
                break
            except InsufficientStorage:
                self._refuse_unwritten()
        # The leader's appends were sent to followers as they were made;
        # sync them before this tick polls for acknowledgements, so the
        # leader's own copy is durable before the next tick counts it.
        self._journal.sync()
        # A lone voter hears no acknowledgement, and pysyncobj would commit
        # its entries at the next tick: a heartbeat away (90 ms) on the loop.
        if self.raft_state == LEADER and not self.other_nodes:
            self._commit_acknowledged()

    # -- a leader that hears from no majority (CheckQuorum) -------------------

    def _refuse_unwritten(self) -> None:
        """The command taken last found no room in the journal, which is as it was: pysyncobj
        raised before it could note the command as waiting for its commit, or send it. Undo the
        membership change it carried (pysyncobj makes it before the append) and refuse it."""
        command, callback = self.taken
        self.taken = None
        change = self.parse_change_cluster_request(command) \
            if self.conf.dynamicMembershipChange else None
        if change is not None:
            self.do_change_cluster(change, reverse=True)
        ticket = getattr(callback, "__self__", None)
        if isinstance(ticket, Ticket):
            ticket.resolve(None, INSUFFICIENT_STORAGE)
        elif callable(callback):
            callback(None, FAIL_REASON.REQUEST_DENIED)

    def _hold_off_election(self) -> None:
        """Stand for no election now (item 15): the deadline moves on when it passes."""
        now = monotonic()
        self._may_stand = False
        if self.election_deadline < now:
            self.election_deadline = now + self.election_timeout()

    def _heard_by_majority(self) -> bool:
        """Whether a majority (this leader counting itself) answered its appends
        within the longest election timeout: after that long without them, the
        others may have elected another leader."""
        others = self.other_nodes
        since = monotonic() - self.conf.raftMaxTimeout - self.contact_slack()
        answered = self.last_answered_at
        return sum(1 for node in others if answered.get(node, 0.0) > since) + 1 > (len(others) + 1) / 2

    def _check_quorum(self) -> None:
        if self.raft_state != LEADER or not self.other_nodes or self._heard_by_majority():
            return
        # A late tick (a long apply, a busy machine) reads the answers waiting
        # in its sockets before it concludes that nobody answered.
        if self.transport.ready:
            self._poller.poll(0)
        if self.raft_state != LEADER or self._heard_by_majority():
            return
        now = monotonic()
        self.set_state(FOLLOWER)
        self.raft_leader = None
        self.election_deadline = now + self.election_timeout()
        self.quorum_lost_at = now
        self.quorum_step_downs += 1
        logger.warning("stepping down as leader of term %d: no majority answered for %.2f s (CheckQuorum)",
                       self.raftCurrentTerm, self.conf.raftMaxTimeout)

    # -- a leader that goes away ----------------------------------------------

    def on_node_disconnected(self, node):
        super().on_node_disconnected(node)
        if self.raft_state == FOLLOWER and node == self.raft_leader:
            voters = sorted(n.id for n in self.other_nodes if n != node)
            rank = sum(1 for voter in voters if voter < self.selfNode.id)
            soon = monotonic() + rank * LOST_LEADER_STAGGER_S + LOST_LEADER_JITTER_S * random.random()
            if soon < self.election_deadline:
                self.election_deadline = soon

    # -- messages ----------------------------------------------------------

    def on_message_received(self, node, message):
        now = monotonic()
        silent_for = now - self.last_heard.get(node.id, 0.0)
        self.last_heard[node.id] = now
        before = (self.raft_state, self.raftCurrentTerm, self.raft_leader)
        try:
            if message["type"] == "next_node_idx":
                self._on_answer(node, message, now)
            elif message["type"] == PRE_VOTE:
                self._on_pre_vote(node, message)
            elif message["type"] == PRE_VOTE_ANSWER:
                self._on_pre_vote_answer(node, message)
            elif message["type"] == FETCH_ENTRY:
                self._on_fetch_entry(node, message)
            elif message["type"] == ENTRY_COPY:
                self._on_entry_copy(node, message)
            elif message["type"] == "append_entries" and message["term"] >= self.raftCurrentTerm:
                self.quorum_lost_at = None     # following a leader: no longer cut off
                self._on_append_entries(node, message)
            elif message["type"] == "append_entries":
                self._refuse_older_term(node)
            elif message["type"] == "timeout_now" and (self.declines_leadership or not self.may_vote()):
                pass
            elif message["type"] == "request_vote" and not self.may_vote():
                pass     # no answer: this node's log lacks entries it may have acknowledged (item 15)
            else:
                super().on_message_received(node, message)
            after = (self.raft_state, self.raftCurrentTerm, self.raft_leader)
            self._poller.heard(message["type"] in ROUTINE[before[0]] and after == before
                               and silent_for < self._heard_within + self.contact_slack())
        except Exception:
            kind = message.get("type") if isinstance(message, dict) else type(message).__name__
            logger.critical("failed to handle a %r message from %s", kind, node, exc_info=True)

    def _on_answer(self, node, message, now: float) -> None:
        """A follower's answer to this leader's append, counted as it arrives: pysyncobj's
        bookkeeping of it (next and match index, when it answered), then the commit it may
        complete and the reads it confirms. pysyncobj read every answer, whatever its term; one
        of an earlier term of this node's (a slow link delivers it after a new election) tells
        what the follower held of that term's log, and counting it could commit an entry of this
        term the follower never had (Raft, section 5.1): it is dropped. One of a newer term
        (``_refuse_older_term``) makes this leader step down to it. An older release's pickled
        answer carries no term, and is counted as pysyncobj counted it."""
        if self.raft_state != LEADER:
            return
        term = message.get("term")
        if term is not None and term < self.raftCurrentTerm:
            return
        if term is not None and term > self.raftCurrentTerm:
            self._step_down_to(term, node)
            return
        next_index, success = message["next_node_idx"], message["success"]
        next_indexes = self.next_indexes
        if message["reset"]:
            next_indexes[node] = next_index
        if success:
            match = self.match_indexes
            if match[node] < next_index - 1:
                match[node] = next_index - 1
                next_indexes[node] = next_index
        self.last_answered_at[node] = now
        self.reads.answered(node, message.get("sent_at"))
        if success:
            self._commit_acknowledged()
        else:
            self.appends_refused += 1
        self._resolve_reads()

    def _refuse_older_term(self, node) -> None:
        """An append of a term older than this node's is refused with this node's term (Raft,
        section 5.1), changing nothing here. pysyncobj sent nothing back, and a node whose term
        had run ahead of its group's stayed out of it for good: a follower cut off just as it
        won a pre-vote stands alone in a new term (a chaos run, isolate-leader, 2026-12-04),
        then ignores the leader's appends of the old term while the others, hearing that leader,
        refuse it every pre-vote. The answer makes the leader step down to the newer term, and
        the next election brings the node back."""
        self.transport.send_answer(node, self.raftCurrentTerm, self.last_log_index() + 1, False, False, None)

    def _step_down_to(self, term: int, node) -> None:
        """A follower answered from a newer term than this leader's: follow it, as Raft has it."""
        logger.warning("stepping down as leader of term %d: %s answered from term %d",
                       self.raftCurrentTerm, node, term)
        self.set_current_term(term, None)
        self.set_state(FOLLOWER)
        self.raft_leader = None
        self.election_deadline = monotonic() + self.election_timeout()
