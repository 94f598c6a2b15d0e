"""A follower's side of replication, as raftq handles it in place of pysyncobj.

pysyncobj 0.3.17's follower truncated its log after every overlapping,
shorter AppendEntries, dropping entries it had acknowledged, and loaded every
snapshot a leader sent it over its log (docs/guarantees.md, "What pysyncobj
0.3.17 lacks"). Here a follower:

- deletes entries only on a real conflict (same index, different term),
  appends only the entries it lacks, acknowledges the last index of the
  *leader's* message (not its own last index), and advances its commit index
  only up to entries verified against the leader;
- loads a leader's snapshot only over a log that lacks the snapshot's last
  entry (``_install_snapshot``);
- with no room on its disk for all the entries it is sent, acknowledges
  those it wrote, and takes the others when the leader sends them again
  (at its next append), never failing or acknowledging more;
- queues its acknowledgements while it appends, and sends them only after
  the fsync that makes them true: right after the poll that read the
  appends, before it applies what they committed (``engine.raft.node``),
  and at the end of the tick for what its last poll read;
  anything that could make a queued acknowledgement untrue (truncation,
  clear, a new term) first flushes the queue (``_flush_replies``);
- echoes the ``sent_at`` of the append it answers, which confirms the
  leader's reads (``engine.raft.read_index``).

``FollowerSide`` is mixed into ``engine.raft.node.RaftNode``; like it, it
reads and writes pysyncobj's state by the names ``engine.raft.internals`` gives it.
"""

from __future__ import annotations

import contextlib
import logging

from . import pysyncobj_pin  # noqa: F401  -- the release these overrides were written for
from pysyncobj.syncobj import _RAFT_STATE

from ..storage import snapshot_file
from ..storage.damage import DamagedRecord
from .internals import monotonic
from .quiet import promised_gap
from ..storage.records import InsufficientStorage

logger = logging.getLogger(__name__)


