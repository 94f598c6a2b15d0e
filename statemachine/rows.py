"""A queue's stored messages as rows of columns, indexed by seq - base.

A message used to be a tuple of eight fields in a dict keyed by its seq:
about 200 bytes of objects beside its body (the tuple, its slot in the dict,
the seq's own int).  Here it is one row across compact arrays (the `array`
module): put time, expiry, size and pending count 4 bytes each, the
received flag 1 -- 17 bytes -- and the body's reference into the log entry
that carried it (bodies.py: index, offset and length 4 each, kind 1) -- 13
more.  Put times, expiries and log indexes are 4-byte offsets from the
column's first value (columns.py).  A referenced body is not in the heap, and has no slot anywhere
else: the few bodies without a reference (applied without a log index, moved
from a staged write) are in a dict keyed by seq, as keys are.
Arrays rather than numpy: no dependency, append and count at C speed, and
the garbage collector does not track them (engine/pauses.py), so a full
collection visits one list of bodies per queue, not one object per message.

What few messages have -- a body without a reference, a key, headers, a
delay -- lives in dicts keyed by seq, beside the columns.

Rows cover the seqs [base, base + len(pending)), in order: every seq the
queue hands out gets the next row.  Messages leave out of order (acks,
expiry, keyed replacement, overflow, redrive): a removed one leaves a
tombstone, a row whose pending count is 0 and whose reference is zeros.  The dead
rows ahead of the first live one are cut off once they are at least half of
the rows (and TRIM_MIN or more), so a queue consumed in order holds about as
many rows as messages, and cutting costs O(1) per removed message.

Every queue's rows also count their bytes into one ``Tally`` of their
machine: the bytes the machine stores, which a put is checked against
(``--max-stored-bytes``) without a walk over every queue.

A message's priority (0 to 9, ready.py) is one more byte column.  A queue
with retention (queue.py) keeps a message every group is done with as a
*retained* row: pending 0 like a tombstone, but its received byte is
RETAINED and it keeps its put time, size and body reference, so that a
group moved back (a seek) replays it.  Retained rows are counted apart
(``retained``, ``retained_bytes``): ``count`` and ``bytes`` are what the
groups still hold; the machine's ``Tally`` counts both, as a retained
message takes its room on disk.
"""

import re

from array import array
from itertools import compress, repeat

from .bodies import BodyRef
from .columns import LittleEndian, OffsetColumn, from_little_endian, runs_of, tail

NO_EXPIRY = 0          # an expiry is put time + a TTL > 0, so never 0
TRIM_MIN = 4_096       # dead rows ahead of the head worth a cut (a memmove of the columns)
RECEIVED, RETAINED = 1, 2   # a row's received byte: some group received it; every group is done, kept
RETAINED_FLAG = bytes((RETAINED,))
# A priority's flag in a group's ready set is the priority + 1 (ready.py)
READY_FLAGS = bytes(range(1, 257)[:255]) + b"\x00"
NONZERO = re.compile(rb"[^\x00]")


def _from_runs(column, runs: list) -> None:
    """Append `runs_of`'s runs to the column (an array's or a bytearray's as bytes: a restore of
    millions of rows is a few copies, not millions of appends)."""
    if isinstance(column, OffsetColumn):
        column.extend_runs(runs)
        return
    for value, length in zip(*runs):
        if isinstance(column, array):
            column.frombytes(array(column.typecode, (value,)).tobytes() * length)
        elif isinstance(column, bytearray):
            column += bytes((value,)) * length
        else:
            column.extend(repeat(value, length))


class Tally:
    """The bytes the rows of every queue of one machine hold, summed as they change (derived: a
    restore counts them again)."""
    __slots__ = ("bytes",)

    def __init__(self):
        self.bytes = 0


