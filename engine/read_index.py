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

Reads waiting together share rounds: one sent after the oldest covers them
all. This module keeps the bookkeeping; ``engine.raft_node`` stamps the
appends, feeds it the answers and resolves what it hands back, on the tick
thread.
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
        self.last_round_at = float("-inf")

    def begin_leading(self, now: float) -> list:
        """A new leadership: answers to older appends count for nothing; the
        reads still pending belonged to another term and are handed back."""
        self._leading_since = now
        self._answered.clear()
        self.last_round_at = float("-inf")
        dropped = [ticket for _, _, ticket in self._pending]
        self._pending.clear()
        return dropped

    def ask(self, asked_at: float, read_index: int, ticket) -> bool:
        """Queue a read; True when a round must go out for it."""
        self._pending.append((asked_at, read_index, ticket))
        return self.last_round_at < asked_at

    def round_sent(self, now: float) -> None:
        self.last_round_at = now

    def answered(self, follower: Hashable, sent_at: float | None) -> None:
        if sent_at is not None and sent_at >= max(self._leading_since, self._answered.get(follower, sent_at)):
            self._answered[follower] = sent_at

    def confirmed(self, voters: int, applied: int) -> list:
        """The tickets of the reads now confirmed and applied, oldest first
        (reads whose tickets are done already, timed out, are dropped).

        ``voters`` counts the leader; a read asked at ``t`` is confirmed once
        a majority of them answered appends sent at or after ``t``.
        """
        pending = self._pending
        while pending and pending[0][2].done:
            pending.popleft()
        if not pending:
            return []
        needed = voters // 2    # answers besides the leader's own
        if needed == 0:
            confirmed_up_to = float("inf")
        elif len(self._answered) < needed:
            return []
        else:
            confirmed_up_to = sorted(self._answered.values(), reverse=True)[needed - 1]
        done = []
        while pending:
            asked_at, read_index, ticket = pending[0]
            if asked_at > confirmed_up_to or read_index > applied:
                break
            pending.popleft()
            done.append(ticket)
        return done