class FollowerSide:
    """AppendEntries and snapshots received, and the acknowledgements they earn."""

    def __init__(self, *args, **kwargs):
        self._replies: list[tuple[object, dict]] = []
        self._answering_sent_at = None   # of the append whose answers are being queued
        super().__init__(*args, **kwargs)

    @contextlib.contextmanager
    def _answering(self):
        """The appends written inside share one sync, at its end; the answers they earned go out
        after it (a tick's, a read's)."""
        with self._journal.deferred():
            yield
        self._send_replies()

    def _flush_replies(self) -> None:
        self._journal.sync()
        self._send_replies()

    def _send_replies(self) -> None:
        replies, self._replies = self._replies, []
        transport = self.transport
        for reply in replies:
            transport.send_answer(*reply)

    def _reply(self, node, next_idx: int, success: bool, reset: bool) -> None:
        # the term is what the binary answer's header carries (engine.raft.binary_wire); pysyncobj
        # reads none; the append's sent_at, sent back, confirms the leader's reads (engine.raft.read_index)
        reply = (node, self.raftCurrentTerm, next_idx, success, reset, self._answering_sent_at)
        self._replies.append(reply)


    def _on_append_entries(self, node, message):
        # pysyncobj 0.3.17's prologue: follow this leader and its term
        term = message["term"]
        if term > self.raftCurrentTerm:
            self.transfer_in_progress = False
        # a quiet leader's next message may come this much later than a heartbeat (engine.raft.quiet)
        self.leader_quiet_s = promised_gap(message)
        if not self.transfer_in_progress:
            self.election_deadline = (monotonic() + self.leader_quiet_s
                                                   + self.election_timeout())
        if self.raft_leader != node:
            self.on_leader_changed()
        self.raft_leader = node
        if term > self.raftCurrentTerm:
            self.set_current_term(term, None)
        self.set_state(_RAFT_STATE.FOLLOWER)
        leader_commit = self.leader_commit_index = message["commit_index"]
        self.leader_contact = monotonic()
        self._answering_sent_at = message.get("sent_at")

        verified = None  # last index known to equal the leader's log
        if "transmission" in message:
            # raftq leaders never send it: entries stay below the batch size
            logger.critical("ignoring a chunked append_entries from %s (entry above the batch size)", node)
        elif "prevLogIdx" in message:
            verified = self._match_entries(node, message["prevLogIdx"], message["prevLogTerm"],
                                           message.get("entries", []))
        elif message.get("serialized") is not None:
            if self.snapshots.setTransmissionData(message["serialized"]):
                verified = self._install_snapshot(node)

        if verified is not None and leader_commit > self.commit_index:
            commit = min(leader_commit, verified)
            if commit > self.commit_index:
                self.commit_index = commit
                self._journal.setRaftCommitIndex(commit)

    def _install_snapshot(self, node) -> int | None:
        """A leader's snapshot has arrived whole (``snapshots.incoming``): the
        last index now known to equal the leader's log, or None.

        A leader sends its snapshot again at every heartbeat until it hears
        back, so over a slow link several may arrive after this node has
        taken the first and appended entries beyond it. pysyncobj loaded
        each one over the log, erasing entries this node had acknowledged
        (a chaos round with an 800 ms link saw a follower's log shrink below
        its commit index a dozen times). As Raft has it (Figure 13, step 6),
        a snapshot whose last entry this node holds -- or has compacted
        into its own snapshot, which holds only committed entries -- leaves
        the log as it is.
        """
        snapshots = self.snapshots
        try:
            index, term = snapshot_file.last_entry(snapshots.incoming)
            log = self._journal
            first, last = log.index_and_term(0)[0], log.last_index()
            if index < first or (index <= last and log.index_and_term(index - first)[1] == term):
                snapshots.drop_incoming()
                self._reply(node, index + 1, success=True, reset=False)
                return index
            # Checked whole before it replaces this node's own snapshot: a
            # damaged one would fail to load only once it had (pysyncobj
            # swallows the error), and the node could not restart from it.
            # It must carry every live entry: loading it drops the journal.
            snapshot_file.check(snapshots.incoming, self_contained=True)
        except (OSError, ValueError):
            logger.error("a damaged snapshot arrived from %s; dropped (the leader sends it again)", node,
                         exc_info=True)
            snapshots.drop_incoming()
            return None
        # A snapshot of this node's own still being written would be renamed
        # over the leader's, naming journal entries the load below drops.
        snapshots.abandon()
        snapshots.take_incoming()
        self.loaded_snapshot = None
        self.load_dump_file(clear_journal=True)
        loaded = self.loaded_snapshot
        # pysyncobj logs and swallows a failed load; acknowledging then
        # would vouch for the old log. Without a reply the leader finds the
        # gap and sends the snapshot again.
        if loaded is None or self._journal[-1] != loaded:
            return None
        self._reply(node, loaded[1] + 1, success=True, reset=False)
        return loaded[1]

    def _match_entries(self, node, prev_idx: int, prev_term: int, entries: list) -> int | None:
        log = self._journal
        first, last = log.index_and_term(0)[0], log.last_index()
        if not first <= prev_idx <= last:
            self._reply(node, last + 1, success=False, reset=True)
            return None
        base = prev_idx - first
        if log.index_and_term(base)[1] != prev_term:
            self._reply(node, prev_idx, success=False, reset=True)
            return None
        have = len(log) - base - 1
        same = 0
        while same < len(entries) and same < have and log.index_and_term(base + 1 + same)[1] == entries[same][2]:
            same += 1
        if same < len(entries) and same < have:
            self._truncate_conflict(base + 1 + same)
        added = []
        try:
            for entry in entries[same:]:
                log.add(*entry)
                added.append(entry)
        except InsufficientStorage:
            pass     # the journal said so once; the leader sends the rest again
        if self.conf.dynamicMembershipChange:
            for entry in added:
                change = self.parse_change_cluster_request(entry[0])
                if change is not None:
                    self.do_change_cluster(change)
        # what this node holds of the leader's log: with no room for all of it, less than it was sent
        matched = prev_idx + same + len(added)
        self._reply(node, matched + 1, success=True, reset=False)
        return matched

    def _truncate_conflict(self, position: int) -> None:
        log = self._journal
        if self.conf.dynamicMembershipChange:
            for cut in reversed(range(position, len(log))):
                try:
                    command = log[cut][0]
                except DamagedRecord as damage:
                    # cut anyway: no replica may hold it in its term, and the leader's entry replaces it
                    logger.error("%s; cut in a conflict without reading whether it changed the membership", damage)
                    continue
                change = self.parse_change_cluster_request(command)
                if change is not None:
                    self.do_change_cluster(change, reverse=True)
        first_dropped = log.index_and_term(position)[0]
        if first_dropped <= self.last_applied:
            logger.critical("conflict truncates applied entries from index %d (last applied %d)",
                            first_dropped, self.last_applied)
        log.deleteEntriesFrom(position)
