"""The seqs a consumer group may hand out now: one flag byte per seq, holding its priority.

A group's ready messages were a sorted list of seqs: 40 bytes per stored
message (the seq's own int and its slot) in every group, more than the
message's whole row (rows.py).  Here a ready seq is a byte set in a
bytearray indexed by seq - base: 1 byte per seq between the lowest ready
one and the newest.  The byte is the message's priority + 1 (0: not ready),
so priorities cost no more bytes than readiness did.  Puts append at the
tail; receives take from the head of the highest priority; nacks and
expired leases put seqs back near the head.  The cleared bytes ahead of the
lowest ready seq are cut off once they are at least half of the flags (and
TRIM_MIN or more), so that taking from the head costs O(1) a seq, and a
requeued seq usually lands inside the flags, not before them.

While every ready seq has priority 0 (the default, and every queue before
priorities) the flags are 0 or 1 and the lowest is found with
``bytearray.find`` as it always was.  Once another priority is ready, each
priority keeps its count and its lowest flag (``levels``): a receive takes
the lowest flag of the highest priority and finds that priority's next one
with ``bytearray.find`` of its byte, which only moves forward, so consuming
a priority scans its stretch of the flags once (C speed: a million flags is
a millisecond), whatever the mix.

It answers what the sorted list answered and a receive's one more question
(the next seq by priority): add, remove, membership, the lowest (taken or
looked at), the next by priority, ordered ranges, the count.
"""

import re

from .rows import TRIM_MIN

PRIORITIES = 10                  # a message's priority is 0 (the default, the lowest) to 9
READY = 1                        # the flag of a ready seq of priority 0
FLAG = [bytes((p + 1,)) for p in range(PRIORITIES)]   # each priority's flag, as find() takes it
ANY_READY = re.compile(rb"[^\x00]")
READY_RUN = re.compile(rb"[^\x00]+")


class Levels:
    """Per priority: how many seqs are ready, and the flag of the lowest (when any)."""
    __slots__ = ("counts", "heads", "top")

    def __init__(self, count: int, first: int):
        self.counts = [0] * PRIORITIES
        self.heads = [0] * PRIORITIES
        self.counts[0], self.heads[0] = count, first
        self.top = 0                                    # the highest priority with a ready seq

    def shift(self, by: int) -> None:
        self.heads = [head + by for head in self.heads]


