"""PreVote (Raft thesis §9.6): a node asks whether it could win before it stands.

pysyncobj 0.3.17 starts an election -- a new term, made durable and sent to
every peer -- whenever a node's election timeout runs out. Two kinds of node
then cost a healthy cluster an election for nothing:

- one cut off from all the others (a partition, a paused machine) stands again
  at every timeout, its term climbing; once it can reach them again, that
  higher term deposes the leader;
- one that can reach a follower but not the leader is elected with that
  follower's vote, although the leader is alive.

So here a node whose election timeout runs out first asks its peers whether
they would vote for it in the next term, changing no term of its own or
theirs. A peer says yes only if

- that term would be new to it,
- the asker's log is at least as up to date as its own (the vote's rule),
- it has no live leader: none heard within the shortest election timeout,
  or the leader's connection has closed (a killed leader is replaced at
  once: engine.raft.node, item 9), and
- it may vote at all (``may_vote``: not while it lacks entries it gave up to
  damage, engine.raft.node, item 15).

With a majority of yeses, its own counted, the node stands as pysyncobj does.
A no that carries a newer term teaches the asker that term. A leadership
transfer stands at once: the leader asked for it.

In a rolling upgrade from a release without PreVote, the older nodes do not
answer pre-votes; a node of the newer release can then lead only once a
majority runs it, while the older ones still elect among themselves.

``PreVote`` is mixed into ``engine.raft.node.RaftNode``, which calls
``_ask_before_standing`` before each tick and hands it the two messages.
"""

from __future__ import annotations

from . import pysyncobj_pin  # noqa: F401  -- the release these overrides were written for
from pysyncobj.syncobj import _RAFT_STATE

from .internals import monotonic

PRE_VOTE = "pre_vote"
PRE_VOTE_ANSWER = "pre_vote_response"


class PreVote:
    """Asks for a majority's yes before pysyncobj's election, and answers others' asks."""

    def __init__(self, *args, **kwargs):
        self._asking_for: int | None = None    # the term this node is asking about
        self._yeses: set = set()
        self._may_stand = False                # a majority said yes: the next tick stands
        # For operators: a node that keeps asking and never wins is cut off
        # from its leader while the others still hear it.
        self.pre_votes_asked = 0
        self.pre_votes_won = 0
        super().__init__(*args, **kwargs)

    def _ask_before_standing(self) -> None:
        """Turns an election that is due in this tick into a pre-vote, unless
        one was won: then pysyncobj's election goes ahead."""
        if self._may_stand:
            self._may_stand = False
            return
        if (self.raft_state == _RAFT_STATE.LEADER or self.selfNode is None
                or self.transfer_in_progress or not self.other_nodes):
            return
        now = monotonic()
        if self.election_deadline >= now or not self.connected_nodes:
            return
        self.election_deadline = now + self.election_timeout()
        self._asking_for = self.raftCurrentTerm + 1
        self._yeses = set()
        self.pre_votes_asked += 1
        ask = {"type": PRE_VOTE, "term": self._asking_for,
               "last_log_index": self.last_log_index(),
               "last_log_term": self.last_log_term()}
        transport = self.transport
        for node in self.other_nodes:
            transport.send(node, ask)

    def _has_live_leader(self) -> bool:
        leader = self.raft_leader
        return (leader is not None and self.isNodeConnected(leader)
                and monotonic() - self.leader_contact < self.conf.raftMinTimeout + self.contact_slack())

    def _on_pre_vote(self, node, message) -> None:
        term = self.raftCurrentTerm
        mine = (self.last_log_term(), self.last_log_index())
        yes = (message["term"] > term
               and self.may_vote()
               and self.raft_state != _RAFT_STATE.LEADER
               and not self._has_live_leader()
               and (message["last_log_term"], message["last_log_index"]) >= mine)
        self.transport.send(node, {"type": PRE_VOTE_ANSWER, "term": message["term"],
                                             "current_term": term, "granted": yes})

    def _on_pre_vote_answer(self, node, message) -> None:
        if self.raft_state == _RAFT_STATE.LEADER:
            return
        if message["current_term"] > self.raftCurrentTerm:
            self.set_current_term(message["current_term"], None)
            self.set_state(_RAFT_STATE.FOLLOWER)
            self.raft_leader = None
            self._asking_for = None
            return
        if (not message["granted"] or message["term"] != self._asking_for
                or self._asking_for != self.raftCurrentTerm + 1):
            return
        self._yeses.add(node)
        if len(self._yeses) + 1 > (len(self.other_nodes) + 1) / 2 and not self._has_live_leader():
            self._asking_for = None
            self._may_stand = True
            self.pre_votes_won += 1
            self.election_deadline = 0.0