class Rows:
    __slots__ = ("base", "head", "count", "bytes", "tally", "retained", "retained_bytes", "retained_from", "bodies",
                 "ref_index", "ref_offset", "ref_length", "ref_kind", "put_at", "expires_at", "sizes", "pending",
                 "received", "priority", "keys", "headers", "shows_at")

    def __init__(self, base: int = 1, tally: Tally | None = None):
        self.base = base          # the seq of row 0
        self.head = 0             # the first live row (when count > 0)
        self.count = 0            # live rows
        self.bytes = 0            # their sizes, summed
        self.tally = Tally() if tally is None else tally    # where they count with other queues' rows
        self.retained = 0         # retained rows (no group holds them; kept for a replay)
        self.retained_bytes = 0   # their sizes, summed
        self.retained_from = 0    # no retained row lies before this row
        self.bodies = {}                # seq -> body, of a message whose body has no reference
        self.ref_index = OffsetColumn() # the body's BodyRef: its entry's log index (0: no reference),
        self.ref_offset = array("I")    # where in the entry (an entry is at most 17 MiB),
        self.ref_length = array("I")    # how many bytes
        self.ref_kind = bytearray()     # and how they read back
        self.put_at = OffsetColumn()
        self.expires_at = OffsetColumn()    # NO_EXPIRY, or the log time the message expires
        self.sizes = array("I")         # bytes toward max_bytes (message_size); the API caps a message far below 4 GiB
        self.pending = array("I")       # groups not done with it; 0: a tombstone
        self.received = bytearray()     # RECEIVED once some group received it (keyed replacement spares
                                        # it), RETAINED once every group is done with it and it is kept
        self.priority = bytearray()     # 0 (the default) to 9: which a receive hands out first
        self.keys = {}                  # seq -> key, of a message put with one
        self.headers = {}               # seq -> headers as a tuple of (name, value) pairs (untracked)
        self.shows_at = {}              # seq -> log time a message put with a delay shows

    def __len__(self) -> int:
        return self.count

    # ---- one message --------------------------------------------------------------------
    def append(self, seq: int, body, key, headers, put_at: int, expires_at, size: int, pending: int,
               priority: int = 0) -> None:
        """Store a message at the tail; `seq` is the queue's next one and `headers` a tuple of pairs or None."""
        if not (self.count or self.retained):
            self.clear(seq)
        if isinstance(body, BodyRef):
            self.ref_index.append(body.index)
            self.ref_offset.append(body.offset)
            self.ref_length.append(body.length)
            self.ref_kind.append(body.kind)
        else:
            self.bodies[seq] = body
            self._append_no_reference()
        self.put_at.append(put_at)
        self.expires_at.append(NO_EXPIRY if expires_at is None else expires_at)
        self.sizes.append(size)
        self.pending.append(pending)
        self.received.append(0)
        self.priority.append(priority)
        if key is not None:
            self.keys[seq] = key
        if headers is not None:
            self.headers[seq] = headers
        self.count += 1
        self.bytes += size
        self.tally.bytes += size

    def body(self, seq: int):
        """The body, or the BodyRef that names it."""
        return self._body(seq - self.base)

    def _body(self, row: int):
        index = self.ref_index[row]
        if index:
            return BodyRef(index, self.ref_offset[row], self.ref_length[row], self.ref_kind[row])
        return self.bodies[self.base + row]

    def put_time(self, seq: int) -> int:
        return self.put_at[seq - self.base]

    def size(self, seq: int) -> int:
        return self.sizes[seq - self.base]

    def was_received(self, seq: int) -> bool:
        return self.received[seq - self.base] == RECEIVED

    def priority_of(self, seq: int) -> int:
        return self.priority[seq - self.base]

    def ready_flags(self, seq: int, length: int) -> bytes:
        """The flags of `length` seqs from `seq` in a group's ready set: each one's priority + 1."""
        row = seq - self.base
        return self.priority[row:row + length].translate(READY_FLAGS)

    def deliver(self, seq: int) -> tuple:
        """Mark the message received; (body, key, stored headers, put time, priority): what a receive
        hands out, in one call (a receive's per-message cost is mostly calls)."""
        row = seq - self.base
        self.received[row] = RECEIVED
        return (self._body(row), self.keys.get(seq) if self.keys else None,
                self.headers.get(seq) if self.headers else None, self.put_at[row], self.priority[row])

    def relocate(self, seq: int, old: BodyRef, new: BodyRef) -> bool:
        """Point the stored message `seq` (held by a group, or retained) at `new` if its body is the
        reference `old`, exactly; whether it did (a relocation, machine.py's ``_relocate``)."""
        row = seq - self.base
        if not (self.head <= row < len(self.pending) and (self.pending[row] or self.received[row] == RETAINED)
                and self.ref_index[row] == old.index
                and self.ref_offset[row] == old.offset and self.ref_length[row] == old.length
                and self.ref_kind[row] == old.kind):
            return False
        self.ref_index[row], self.ref_offset[row] = new.index, new.offset
        self.ref_length[row], self.ref_kind[row] = new.length, new.kind
        return True

    def release(self, seq: int, received: bool) -> int:
        """One group is done with the message (having received it, or not): the groups still pending."""
        row = seq - self.base
        pending = self.pending[row] - 1
        if pending:
            self.pending[row] = pending
            if received:
                self.received[row] = RECEIVED
        return pending

    # ---- retained rows ----------------------------------------------------------------------
    def retain(self, seq: int) -> tuple:
        """Keep the message every group is done with for a replay: no group holds it, and it has
        no expiry (retention decides when it goes). Its (key, expires_at), for the queue's indexes."""
        row = seq - self.base
        expires_at = self.expires_at[row]
        size = self.sizes[row]
        self.pending[row] = 0
        self.received[row] = RETAINED
        self.expires_at[row] = 0
        self.count -= 1
        self.bytes -= size
        self.retained += 1
        self.retained_bytes += size
        if row < self.retained_from:
            self.retained_from = row
        return self.keys.get(seq) if self.keys else None, None if expires_at == NO_EXPIRY else expires_at

    def revive(self, seq: int) -> None:
        """A retained message is held by one group again (a seek, a group that starts before it)."""
        row = seq - self.base
        size = self.sizes[row]
        self.pending[row] = 1
        self.received[row] = RECEIVED
        self.retained -= 1
        self.retained_bytes -= size
        self.count += 1
        self.bytes += size

    def is_retained(self, seq: int) -> bool:
        row = seq - self.base
        return 0 <= row < len(self.received) and self.received[row] == RETAINED

    def oldest_retained(self):
        """The lowest seq of a retained row, or None."""
        if not self.retained:
            return None
        row = self.received.find(RETAINED_FLAG, max(self.head, self.retained_from))
        self.retained_from = row          # (found at C speed from where the last search ended)
        return self.base + row

    def stored_from(self, seq: int) -> list:
        """The seqs of the stored rows (held by a group, or retained) from `seq` on, in order, found
        at C speed among the tombstones: a replay's cost is what it replays."""
        row = max(self.head, seq - self.base)
        if not (self.count or self.retained) or row >= len(self.pending):
            return []
        live = set()
        with memoryview(self.pending) as pending, pending[row:].cast("B") as raw:
            width = self.pending.itemsize
            for found in NONZERO.finditer(raw):
                live.add(found.start() // width)
        rows = live
        if self.retained:
            find, at = self.received.find, row
            at = find(RETAINED_FLAG, at)
            while at != -1:
                rows.add(at - row)
                at = find(RETAINED_FLAG, at + 1)
        first = self.base + row
        return [first + at for at in sorted(rows)]

    def first_put_at_or_after(self, time_ms: int):
        """The lowest stored seq put at or after log time `time_ms`, or None. Stored put times grow
        with seq (log time never goes back), so a binary search, whose probes step over
        tombstones to the next stored row."""
        pending, received, put_at, end = self.pending, self.received, self.put_at, len(self.pending)

        def next_stored(row: int) -> int:
            while row < end and not pending[row] and received[row] != RETAINED:
                row += 1
            return row
        # stored rows before `low` were put before time_ms; stored rows from `high` on, at or after it
        low, high = self.head, end
        while low < high:
            mid = (low + high) // 2
            probe = next_stored(mid)
            if probe >= high:
                high = mid                   # nothing stored in [mid, high)
            elif put_at[probe] >= time_ms:
                high = probe
            else:
                low = probe + 1
        row = next_stored(low)
        return self.base + row if row < end and (self.count or self.retained) else None

    def stored_count_from(self, seq: int) -> int:
        """How many stored rows (held by a group, or retained) there are from `seq` on, counted at
        C speed among the tombstones."""
        row = max(self.head, seq - self.base)
        if row == self.head:
            return self.count + self.retained
        if row >= len(self.pending):
            return 0
        tail = len(self.pending) - row
        return tail - self.pending[row:].count(0) + self.received[row:].count(RETAINED)

    def remove(self, seq: int) -> tuple:
        """Leave a tombstone; cut the dead rows ahead of the head when they are many.
        The removed message's (key, expires_at), for the queue's indexes."""
        row = seq - self.base
        expires_at = self.expires_at[row]
        key = self.keys.pop(seq, None) if self.keys else None
        size = self.sizes[row]
        if self.received[row] == RETAINED:
            self.retained -= 1
            self.retained_bytes -= size
        else:
            self.count -= 1
            self.bytes -= size
        self.tally.bytes -= size
        # A tombstone holds zeros whatever the message held: a replica restored
        # from an older snapshot (whose gaps become zeros) must snapshot alike.
        if self.bodies:
            self.bodies.pop(seq, None)
        put_at, expiry, index = self.put_at, self.expires_at, self.ref_index
        # (each offset column's 0 written in place: every ack takes this path)
        put_at.held[row], expiry.held[row], index.held[row] = put_at.zero, expiry.zero, index.zero
        self.sizes[row] = self.pending[row] = self.received[row] = self.priority[row] = 0
        self.ref_offset[row] = self.ref_length[row] = self.ref_kind[row] = 0
        if self.headers:
            self.headers.pop(seq, None)
        if self.shows_at:
            self.shows_at.pop(seq, None)
        if not (self.count or self.retained):
            self.clear(self.base + len(self.pending))
        elif row == self.head:
            self._step_head()
        return key, None if expires_at == NO_EXPIRY else expires_at

    def _step_head(self) -> None:
        pending, received, head = self.pending, self.received, self.head
        while not pending[head] and received[head] != RETAINED:
            head += 1
        self.head = head
        if head >= TRIM_MIN and 2 * head >= len(pending):
            for column in self._columns():
                del column[:head]
            self.base += head
            self.retained_from = max(0, self.retained_from - head)
            self.head = 0

    def clear(self, base: int) -> None:
        """No stored row: start again, empty, at `base`."""
        self.tally.bytes -= self.bytes + self.retained_bytes
        self.base, self.head, self.count, self.bytes = base, 0, 0, 0
        self.retained = self.retained_bytes = self.retained_from = 0
        for column in self._columns():
            del column[:]

    def _columns(self) -> tuple:
        return (self.ref_index, self.ref_offset, self.ref_length, self.ref_kind,
                self.put_at, self.expires_at, self.sizes, self.pending, self.received, self.priority)

    def count_into(self, tally: Tally) -> None:
        """Count these rows' bytes into `tally` from now on (a restored queue joins its machine's)."""
        self.tally = tally
        tally.bytes += self.bytes + self.retained_bytes

    def _append_no_reference(self) -> None:
        self.ref_index.append(0)
        self.ref_offset.append(0)
        self.ref_length.append(0)
        self.ref_kind.append(0)

    # ---- in order --------------------------------------------------------------------------
    def first_seq(self):
        """The lowest stored seq (held by a group, or retained), or None."""
        return self.base + self.head if self.count or self.retained else None

    def seqs(self) -> list:
        """Every seq a group holds, in order (retained ones aside)."""
        head, base = self.head, self.base
        return list(compress(range(base + head, base + len(self.pending)), self.pending[head:]))

    def log_indexes(self) -> set:
        """The log indexes the stored bodies' references name (0 among them when some body has none)."""
        return self.ref_index.distinct(self.head)

    # ---- where the bodies lie (engine/relocation.py) ---------------------------------------------
    def live_bytes_by_entry(self, seq: int, limit: int, indexes: range, totals: dict,
                            per_message: int = 0) -> int | None:
        """Add the body bytes of the stored messages from `seq` on, at most `limit` rows, and
        `per_message` for each, to `totals` by the log index their reference names, those in
        `indexes`; the seq to go on from, None past the last row."""
        start = max(seq - self.base, self.head)
        stop = min(start + limit, len(self.pending))
        column = self.ref_index
        if column.base is not None and start < stop:
            zero, base, get = column.zero, column.base, totals.get
            low, high = indexes.start - base, indexes.stop - base      # the range as the column holds it
            # row by row, not by runs: where each message has an entry of its own, a run's
            # bookkeeping cost ten times a row's
            with tail(column.held, start) as held, held[:stop - start] as part, \
                    tail(self.ref_length, start) as lengths, lengths[:stop - start] as sizes:
                for offset, size in zip(part, sizes):
                    if offset != zero and low <= offset < high:
                        totals[offset + base] = get(offset + base, 0) + size + per_message
        return self.base + stop if stop < len(self.pending) else None

    def references_into(self, indexes: set, found: list) -> None:
        """Append (seq, reference) of the stored messages whose reference names one of `indexes` to `found`."""
        column = self.ref_index
        if column.base is None or not (self.count or self.retained):
            return
        zero, base, head = column.zero, column.base, self.head
        wanted = {index - base for index in indexes}                    # as the column holds them
        with tail(column.held, head) as held:
            rows = [head + at for at, offset in enumerate(held) if offset != zero and offset in wanted]
        first, offsets, lengths, kinds = self.base, self.ref_offset, self.ref_length, self.ref_kind
        found.extend((first + row, BodyRef(self.ref_index[row], offsets[row], lengths[row], kinds[row]))
                     for row in rows)

    def expiries(self) -> list:
        """(expires_at, seq) of every stored message with an expiry (a tombstone has none)."""
        base = self.base
        return [(expires_at, base + row) for row, expires_at in self.expires_at.nonzero()]

    # ---- snapshot ----------------------------------------------------------------------------
    # Version 9 on: the columns themselves, each as its runs, from the first
    # live row to the tail, tombstones included, so that a replica restored
    # from a snapshot takes the same snapshot as the one that wrote it,
    # whatever dead rows each still holds ahead of its head.  Version 10 adds
    # the references' columns (their offsets as 4-byte little-endian values,
    # which restore as one copy; the rest as runs) and holds the bodies
    # without a reference as [rows after the head, bodies] instead of the
    # list of every row's body.  Version 17 adds the priorities (runs: a put's messages mostly
    # share one), and a retained row is one whose received value is RETAINED.
    def to_state(self) -> list:
        head, first = self.head, self.base + self.head
        unreferenced = sorted(self.bodies)
        return [first, [[seq - first for seq in unreferenced], [self.bodies[seq] for seq in unreferenced]],
                self.put_at.runs(head), self.expires_at.runs(head),
                *(runs_of(column, head) for column in (self.sizes, self.pending, self.received)),
                [list(self.keys), list(self.keys.values())],
                [list(self.headers), list(map(dict, self.headers.values()))],
                [list(self.shows_at), list(self.shows_at.values())],
                self.ref_index.runs(head), LittleEndian(self.ref_offset, head),
                runs_of(self.ref_length, head), runs_of(self.ref_kind, head), runs_of(self.priority, head)]

    @classmethod
    def from_state(cls, state: list, next_seq: int, version: int) -> "Rows":
        base, bodies, put_at, expires_at, sizes, pending, received, keys, headers, shows_at = state[:10]
        rows = cls(base)
        _from_runs(rows.put_at, put_at)
        _from_runs(rows.expires_at, expires_at)
        _from_runs(rows.sizes, sizes)
        _from_runs(rows.pending, pending)
        _from_runs(rows.received, received)
        if version >= 10:
            ref_index, ref_offset, ref_length, ref_kind = state[10:14]
            _from_runs(rows.ref_index, ref_index)
            from_little_endian(rows.ref_offset, ref_offset)
            _from_runs(rows.ref_length, ref_length)
            _from_runs(rows.ref_kind, ref_kind)
            rows.bodies = {base + row: body for row, body in zip(*bodies)}
        else:
            rows.bodies = {base + row: body for row, body in enumerate(bodies) if rows.pending[row]}
            for _ in range(len(rows.pending)):
                rows._append_no_reference()
        if version >= 17:
            _from_runs(rows.priority, state[14])
        else:
            rows.priority = bytearray(len(rows.pending))
        rows.keys = dict(zip(*keys))
        rows.headers = {seq: tuple(pairs.items()) for seq, pairs in zip(*headers)}
        rows.shows_at = dict(zip(*shows_at))
        rows.count = len(rows.pending) - rows.pending.count(0)
        rows.retained = rows.received.count(RETAINED)
        if rows.retained:
            rows.retained_bytes = sum(compress(rows.sizes, map(RETAINED.__eq__, rows.received)))
        rows.bytes = sum(rows.sizes) - rows.retained_bytes       # a tombstone's size is 0
        if not (rows.count or rows.retained):
            rows.clear(next_seq)
        return rows

    @classmethod
    def from_message_columns(cls, columns: list, next_seq: int) -> "Rows":
        """Rows from a snapshot of version 4 to 8: one list per field of the stored messages, in seq order
        (seq, body, key, headers as a dict, put_at, visible_at, expires_at, size, pending, received)."""
        seqs, bodies, keys, headers, put_at, visible_at, expires_at, sizes, pending, received = columns
        rows = cls(seqs[0] if seqs else next_seq)
        for at, seq in enumerate(seqs):
            while rows.base + len(rows.pending) < seq:      # a removed message's tombstone
                rows._append_tombstone()
            rows.append(seq, bodies[at], keys[at], None if headers[at] is None else tuple(headers[at].items()),
                        put_at[at], expires_at[at], sizes[at], pending[at])
            if received[at]:
                rows.received[-1] = 1
            if visible_at[at] != put_at[at]:
                rows.shows_at[seq] = visible_at[at]
        while rows.count and rows.base + len(rows.pending) < next_seq:
            rows._append_tombstone()
        return rows

    def _append_tombstone(self) -> None:
        self._append_no_reference()
        for column in (self.put_at, self.expires_at, self.sizes, self.pending):
            column.append(0)
        self.received.append(0)
        self.priority.append(0)
