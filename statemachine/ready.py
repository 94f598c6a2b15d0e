"""The seqs a consumer group may hand out now: one flag byte per seq.

A group's ready messages were a sorted list of seqs: 40 bytes per stored
message (the seq's own int and its slot) in every group, more than the
message's whole row (rows.py).  Here a ready seq is a byte set to 1 in a
bytearray indexed by seq - base: 1 byte per seq between the lowest ready
one and the newest, and the lowest is found with ``bytearray.find`` (C
speed).  Puts append at the tail; receives take from the head; nacks and
expired leases put seqs back near the head.  The cleared bytes ahead of the
lowest ready seq are cut off once they are at least half of the flags (and
TRIM_MIN or more), so that taking from the head costs O(1) a seq, and a
requeued seq usually lands inside the flags, not before them.

It answers what the sorted list answered and nothing more: add, remove,
membership, the lowest (taken or looked at), ordered ranges, the count.
"""

from .rows import TRIM_MIN

READY = 1


class ReadySeqs:
    __slots__ = ("base", "first", "count", "flags")

    def __init__(self):
        self.base = 0             # the seq of flag 0
        self.first = 0            # the lowest set flag (when count > 0)
        self.count = 0
        self.flags = bytearray()

    def __len__(self) -> int:
        return self.count

    def __contains__(self, seq: int) -> bool:
        at = seq - self.base
        return 0 <= at < len(self.flags) and self.flags[at] == READY

    def __iter__(self):
        return self.irange()

    def add(self, seq: int) -> None:
        """Mark `seq` ready (it is not yet)."""
        flags = self.flags
        if not self.count:
            flags.clear()
            self.base, self.first = seq, 0
        at = seq - self.base
        if at == len(flags):                 # a put: the tail
            flags.append(READY)
        elif at > len(flags):                # after seqs that went elsewhere (delayed)
            flags.extend(bytes(at - len(flags)))
            flags.append(READY)
        elif at >= 0:
            flags[at] = READY
        else:                                # before the flags: room for it at the front
            flags[0:0] = bytes(-at)
            flags[0] = READY
            self.base, self.first, at = seq, 0, 0
        if at < self.first:
            self.first = at
        self.count += 1

    def remove(self, seq: int) -> None:
        """Unmark `seq` (it is ready)."""
        at = seq - self.base
        self.flags[at] = 0
        self.count -= 1
        if at == self.first:
            self._pass(at)

    def lowest(self) -> int:
        return self.base + self.first

    def pop_lowest(self) -> int:
        at = self.first
        self.flags[at] = 0
        self.count -= 1
        seq = self.base + at
        self._pass(at)
        return seq

    def _pass(self, at: int) -> None:
        """The lowest ready seq, at `at`, went: find the next one; cut the flags ahead of it when many."""
        flags = self.flags
        if not self.count:
            flags.clear()
            self.first = 0
            return
        first = self.first = flags.find(READY, at + 1)
        if first >= TRIM_MIN and 2 * first >= len(flags):
            del flags[:first]
            self.base += first
            self.first = 0

    def irange(self, minimum=None, maximum=None):
        """The ready seqs from `minimum` to `maximum` (both included), in order, lazily."""
        flags, base = self.flags, self.base
        start = self.first if minimum is None else max(self.first, minimum - base)
        stop = len(flags) if maximum is None else min(len(flags), maximum - base + 1)
        if not self.count or start >= stop:
            return
        find = flags.find
        at = find(READY, start, stop)
        while at != -1:
            yield base + at
            at = find(READY, at + 1, stop)

    # ---- snapshot: runs of consecutive ready seqs (version 9 on) ---------------------------------
    def to_state(self) -> list:
        """[first seqs, lengths] of the runs of consecutive ready seqs."""
        starts, lengths = [], []
        if not self.count:
            return [starts, lengths]
        flags, base = self.flags, self.base
        at = self.first
        while at != -1:
            end = flags.find(0, at)
            if end == -1:
                end = len(flags)
            starts.append(base + at)
            lengths.append(end - at)
            at = flags.find(READY, end)
        return [starts, lengths]

    @classmethod
    def from_state(cls, state: list) -> "ReadySeqs":
        ready = cls()
        starts, lengths = state
        if starts:
            ready.base = starts[0]
            flags = ready.flags          # (first: 0, the first run's start)
            for start, length in zip(starts, lengths):
                flags.extend(bytes(start - ready.base - len(flags)))
                flags.extend(b"\x01" * length)
            ready.count = sum(lengths)
        return ready

    @classmethod
    def from_seqs(cls, seqs: list) -> "ReadySeqs":
        """From a snapshot before version 9: the ready seqs, in order."""
        ready = cls()
        for seq in seqs:
            ready.add(seq)
        return ready
