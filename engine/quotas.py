"""The quotas of principals that an engine holds for its node's fronts (api/principals.py): the
messages a principal puts per second, and its connections (docs/security.md, "Principals").

Both are counted here rather than in a front because a node runs several fronts (``--workers``)
and the kernel spreads a client's connections over them: only the engine sees all of them.

- ``PutRates``: a token bucket per principal, on the leader of a Raft group, which every put of
  the group passes (from every front of the node; a follower forwards or redirects), before
  anything reaches the log: a flood refused here costs the log nothing. A bucket holds one
  second of the rate; a put is taken while it is not empty and costs its messages (it may go
  below zero), so a batch larger than a second's worth passes once and the next puts wait.
  A new leader starts every bucket full: at most one second's worth more per election.
- ``Holds``: the connections a principal holds open on this node (streaming-wire connections,
  event streams), counted by the node's group-0 engine; a front's holds go with its link.
"""

from __future__ import annotations

import collections
import time
from typing import Callable

# Buckets of principals idle this long are full again: forgotten, so the table stays small.
IDLE_BUCKET_S = 60.0
PRUNE_EVERY = 4096


class PutRates:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}   # principal -> (tokens, when)
        self._takes = 0

    def take(self, principal: str, count: int, rate: float) -> float | None:
        """None when `principal` may put `count` messages now at `rate` per second (taken), else
        the seconds until it may."""
        now = self._clock()
        tokens, when = self._buckets.get(principal, (rate, now))
        tokens = min(rate, tokens + (now - when) * rate)
        if tokens <= 0:
            self._buckets[principal] = (tokens, now)
            return max(-tokens, 1.0) / rate if rate > 0 else float("inf")
        self._buckets[principal] = (tokens - count, now)
        self._takes += 1
        if self._takes % PRUNE_EVERY == 0:
            self._buckets = {p: b for p, b in self._buckets.items() if now - b[1] < IDLE_BUCKET_S}
        return None


class Holds:
    def __init__(self):
        self.held: collections.Counter[str] = collections.Counter()

    def hold(self, by: collections.Counter, principal: str, limit: int) -> bool:
        """Count one more connection of `principal` (for the front whose holds are `by`) unless it
        holds `limit` already."""
        if self.held[principal] >= limit:
            return False
        self.held[principal] += 1
        by[principal] += 1
        return True

    def release(self, by: collections.Counter, principal: str) -> None:
        if by[principal] > 0:
            by[principal] -= 1
            self.held[principal] -= 1
            if not self.held[principal]:
                del self.held[principal]
            if not by[principal]:
                del by[principal]

    def release_all(self, by: collections.Counter) -> None:
        """A front's link closed: its connections are gone."""
        for principal, count in list(by.items()):
            for _ in range(count):
                self.release(by, principal)