class ReadySeqs:
    __slots__ = ("base", "first", "count", "flags", "levels")

    def __init__(self):
        self.base = 0             # the seq of flag 0
        self.first = 0            # the lowest set flag (when count > 0)
        self.count = 0
        self.flags = bytearray()
        self.levels = None        # a Levels once a seq of priority > 0 is ready, until none is ready

    def __len__(self) -> int:
        return self.count

    def __contains__(self, seq: int) -> bool:
        at = seq - self.base
        return 0 <= at < len(self.flags) and self.flags[at] != 0

    def __iter__(self):
        return self.irange()

    def add(self, seq: int, priority: int = 0) -> None:
        """Mark `seq` ready (it is not yet), at `priority`."""
        flags = self.flags
        if not self.count:
            flags.clear()
            self.base, self.first = seq, 0
        if priority and self.levels is None:
            self.levels = Levels(self.count, self.first)     # what is ready so far: all priority 0
        at = seq - self.base
        flag = priority + 1
        if at == len(flags):                 # a put: the tail
            flags.append(flag)
        elif at > len(flags):                # after seqs that went elsewhere (delayed)
            flags.extend(bytes(at - len(flags)))
            flags.append(flag)
        elif at >= 0:
            flags[at] = flag
        else:                                # before the flags: room for it at the front
            flags[0:0] = bytes(-at)
            flags[0] = flag
            if self.levels is not None:
                self.levels.shift(-at)
            self.base, self.first, at = seq, 0, 0
        if at < self.first:
            self.first = at
        self.count += 1
        if self.levels is not None:
            self._count_in(at, priority)

    def _count_in(self, at: int, priority: int) -> None:
        levels = self.levels
        counts = levels.counts
        counts[priority] += 1
        if counts[priority] == 1 or at < levels.heads[priority]:
            levels.heads[priority] = at
        if priority > levels.top:
            levels.top = priority

    def remove(self, seq: int) -> None:
        """Unmark `seq` (it is ready)."""
        at = seq - self.base
        flag = self.flags[at]
        self.flags[at] = 0
        self.count -= 1
        if self.levels is not None:
            self._count_out(at, flag - 1)
        if at == self.first:
            self._pass(at)

    def _count_out(self, at: int, priority: int) -> None:
        levels = self.levels
        counts = levels.counts
        counts[priority] -= 1
        if counts[priority]:
            if at == levels.heads[priority]:
                levels.heads[priority] = self.flags.find(FLAG[priority], at + 1)
        elif priority == levels.top:
            top = priority
            while top and not counts[top]:
                top -= 1
            levels.top = top

    def lowest(self) -> int:
        return self.base + self.first

    def top(self) -> int:
        """The highest priority of a ready seq (0 when none)."""
        return 0 if self.levels is None else self.levels.top

    def pop_lowest(self) -> int:
        at = self.first
        flag = self.flags[at]
        self.flags[at] = 0
        self.count -= 1
        seq = self.base + at
        if self.levels is not None:
            self._count_out(at, flag - 1)
        self._pass(at)
        return seq

    def pop_next(self) -> int:
        """Take the seq a receive hands out next: the lowest of the highest priority."""
        levels = self.levels
        if levels is None:
            return self.pop_lowest()
        priority = levels.top
        at = levels.heads[priority]
        self.flags[at] = 0
        self.count -= 1
        self._count_out(at, priority)
        seq = self.base + at
        if at == self.first:
            self._pass(at)
        return seq

    def _pass(self, at: int) -> None:
        """The lowest ready seq, at `at`, went: find the next one; cut the flags ahead of it when many."""
        flags = self.flags
        if not self.count:
            flags.clear()
            self.first = 0
            self.levels = None
            return
        levels = self.levels
        if levels is None:
            first = self.first = flags.find(READY, at + 1)
        else:
            counts = levels.counts
            first = self.first = min(head for priority, head in enumerate(levels.heads) if counts[priority])
        if first >= TRIM_MIN and 2 * first >= len(flags):
            del flags[:first]
            self.base += first
            self.first = 0
            if levels is not None:
                levels.shift(-first)

    def irange(self, minimum=None, maximum=None):
        """The ready seqs from `minimum` to `maximum` (both included), in seq order, lazily."""
        flags, base = self.flags, self.base
        start = self.first if minimum is None else max(self.first, minimum - base)
        stop = len(flags) if maximum is None else min(len(flags), maximum - base + 1)
        if not self.count or start >= stop:
            return
        if self.levels is None:
            find = flags.find
            at = find(READY, start, stop)
            while at != -1:
                yield base + at
                at = find(READY, at + 1, stop)
        else:
            for found in ANY_READY.finditer(flags, start, stop):
                yield base + found.start()

    # ---- snapshot: runs of consecutive ready seqs (version 9 on) ---------------------------------
    # A run's priorities are the rows' (rows.py): the snapshot holds where seqs are ready, and
    # a restore reads each one's priority from its row.
    def to_state(self) -> list:
        """[first seqs, lengths] of the runs of consecutive ready seqs."""
        starts, lengths = [], []
        if not self.count:
            return [starts, lengths]
        base = self.base
        for run in READY_RUN.finditer(self.flags, self.first):
            starts.append(base + run.start())
            lengths.append(run.end() - run.start())
        return [starts, lengths]

    @classmethod
    def from_state(cls, state: list, flags_of=None) -> "ReadySeqs":
        """`flags_of(first seq, length)`: the flags of a run of ready seqs, from their priorities
        (None: every one of priority 0, as before priorities)."""
        ready = cls()
        starts, lengths = state
        if starts:
            ready.base = starts[0]
            flags = ready.flags          # (first: 0, the first run's start)
            for start, length in zip(starts, lengths):
                flags.extend(bytes(start - ready.base - len(flags)))
                flags.extend(b"\x01" * length if flags_of is None else flags_of(start, length))
            ready.count = sum(lengths)
            ready._count_levels()
        return ready

    def _count_levels(self) -> None:
        """Levels from the flags, when some ready seq has a priority above 0."""
        flags = self.flags
        if flags.count(READY) == self.count:
            return
        levels = self.levels = Levels(0, 0)
        for priority in range(PRIORITIES):
            count = levels.counts[priority] = flags.count(FLAG[priority])
            if count:
                levels.heads[priority] = flags.find(FLAG[priority])
                levels.top = priority

    @classmethod
    def from_seqs(cls, seqs: list) -> "ReadySeqs":
        """From a snapshot before version 9: the ready seqs, in order."""
        ready = cls()
        for seq in seqs:
            ready.add(seq)
        return ready
