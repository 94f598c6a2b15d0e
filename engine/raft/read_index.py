"""Leader reads confirmed by the followers' answers (Raft's ReadIndex).

A leader that answers a read from its own state must still lead when the read
arrives: a newer leader elected meanwhile may already have acknowledged
writes this one never saw. A lease (no new leader before the lease's end)
says so only while every node keeps it, and pysyncobj's voters grant any
vote, so raftq confirms each read instead (the Raft thesis, 6.4):

1. The read arrives at ``asked_at``; the leader's commit index then is its
   *read index*. Every write acknowledged before the read is at or below it.
2. The leader sends a round of appends at once, each stamped with the time it
   was sent (``sent_at``), which followers echo in their answers.
3. A follower answers an append only in the leader's own term (pysyncobj
   ignores appends of a lower term). So an answer to an append sent at or
   after ``asked_at`` shows that the follower had not moved to a newer term
   by then. Once a majority (counting the leader) has so answered, no newer
   leader can have been elected before ``asked_at``: its majority and this
   one would share a node.
4. The read is answered once the leader has applied up to its read index.

Reads waiting together share rounds, and one round at a time is out for
them: reads that arrive while a round is unanswered wait for it, then one
more round covers them all (rounds the leader sends anyway, heartbeats and
new entries, count as well). So a crowd of readers costs a round per round
trip, not one per read. This module keeps the bookkeeping; ``engine.raft.node``
stamps the appends, feeds it the answers, sends the rounds it asks for and
resolves what it hands back, in its ticks.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable


class ReadConfirmations:
    """Pending leader reads of one leadership, and the followers' answers."""

    def __init__(self) -> None:
        self._leading_since = float("inf")
        self._answered: dict[Hashable, float] = {}   # follower -> latest sent_at it answered
        # (asked_at, read index, ticket): a ticket has a ``done`` flag
        self._pending: deque[tuple[float, int, object]] = deque()
        self._last_round_at = float("-inf")

    def begin_leading(self, now: float) -> list:
        """A new leadership: answers to older appends count for nothing; the
        reads still pending belonged to another term and are handed back."""
        self._leading_since = now
        self._answered.clear()
        self._last_round_at = float("-inf")
        dropped = [ticket for _, _, ticket in self._pending]
        self._pending.clear()
        return dropped

    def ask(self, asked_at: float, read_index: int, ticket) -> None:
        self._pending.append((asked_at, read_index, ticket))

    def waiting(self) -> bool:
        """Whether a read waits for its confirmation."""
        return bool(self._pending)

    def round_sent(self, now: float) -> None:
        self._last_round_at = now

    def answered(self, follower: Hashable, sent_at: float | None) -> None:
        if sent_at is not None and sent_at >= max(self._leading_since, self._answered.get(follower, sent_at)):
            self._answered[follower] = sent_at

    def _answered_by_majority(self, voters: int) -> float:
        """The latest t such that a majority of ``voters`` (the leader
        counting itself) answered appends sent at or after t."""
        needed = voters // 2    # answers besides the leader's own
        if needed == 0:
            return float("inf")
        if len(self._answered) < needed:
            return float("-inf")
        return sorted(self._answered.values(), reverse=True)[needed - 1]

    def confirmed(self, voters: int, applied: int) -> list:
        """The tickets of the reads now confirmed and applied, oldest first
        (reads whose tickets are done already, timed out, are dropped).

        A read asked at ``t`` is confirmed once a majority answered appends
        sent at or after ``t``.
        """
        pending = self._pending
        while pending and pending[0][2].done:
            pending.popleft()
        if not pending:
            return []
        confirmed_up_to = self._answered_by_majority(voters)
        done = []
        while pending:
            asked_at, read_index, ticket = pending[0]
            if asked_at > confirmed_up_to or read_index > applied:
                break
            pending.popleft()
            done.append(ticket)
        return done

    def wants_round(self, voters: int) -> bool:
        """Whether to send a round now: a read arrived after the last round
        went out, and a majority has answered that round."""
        return (bool(self._pending) and self._pending[-1][0] > self._last_round_at
                and self._answered_by_majority(voters) >= self._last_round_at)
