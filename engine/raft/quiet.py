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
"""

from __future__ import annotations

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
