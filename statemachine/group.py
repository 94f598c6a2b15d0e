"""One consumer group's view of a queue.

A stored message that a group has not finished with is in exactly one of
these places in that group:

- ``ready``   — may be handed out now, in seq order;
- ``leases``  — handed out, waiting for ack/nack/expiry;
- ``delayed`` — put with a delay, or nacked with one: ready at a log time;
- ``parked``  — out of deliveries, waiting to be moved to the dead-letter queue.

``ready`` holds a flag byte per seq (``ready.py``): every stored message
sits there in every group that has not received it, so it must cost little.
The others are sorted so that timers are found without scanning and hold
only what is delayed, parked or in flight; leases are a plain dict
because leasing and acking are the hot path, and the questions that need
them in order (a group's cursor, browse, commit) scan what is in flight.

A group may be *paused* (until a log time, or until resumed): a receive
hands it nothing, and its messages stay where they are.  It may have a
*rate limit*: a bucket of one second's worth of deliveries that refills at
the rate in log time (``Pace``), so every replica hands out the same
messages whatever the leader, and a failover neither resets nor doubles it.
"""

from heapq import merge
from itertools import chain

from sortedcontainers import SortedDict, SortedList

from .ready import ReadySeqs

MILLI = 1_000       # a Pace counts deliveries in thousandths


