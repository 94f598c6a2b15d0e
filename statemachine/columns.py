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

import sys
from array import array
from collections import deque
from contextlib import contextmanager
from itertools import count, groupby

NARROW, WIDE = "i", "q"
ZERO = -(1 << 31)           # 0 in a narrow column: below every offset it can hold


@contextmanager
def tail(column, start: int):
    """A view of an array's or a bytearray's values from row `start` on, not a copy (at ten
    million rows a slice is 40 MB more, and a snapshot's child takes one of every column).
    Released on leaving: a column that exports a view cannot grow or shrink."""
    with memoryview(column) as whole, whole[start:] as view:
        yield view


def runs_of(column, start: int = 0) -> list:
    """[values, lengths] of the runs of equal values of a column (an array, a bytearray) from row
    `start` on.  A put's messages share their put time, expiry, often their size; most are
    pending in one group and not yet received: at a million messages a column is a few
    thousand runs, where its bytes would be 4-8 MB.  No run is held as a list of its values
    (one run of ten million 0s would be 80 MB)."""
    with tail(column, start) as values:
        if not values:
            return [[], []]
        if _all_equal(values, values[0]):                   # (at C speed: the common case)
            return [[values[0]], [len(values)]]
        firsts, lengths = [], []
        for value, run in groupby(values):
            firsts.append(value)
            lengths.append(_length(run))
        return [firsts, lengths]


# How many values a view is compared at once with a run of one value
ALL_EQUAL_STEP = 1 << 16


def _all_equal(view, value) -> bool:
    with memoryview(array(view.format, (value,)) * min(len(view), ALL_EQUAL_STEP)) as same:
        for at in range(0, len(view), ALL_EQUAL_STEP):
            with view[at:at + ALL_EQUAL_STEP] as part:
                if part != same[:len(part)]:
                    return False
    return True


def _length(iterator) -> int:
    """How many items `iterator` yields, consumed at C speed without holding them."""
    counter = count()
    deque(zip(iterator, counter), maxlen=0)
    return next(counter)


class LittleEndian:
    """An array's values from row `start` on, in a snapshot's state, as their little-endian
    bytes: ``encode_column`` writes them from the array itself, not from a copy."""
    __slots__ = ("column", "start")

    def __init__(self, column: array, start: int):
        self.column, self.start = column, start


# How many bytes of a column a snapshot's encoder is handed at once: cbor2 copies what it is
# handed (whole, it would be a second copy of the column)
ENCODE_STEP = 1 << 20


def encode_column(encoder, value) -> None:
    """cbor2's ``default`` hook for a state holding ``LittleEndian`` columns: a byte string,
    the same on every replica whatever its byte order."""
    if not isinstance(value, LittleEndian):
        raise TypeError(f"cannot encode {type(value).__name__} in a snapshot")
    column, start = value.column, value.start
    if sys.byteorder == "big":
        column, start = array(column.typecode, column[start:]), 0
        column.byteswap()
    with tail(column, start) as values, values.cast("B") as raw:
        encoder.encode_length(2, raw.nbytes)
        for at in range(0, raw.nbytes, ENCODE_STEP):
            encoder.write(bytes(raw[at:at + ENCODE_STEP]))


def from_little_endian(column: array, data: bytes) -> None:
    """Append the values of a ``LittleEndian``'s bytes to `column`."""
    values = array(column.typecode)
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    column.extend(values)


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
        with tail(self.held, start) as held:
            distinct = set(held)
        return {0 if held == zero else held + base for held in distinct}

    def runs(self, start: int = 0) -> list:
        """``runs_of`` the values from row `start` on."""
        values, lengths = runs_of(self.held, start)
        zero, base = self.zero, self.base
        return [[0 if held == zero else held + base for held in values], lengths]

    def extend_runs(self, runs: list) -> None:
        """Append `runs`'s runs of values (as bytes: a restore of millions of rows is a few copies)."""
        for value, length in zip(*runs):
            held = self._offset(value) if value else self.zero
            self.held.frombytes(array(self.held.typecode, (held,)).tobytes() * length)
