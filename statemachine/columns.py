"""Compact columns for a queue's rows (rows.py): runs, and large ints held as 4-byte offsets.

Put times, expiries and log indexes are 8-byte ints, but the values of one
queue's rows lie within days (or a few million entries) of each other.  An
``OffsetColumn`` keeps each as a signed 4-byte offset from the first value it
was given (its base): half the bytes of an ``array("q")``, ±24 days of
milliseconds or ±2 billion log indexes around the base.  0 -- a tombstone's
value, no expiry, no reference -- is the one value held as itself rather
than as an offset: ZERO, which no offset equals.

A value too far from the base widens the column for good (until it is
emptied): from then on it holds the values themselves in 8 bytes.  Only a
queue that never empties for weeks, or a message moved in from a far older
one, costs that.  Whatever its width, a column reads, counts and snapshots
the same values (``runs`` gives the runs of the values, not of the offsets),
so replicas agree whatever each one's history.
"""

from array import array
from itertools import groupby

NARROW, WIDE = "i", "q"
ZERO = -(1 << 31)           # 0 in a narrow column: below every offset it can hold


def runs_of(column) -> list:
    """[values, lengths] of a column's runs of equal values.  A put's messages
    share their put time, expiry, often their size; most are pending in one
    group and not yet received: at a million messages a column is a few
    thousand runs, where its bytes would be 4-8 MB."""
    if not column:
        return [[], []]
    if column.count(column[0]) == len(column):        # (at C speed: the common case)
        return [[column[0]], [len(column)]]
    values, lengths = [], []
    for value, run in groupby(column):
        values.append(value)
        lengths.append(len(list(run)))
    return [values, lengths]


class OffsetColumn:
    __slots__ = ("held", "base", "zero")

    def __init__(self):
        self._empty()

    def _empty(self) -> None:
        self.held = array(NARROW)
        self.base = None          # the value offset 0 stands for; None until a value other than 0 comes
        self.zero = ZERO          # how 0 is held (0 itself once wide, where the base is 0)

    def __len__(self) -> int:
        return len(self.held)

    def __getitem__(self, row: int) -> int:
        held = self.held[row]
        return 0 if held == self.zero else held + self.base

    def __setitem__(self, row: int, value: int) -> None:
        if value:
            self.held[row] = self._offset(value)
        else:
            self.held[row] = self.zero

    def __delitem__(self, rows: slice) -> None:
        del self.held[rows]
        if not self.held:
            self._empty()

    def append(self, value: int) -> None:
        # (the hot path: once a message is put, thrice, so one call and no more)
        if value:
            base = self.base
            if base is not None:
                held = value - base
                if held != ZERO:
                    try:
                        self.held.append(held)      # a narrow array refuses what 4 bytes cannot hold
                        return
                    except OverflowError:
                        pass
            held = self._offset(value)   # first: it may widen the column into a new array
            self.held.append(held)
        else:
            self.held.append(self.zero)

    def _offset(self, value: int) -> int:
        """`value` (not 0) as this column holds it, widening the column if it must."""
        if self.base is None:
            self.base = value
        offset = value - self.base
        if self.held.typecode == NARROW and not ZERO < offset < -ZERO:
            base, zero = self.base, self.zero
            self.held = array(WIDE, (0 if held == zero else held + base for held in self.held))
            self.base = self.zero = 0
            return value
        return offset

    def zeros(self, start: int = 0) -> int:
        """How many values from row `start` on are 0."""
        return (self.held[start:] if start else self.held).count(self.zero)

    def nonzero(self) -> list:
        """(row, value) of every value that is not 0, in row order."""
        zero, base = self.zero, self.base
        if self.held.count(zero) == len(self.held):     # (at C speed: a queue without TTLs, restored)
            return []
        return [(row, held + base) for row, held in enumerate(self.held) if held != zero]

    def distinct(self, start: int = 0) -> set:
        """The different values from row `start` on."""
        zero, base = self.zero, self.base
        return {0 if held == zero else held + base for held in set(self.held[start:])}

    def runs(self, start: int = 0) -> list:
        """``runs_of`` the values from row `start` on."""
        values, lengths = runs_of(self.held[start:])
        zero, base = self.zero, self.base
        return [[0 if held == zero else held + base for held in values], lengths]

    def extend_runs(self, runs: list) -> None:
        """Append `runs`'s runs of values (as bytes: a restore of millions of rows is a few copies)."""
        for value, length in zip(*runs):
            held = self._offset(value) if value else self.zero
            self.held.frombytes(array(self.held.typecode, (held,)).tobytes() * length)
