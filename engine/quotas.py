"""The quotas of principals that an engine holds for the fronts (api/principals.py): the
messages a principal puts per second, and its connections (docs/security.md, "Principals").

They are counted here rather than in a front because a node runs several fronts (``--workers``)
and the kernel spreads a client's connections over them: only an engine sees all of them.

- ``PutRates``: a token bucket per principal, on the leader of a Raft group, which every put of
  the group passes (from every front of the node; a follower forwards or redirects), before
  anything reaches the log: a flood refused here costs the log nothing. A bucket holds one
  second of the rate; a put is taken while it is not empty and costs its messages (it may go
  below zero), so a batch larger than a second's worth passes once and the next puts wait.
  A new leader starts every bucket full: at most one second's worth more per election.
- ``ConnectionLeases``: the connections a principal holds open in the whole cluster
  (streaming-wire connections, event streams), on group 0's leader, which every node's fronts
  reach: each connection is a lease its front renews while it lives, so a node that dies takes
  its connections with it within a lease, without telling anyone.
- ``Holds``: the same counted per node, by the node's group-0 engine, while some node runs a
  release without ``ConnectionLeases`` (api/features.py); a front's holds go with its link.
"""

from __future__ import annotations

import collections
import time
from typing import Callable

# Buckets of principals idle this long are full again: forgotten, so the table stays small.
IDLE_BUCKET_S = 60.0
PRUNE_EVERY = 4096
# How long a connection's lease lasts unrenewed: a dead node's connections are released this late;
# its fronts renew every third of it, so one late or lost renewal loses no live connection.
CONNECTION_LEASE_S = 6.0


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


class ConnectionLeases:
    """principal -> lease -> when it expires, valid for one leader term.

    A new leader knows none of the connections already open: it learns them from the fronts'
    renewals, each front renewing all of its leases every lease/3. Until a whole lease has
    passed since it was elected (``took``) it refuses new holds (``hold`` answers how long to wait):
    by then every connection still open was renewed here, or its lease would have expired
    anyway, so a hold it admits never passes the quota because of one it has not yet heard of.
    A renewal is always taken, even past the quota: its connection is open already."""

    def __init__(self, lease_s: float, clock: Callable[[], float] = time.monotonic):
        self.lease_s = lease_s
        self._clock = clock
        self._term: int | None = None
        self._open_at = 0.0
        self._leases: dict[str, dict[str, float]] = {}

    def took(self, term: int) -> None:
        """This engine leads from `term` on: what it held in an earlier term may have been released
        since, and what was held under another leader is unknown here."""
        if term != self._term:
            self._term, self._open_at, self._leases = term, self._clock() + self.lease_s, {}

    def _table(self, term: int) -> dict[str, dict[str, float]]:
        self.took(term)
        return self._leases

    def _live(self, principal: str, now: float) -> dict[str, float]:
        held = self._leases.get(principal, {})
        for lease in [lease for lease, expiry in held.items() if expiry <= now]:
            del held[lease]
        return held

    def hold(self, term: int, principal: str, lease: str, limit: int) -> float | bool:
        """True: `lease` is held for `principal`; False: it holds `limit` already; a number: the
        seconds until this leader, new in `term`, has relearned the connections open."""
        table, now = self._table(term), self._clock()
        if now < self._open_at:
            return self._open_at - now
        held = self._live(principal, now)
        if lease not in held and len(held) >= limit:
            return False
        table.setdefault(principal, held)[lease] = now + self.lease_s
        return True

    def renew(self, term: int, leases: list) -> None:
        """[[principal, lease], ...]: each open for another lease, learnt if it was not known."""
        table, now = self._table(term), self._clock()
        for principal, lease in leases:
            table.setdefault(principal, {})[lease] = now + self.lease_s
        for principal in [p for p in table if not self._live(p, now)]:
            del table[principal]

    def release(self, term: int, principal: str, lease: str) -> None:
        table = self._table(term)
        held = table.get(principal)
        if held is not None:
            held.pop(lease, None)
            if not held:
                del table[principal]


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
