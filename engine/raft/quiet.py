"""Quiet groups: an idle Raft group's leader heartbeats once a second, not eleven times.

A heartbeat every ``appendEntriesPeriod`` (0.09 s) is what lets a follower
call an election 0.3-0.6 s after its leader went silent. Most of a cluster's
groups are idle most of the time, and each paid it: on the 2-core machine
an idle 3-node cluster spent most of its CPU reading, sealing and answering
heartbeats, every group alike (docs/benchmarks.md). Ra's idle groups send
nothing and leave failure detection to the node; raftq keeps Raft's own
timers and stretches them while a group has nothing to say:

- A leader is *steady* while it has nothing to replicate -- every voter
  connected and holding its whole log, all of it committed and applied, no
  proposal, read or membership change under way. After ``QUIET_AFTER_S``
  steady, its heartbeats carry a promise, ``quiet_s`` (``QUIET_HEARTBEAT_S``):
  the next message comes within that long. It then sends them that far apart.
- A follower that takes an append with a promise waits that much longer
  before it stands (its election deadline), refuses pre-votes that much
  longer (a live leader), and counts its leader heard that much longer.
  An append without one ends it: the usual timeout holds again.
- The leader counts its followers heard (CheckQuorum, the write lease) that
  much longer while a promise it sent may still be waited on, and sends the
  next heartbeat within the usual period as soon as anything is sent without
  one: the first proposal, read round or catch-up ends the quiet at once.
- A leader goes quiet only while every voter's connection announced the quiet
  wire (``engine.raft.wire.QUIET_WIRE``): a follower of an older release
  would not know to wait, and would call an election.

What it costs: a leader silenced while its group was quiet (a partition, a
paused process) is replaced ``QUIET_HEARTBEAT_S`` later than in a busy group.
A leader's process that dies closes its connections, and its followers stand
at once as before (``engine.raft.node``, item 9).

``QuietLeader`` is the leader's side, mixed into ``engine.raft.node.RaftNode``
(which stamps each append it sends and ends the quiet for one without the
promise); the follower's is ``engine.raft.follower.FollowerSide``.
"""

from __future__ import annotations

from pysyncobj.syncobj import _RAFT_STATE

from .internals import monotonic

LEADER = _RAFT_STATE.LEADER

# How long a leader stays steady before its heartbeats go quiet.
QUIET_AFTER_S = 2.0
# The gap between a quiet leader's heartbeats, and the promise each carries.
QUIET_HEARTBEAT_S = 1.0
# The longest promise a follower takes: anything else in ``quiet_s`` is no promise.
MAX_QUIET_S = 5.0


def promised_gap(message: dict) -> float:
    """The seconds an append promises its leader's next message within, beyond the usual
    heartbeat (0.0: no promise, or one that is malformed or too long)."""
    gap = message.get("quiet_s", 0.0)
    return gap if type(gap) is float and 0.0 < gap <= MAX_QUIET_S else 0.0


class QuietLeader:
    """A leader's heartbeats: every ``appendEntriesPeriod``, or once a ``QUIET_HEARTBEAT_S``
    with a promise while the group is steady; and how long either side counts the other heard."""

    def __init__(self, *args, **kwargs):
        # a follower's leader's promise (the last append's), and a leader's: the gap its appends
        # sent last promised (0.0: the usual period), when it last sent one, and since when (and
        # at which last index) it has had nothing to replicate
        self.leader_quiet_s = 0.0
        self._promise_nothing()
        self._steady_since = 0.0
        super().__init__(*args, **kwargs)

    def _promise_nothing(self) -> None:
        self._promised_s, self._quiet_sent_at, self._steady_index = 0.0, float("-inf"), None

    def _plan_heartbeats(self, now: float) -> float:
        """When this leader, sending its appends ``now``, sends the next: the promise they carry
        (0.0: none, the usual period)."""
        if self._steady(now):
            self._promised_s, self._quiet_sent_at = QUIET_HEARTBEAT_S, now
            self.next_heartbeat_at = now + QUIET_HEARTBEAT_S
            return QUIET_HEARTBEAT_S
        self._end_quiet(now)
        self.next_heartbeat_at = now + self.conf.appendEntriesPeriod
        return 0.0

    def _steady(self, now: float) -> bool:
        """Whether this leader has had nothing to replicate for QUIET_AFTER_S: every voter
        connected, announcing the quiet wire and holding the whole log, all of it committed and
        applied, nothing queued, no read waiting and no membership change unapplied."""
        last = self.last_log_index()
        others, match = self.other_nodes, self.match_indexes
        transport = self.transport
        steady = (self.raft_state == LEADER and bool(others) and not self.readonly_nodes
                  and self.commit_index == last == self.last_applied
                  and not self.commands_queue.waiting and not self.reads.waiting()
                  and self.membership_at <= last and self.apply_waits_for is None
                  and all(match.get(node) == last and transport.hears_quiet(node) for node in others))
        if not steady or last != self._steady_index:
            self._steady_index = last if steady else None
            self._steady_since = now
            return False
        return now - self._steady_since >= QUIET_AFTER_S

    def _end_quiet(self, now: float) -> None:
        """Something went out without the quiet promise: the followers wait the usual timeout
        again, so the next heartbeat goes out within the usual period."""
        if not self._promised_s:
            return
        self._promised_s = 0.0
        self._steady_index = None
        period = self.conf.appendEntriesPeriod
        if self.next_heartbeat_at > now + period:
            self.next_heartbeat_at = now + period
            if self._ticker is not None:
                self._ticker.due_within(period)

    def contact_slack(self) -> float:
        """How much longer than usual a peer may go unheard while the group is quiet: a leader's
        heartbeats then come QUIET_HEARTBEAT_S apart, and so do its followers' answers."""
        if self.raft_state == LEADER:
            recent = monotonic() - self._quiet_sent_at < QUIET_HEARTBEAT_S + self.conf.raftMaxTimeout
            return QUIET_HEARTBEAT_S if recent else 0.0
        return self.leader_quiet_s

    def is_quiet(self) -> bool:
        """A leader whose heartbeats go quiet (item 18)."""
        return self.raft_state == LEADER and self._promised_s > 0.0