class Pace:
    """A group's rate limit: at most `limit` deliveries a second of log time, in bursts of at
    most one second's worth. Tokens are thousandths of a delivery, so that the refill is exact
    in integers (a millisecond of log time refills `limit` of them)."""
    __slots__ = ("limit", "tokens", "refilled_at", "wake_at")

    def __init__(self, limit: int, clock: int, tokens=None, wake_at=None):
        self.limit = limit
        self.tokens = limit * MILLI if tokens is None else tokens   # a new limit starts full
        self.refilled_at = clock
        self.wake_at = wake_at     # when a token is back for a receive that found none (a timer)

    def allowance(self, clock: int) -> int:
        """How many deliveries a receive may hand out at log time `clock`."""
        tokens = min(self.limit * MILLI, self.tokens + (clock - self.refilled_at) * self.limit)
        return tokens // MILLI

    def spend(self, count: int, clock: int) -> None:
        self.tokens = min(self.limit * MILLI, self.tokens + (clock - self.refilled_at) * self.limit) - count * MILLI
        self.refilled_at = clock
        if self.tokens < MILLI:     # the next delivery waits: a timer wakes waiting receives then
            self.wake_at = clock + -(-(MILLI - self.tokens) // self.limit)

    def to_state(self) -> list:
        return [self.limit, self.tokens, self.refilled_at, self.wake_at]

    @classmethod
    def from_state(cls, state):
        if state is None:
            return None
        limit, tokens, refilled_at, wake_at = state
        return cls(limit, refilled_at, tokens, wake_at)


class Group:
    __slots__ = ("name", "ready", "leases", "lease_deadlines", "delayed",
                 "delayed_times", "deliveries", "first_leased", "parked", "paused", "resume_at", "pace")

    def __init__(self, name: str):
        self.name = name
        self.ready = ReadySeqs()
        # seq -> (token, deadline).  A plain dict: leasing and acking are the
        # hot path; the few ordered questions (cursor, browse, commit) sort or
        # scan what is in flight when they are asked.
        self.leases = {}
        # deadline -> seqs whose lease ends then: one receive leases its whole
        # batch to one deadline, so a lease costs a set insert, not a bisect.
        self.lease_deadlines = SortedDict()
        self.delayed = SortedDict()           # seq -> visible_at
        self.delayed_times = SortedList()     # (visible_at, seq)
        self.deliveries = {}                # seq -> deliveries so far
        self.first_leased = {}              # seq -> log time of its first delivery (SQS shows it)
        self.parked = SortedDict()          # seq -> reason
        self.paused = False
        self.resume_at = None               # the log time a pause ends, or None: until resumed
        self.pace = None                    # a Pace when the group has a rate limit

    def held(self, maximum=None) -> list:
        """Every seq the group still holds (up to `maximum`), unordered: what it has not acked.

        Walking the group's own structures, not the queue, keeps commit and
        group deletion proportional to what they change even when other
        groups keep many messages this one is done with.
        """
        leased = self.leases if maximum is None else [s for s in self.leases if s <= maximum]
        return list(chain(self.ready.irange(maximum=maximum), leased,
                          *(s.irange(maximum=maximum) for s in (self.delayed, self.parked))))

    def held_from(self, minimum: int):
        """The seqs the group still holds from `minimum` on, in seq order, lazily."""
        leased = sorted(s for s in self.leases if s >= minimum)
        return merge(leased, *(s.irange(minimum=minimum) for s in (self.ready, self.delayed, self.parked)))

    def lease(self, seq: int, token: int, deadline: int, clock: int) -> int:
        self.leases[seq] = (token, deadline)
        self._add_deadline(seq, deadline)
        count = self.deliveries.get(seq, 0) + 1
        self.deliveries[seq] = count
        if count == 1:
            self.first_leased[seq] = clock
        return count

    def end_lease(self, seq: int) -> int:
        """End the lease of `seq`; its deadline."""
        _, deadline = self.leases.pop(seq)
        self._drop_deadline(seq, deadline)
        return deadline

    def extend_lease(self, seq: int, deadline: int) -> None:
        token, old = self.leases[seq]
        if deadline > old:
            self._drop_deadline(seq, old)
            self._add_deadline(seq, deadline)
            self.leases[seq] = (token, deadline)

    def expired_leases(self, clock: int) -> list:
        """The seqs of the leases that end at or before `clock`, by (deadline, seq)."""
        out = []
        if not self.lease_deadlines or self.lease_deadlines.keys()[0] > clock:
            return out
        for deadline in self.lease_deadlines.irange(maximum=clock):
            out.extend(sorted(self.lease_deadlines[deadline]))
        return out

    def _add_deadline(self, seq: int, deadline: int) -> None:
        seqs = self.lease_deadlines.get(deadline)
        if seqs is None:
            self.lease_deadlines[deadline] = {seq}
        else:
            seqs.add(seq)

    def _drop_deadline(self, seq: int, deadline: int) -> None:
        seqs = self.lease_deadlines[deadline]
        seqs.remove(seq)
        if not seqs:
            del self.lease_deadlines[deadline]

    def delay(self, seq: int, visible_at: int) -> None:
        self.delayed[seq] = visible_at
        self.delayed_times.add((visible_at, seq))

    def forget(self, seq: int) -> bool:
        """Drop every trace of the message; True when the group still held it."""
        self.deliveries.pop(seq, None)
        self.first_leased.pop(seq, None)
        if seq in self.leases:
            self.end_lease(seq)
        elif seq in self.delayed:
            self.delayed_times.remove((self.delayed.pop(seq), seq))
        elif seq in self.parked:
            del self.parked[seq]
        elif seq in self.ready:
            self.ready.remove(seq)
        else:
            return False
        return True

    def lowest_held(self):
        """The lowest seq this group holds in its own structures, or None."""
        heads = [s.keys()[0] for s in (self.delayed, self.parked) if s]
        if self.ready:
            heads.append(self.ready.lowest())
        if self.leases:
            heads.append(min(self.leases))
        return min(heads) if heads else None

    def next_timer(self):
        """The earliest lease end, delay, end of a pause or rate limit's wake, or None: asked of
        the groups of every queue an entry changes (statemachine/due.py), so it builds nothing."""
        soonest = self.lease_deadlines.peekitem(0)[0] if self.lease_deadlines else None
        for time in (self.delayed_times[0][0] if self.delayed_times else None, self.resume_at,
                     None if self.pace is None else self.pace.wake_at):
            if time is not None and (soonest is None or time < soonest):
                soonest = time
        return soonest

    def advance(self, clock: int) -> None:
        """End a pause whose time came; forget a rate limit's wake that fired."""
        if self.resume_at is not None and self.resume_at <= clock:
            self.paused, self.resume_at = False, None
        pace = self.pace
        if pace is not None and pace.wake_at is not None and pace.wake_at <= clock:
            pace.wake_at = None

    def pause(self, until, clock: int) -> None:
        """Hand nothing out until log time `until` (None: until resumed); a time already past is no pause."""
        if until is not None and until <= clock:
            self.resume()
        else:
            self.paused, self.resume_at = True, until

    def resume(self) -> None:
        self.paused, self.resume_at = False, None

    def limit_rate(self, limit, clock: int) -> None:
        """`limit` deliveries a second at most (None: no limit); a limit set anew starts with a full second."""
        if limit is None:
            self.pace = None
        elif self.pace is None or self.pace.limit != limit:
            self.pace = Pace(limit, clock)

    def allowance(self, clock: int):
        """How many messages a receive may hand out at `clock` (None: as many as are ready)."""
        if self.paused:
            return 0
        return None if self.pace is None else self.pace.allowance(clock)

    def settings(self) -> dict:
        return {"paused": self.paused, "resume_at_ms": self.resume_at,
                "rate_limit": None if self.pace is None else self.pace.limit}

    # Snapshot form: only the authoritative structures, as columns (one list
    # per field, like the messages'); the ordered indexes are rebuilt.  Version 17 adds the
    # pause and the rate limit.
    def to_state(self) -> list:
        lease_seqs = sorted(self.leases)
        leases = list(map(self.leases.__getitem__, lease_seqs))
        return [self.name, self.ready.to_state(),
                [lease_seqs, [t for t, _ in leases], [d for _, d in leases]],
                [list(self.delayed), list(self.delayed.values())],
                [list(self.deliveries), list(self.deliveries.values())],
                [list(self.parked), list(self.parked.values())],
                [list(self.first_leased), list(self.first_leased.values())],
                [self.paused, self.resume_at, None if self.pace is None else self.pace.to_state()]]

    @classmethod
    def from_state(cls, state: list, version: int, flags_of=None) -> "Group":
        """`flags_of`: the ready flags of a run of seqs, from their priorities (ready.py)."""
        # Snapshots before version 7 have no first deliveries' times; before
        # version 9 the ready seqs are a list, not runs; before version 17 no group is paused
        # or paced, and every message has priority 0.
        name, ready, (lease_seqs, tokens, deadlines), delayed, deliveries, parked, *newer = state
        group = cls(name)
        group.ready = ReadySeqs.from_state(ready, flags_of) if version >= 9 else ReadySeqs.from_seqs(ready)
        group.leases = dict(zip(lease_seqs, zip(tokens, deadlines)))
        for seq, deadline in zip(lease_seqs, deadlines):
            group._add_deadline(seq, deadline)
        group.delayed = SortedDict(zip(*delayed))
        group.delayed_times = SortedList(zip(delayed[1], delayed[0]))
        group.deliveries = dict(zip(*deliveries))
        group.parked = SortedDict(zip(*parked))
        group.first_leased = dict(zip(*newer[0])) if newer else {}
        if len(newer) > 1:
            group.paused, group.resume_at, pace = newer[1]
            group.pace = Pace.from_state(pace)
        return group
