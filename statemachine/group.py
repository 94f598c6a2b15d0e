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
"""

from heapq import merge
from itertools import chain

from sortedcontainers import SortedDict, SortedList

from .ready import ReadySeqs


class Group:
    __slots__ = ("name", "ready", "leases", "lease_deadlines", "delayed",
                 "delayed_times", "deliveries", "first_leased", "parked")

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

    def end_lease(self, seq: int) -> None:
        _, deadline = self.leases.pop(seq)
        self._drop_deadline(seq, deadline)

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
        """The earliest lease end or delay, or None: asked of the groups of every queue an entry
        changes (statemachine/due.py), so it builds nothing."""
        lease = self.lease_deadlines.peekitem(0)[0] if self.lease_deadlines else None
        if not self.delayed_times:
            return lease
        delay = self.delayed_times[0][0]
        return delay if lease is None or delay < lease else lease

    # Snapshot form: only the authoritative structures, as columns (one list
    # per field, like the messages'); the ordered indexes are rebuilt.
    def to_state(self) -> list:
        lease_seqs = sorted(self.leases)
        leases = list(map(self.leases.__getitem__, lease_seqs))
        return [self.name, self.ready.to_state(),
                [lease_seqs, [t for t, _ in leases], [d for _, d in leases]],
                [list(self.delayed), list(self.delayed.values())],
                [list(self.deliveries), list(self.deliveries.values())],
                [list(self.parked), list(self.parked.values())],
                [list(self.first_leased), list(self.first_leased.values())]]

    @classmethod
    def from_state(cls, state: list, version: int) -> "Group":
        # Snapshots before version 7 have no first deliveries' times; before
        # version 9 the ready seqs are a list, not runs.
        name, ready, (lease_seqs, tokens, deadlines), delayed, deliveries, parked, *newer = state
        group = cls(name)
        group.ready = ReadySeqs.from_state(ready) if version >= 9 else ReadySeqs.from_seqs(ready)
        group.leases = dict(zip(lease_seqs, zip(tokens, deadlines)))
        for seq, deadline in zip(lease_seqs, deadlines):
            group._add_deadline(seq, deadline)
        group.delayed = SortedDict(zip(*delayed))
        group.delayed_times = SortedList(zip(delayed[1], delayed[0]))
        group.deliveries = dict(zip(*deliveries))
        group.parked = SortedDict(zip(*parked))
        group.first_leased = dict(zip(*newer[0])) if newer else {}
        return group
