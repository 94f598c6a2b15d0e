"""The dedup window of one queue: the idempotency ids put within its
``dedup_window_ms``, at about 28 bytes each (a dict of the ids cost about 280).

An id is kept as a 96-bit hash of its UTF-8 bytes (the first 12 bytes of its
BLAKE2b-512) in two places:

- a 16-byte *record* in a bucket: the hash, then the low 32 bits of the seq
  the id was first put with (``RECORD``);
- a 10-byte *entry* in a FIFO in put order: the hash's first 32 bits (which
  bucket), the low 32 bits of the put time, the id's UTF-8 length, which is
  what the budget (``forget_beyond``, the node option ``--max-dedup-bytes``)
  counts, as it did when the ids themselves were kept.

Lookup.  Buckets are found by linear hashing on the hash's first 32 bits:
there are ``2**level + split`` buckets, and bucket ``split`` splits in two
each time the window holds more than ``LOAD`` ids per bucket, so a bucket
holds about ``LOAD`` records and growing moves one bucket at a time (never a
pause that rehashes the whole window on the thread that applies entries).
A lookup is one ``bytearray.find`` of the 12 hash bytes in one bucket; a
match that does not start a record is skipped.

Expiry.  Ids enter in log-time order, so they leave in that order: the
oldest is the FIFO's head, and the first record of its bucket (a bucket
keeps its records in put order, and a split keeps that order).

The 32-bit fields stay exact:
- put time: an entry's is less than 2**32 ms (49 days) after the entry before
  it, and is rebuilt from the one before; the time of an id put longer than
  that after the one before it is kept whole in ``far_puts``;
- seq: rebuilt from its low 32 bits against the newest id's seq, which is
  exact while the window spans fewer than 2**32 seqs: remembering an id
  forgets those put 2**32 (4.3 billion) or more seqs before it, as the
  budget forgets ids early.

A hash collision makes two different ids one: a put whose id has the hash of
another id in its queue's window is answered as a duplicate of that id's
message (``{"seq": its seq, "duplicate": true}``) and stores nothing.  For
one put the chance is at most n / 2**96, n the ids in the window.  The
budget bounds n: the default ``--max-dedup-bytes`` (16 MiB of id bytes, an
id at least 1 byte) keeps n <= 2**24, so at most 2**-72 (2e-22) per put: at
40 000 puts/s for a century (1.3e14 puts), 3e-8 false duplicates in all.
A window of 2**32 ids (over 100 GiB of memory) would still make it at most
2**-64 (5e-20) per put.  BLAKE2b is a cryptographic hash: an id that
collides with a given one costs about 2**96 hashes to find.

Nothing depends on the process: BLAKE2b unkeyed is the same everywhere
(Python's ``hash()`` of a string is salted per process), and every layout
decision follows from the ids put; and the snapshot holds the ids in put
order, not the buckets, so that it is the same for the same ids however the
buckets grew.
"""

from hashlib import blake2b
from struct import Struct

HASH_BYTES = 12                     # 96 bits
RECORD = Struct("<12sI")            # in a bucket: the id's hash, the low 32 bits of its seq
ENTRY = Struct("<IIH")              # in the FIFO: the hash's first 32 bits, the put time's low 32 bits, UTF-8 length
ADDRESS = Struct("<I")              # the hash's first 32 bits, which choose its bucket
LOW32 = (1 << 32) - 1
# Ids per bucket before one more bucket splits off: a lookup searches about
# this many records (1 KiB) in C, and a bucket object's own cost (about 90
# bytes) is spread over as many ids.
LOAD = 64
# The FIFO is a list of fixed chunks, allocated whole, so that a full chunk
# holds no slack; the first chunk of a window is small, each next one twice
# the last, up to the largest.
FIRST_CHUNK_BYTES = 16 * ENTRY.size
LARGEST_CHUNK_BYTES = 4096 * ENTRY.size


class DedupWindow:
    __slots__ = ("level", "split", "buckets", "fifo", "head_at", "tail_at", "count", "id_bytes", "popped",
                 "oldest_put", "newest_put", "newest_seq", "seq_floor", "far_puts")

    def __init__(self):
        self._clear()

    def _clear(self) -> None:
        self.level = 0                  # 2**level + split buckets
        self.split = 0                  # the bucket that splits next
        self.buckets = [bytearray()]    # RECORDs, each bucket in put order
        # chunks of ENTRYs: the head at fifo[0][head_at], the tail just before fifo[-1][tail_at]
        self.fifo = []
        self.head_at = 0
        self.tail_at = 0
        self.count = 0
        self.id_bytes = 0               # UTF-8 bytes of the ids held: what the budget counts
        self.popped = 0                 # entries taken off the FIFO's head since it was last empty
        self.oldest_put = None          # the log time the oldest id was put at
        self.newest_put = None
        self.newest_seq = None
        self.seq_floor = None           # at most the oldest id's seq: a check that costs nothing on most puts
        # FIFO position (counting `popped`) -> put time of an id put 2**32 ms or more after the one before
        self.far_puts = {}

    def __len__(self) -> int:
        return self.count

    def __contains__(self, mid: str) -> bool:
        return self._locate(mid)[4] >= 0

    def _locate(self, mid: str) -> tuple:
        """(the id's hash, its first 32 bits, the id's UTF-8 length, its bucket,
        the offset of its record there or -1)."""
        raw = mid.encode()
        digest = blake2b(raw).digest()[:HASH_BYTES]     # (the first 12 bytes of BLAKE2b-512: faster than BLAKE2b-96)
        address = ADDRESS.unpack_from(digest)[0]
        index = address & ((1 << self.level) - 1)      # (_bucket's, inline: a lookup per put)
        if index < self.split:
            index = address & ((2 << self.level) - 1)
        bucket = self.buckets[index]
        at = bucket.find(digest)
        while at > 0 and at % RECORD.size:      # a match across two records
            at = bucket.find(digest, at + 1)
        return digest, address, len(raw), bucket, at

    def _bucket(self, address: int) -> bytearray:
        index = address & ((1 << self.level) - 1)
        if index < self.split:
            index = address & ((2 << self.level) - 1)
        return self.buckets[index]

    def _seq(self, bucket: bytearray, at: int) -> int:
        low = int.from_bytes(bucket[at + HASH_BYTES:at + RECORD.size], "little")
        return self.newest_seq - ((self.newest_seq - low) & LOW32)

    def _oldest_seq(self) -> int:
        address = ENTRY.unpack_from(self.fifo[0], self.head_at)[0]
        return self._seq(self._bucket(address), 0)

    def remember(self, mid: str, seq: int, clock: int):
        """The seq `mid` was put with within the window; or None, having
        remembered `mid` as put with `seq` at log time `clock` (which is never
        before the last id's)."""
        digest, address, length, bucket, at = self._locate(mid)
        if at >= 0:
            return self._seq(bucket, at)
        if self.count and seq - self.seq_floor > LOW32:
            while self.count and seq - self._oldest_seq() > LOW32:
                self.forget_oldest()
            self.seq_floor = self._oldest_seq() if self.count else None
            bucket = self._bucket(address)
        if not self.count:
            self.oldest_put, self.seq_floor = clock, seq
        elif clock - self.newest_put > LOW32:
            self.far_puts[self.popped + self.count] = clock
        bucket += RECORD.pack(digest, seq & LOW32)
        fifo, tail_at = self.fifo, self.tail_at
        if not fifo or tail_at == len(fifo[-1]):
            fifo.append(bytearray(min(2 * len(fifo[-1]), LARGEST_CHUNK_BYTES) if fifo else FIRST_CHUNK_BYTES))
            tail_at = 0
        ENTRY.pack_into(fifo[-1], tail_at, address, clock & LOW32, length)
        self.tail_at = tail_at + ENTRY.size
        self.count += 1
        self.id_bytes += length
        self.newest_put, self.newest_seq = clock, seq
        if self.count > LOAD * len(self.buckets):
            self._split()
        return None

    def _split(self) -> None:
        """Split bucket `split` by bit `level` of the hash: the records with it
        set go to a new last bucket, each side in the order it had."""
        old = self.buckets[self.split]
        byte, bit = divmod(self.level, 8)
        stay, move = bytearray(), bytearray()
        for at in range(0, len(old), RECORD.size):
            (move if old[at + byte] >> bit & 1 else stay).extend(old[at:at + RECORD.size])
        self.buckets[self.split] = stay
        self.buckets.append(move)
        self.split += 1
        if self.split == 1 << self.level:
            self.level, self.split = self.level + 1, 0

    def expire(self, clock: int, window: int) -> None:
        """Forget every id put `window` ms or more before log time `clock`."""
        if self.count and self.oldest_put + window <= clock:
            self._forget(clock - window, self.id_bytes)

    def forget_beyond(self, max_bytes: int) -> None:
        """Forget the oldest ids until those left hold at most `max_bytes` UTF-8 bytes."""
        if self.id_bytes > max_bytes:
            self._forget(self.oldest_put - 1, max_bytes)

    def forget_oldest(self) -> None:
        self._forget(self.oldest_put - 1, self.id_bytes - 1)     # (an id is at least 1 byte)

    def _forget(self, put_at_most: int, max_bytes: int) -> None:
        """Forget the oldest id while it was put at or before `put_at_most`, or
        while the ids hold more than `max_bytes`: one loop for every way an id
        goes, its state in locals (an expiry forgets as many ids as were put)."""
        fifo, head_at, count, id_bytes, oldest_put = self.fifo, self.head_at, self.count, self.id_bytes, self.oldest_put
        buckets, low_mask, high_mask, split = self.buckets, (1 << self.level) - 1, (2 << self.level) - 1, self.split
        far_puts = self.far_puts
        head = fifo[0]
        while count and (oldest_put <= put_at_most or id_bytes > max_bytes):
            address, _, length = ENTRY.unpack_from(head, head_at)
            index = address & low_mask
            if index < split:
                index = address & high_mask
            del buckets[index][:RECORD.size]
            id_bytes -= length
            count -= 1
            if not count:
                break
            head_at += ENTRY.size
            if head_at == len(head):
                del fifo[0]
                head, head_at = fifo[0], 0
            self.popped += 1
            if far_puts and self.popped in far_puts:
                oldest_put = far_puts.pop(self.popped)
            else:
                oldest_put += (ENTRY.unpack_from(head, head_at)[1] - oldest_put) & LOW32
        if not count:
            self._clear()
            return
        self.head_at, self.count, self.id_bytes, self.oldest_put = head_at, count, id_bytes, oldest_put

    # ---- snapshot ------------------------------------------------------------------------
    def to_state(self) -> list:
        """The window in put order, whatever the layout of its buckets: a
        replica that grew its buckets through another history (one that
        restored an older release's snapshot at another log index) encodes
        the same ids alike, so replicas' digests agree.  Each id's record, its
        FIFO entry, and what the 32-bit fields are rebuilt from."""
        if not self.count:
            return []
        if len(self.fifo) == 1:
            entries = bytes(self.fifo[0][self.head_at:self.tail_at])
        else:
            entries = b"".join([self.fifo[0][self.head_at:], *self.fifo[1:-1], self.fifo[-1][:self.tail_at]])
        # A bucket holds its records in put order: its next unread one is the next FIFO entry's in it.
        records = bytearray()
        read = [0] * len(self.buckets)
        for address, _, _ in ENTRY.iter_unpack(entries):
            index = address & ((1 << self.level) - 1)
            if index < self.split:
                index = address & ((2 << self.level) - 1)
            at = read[index]
            read[index] = at + RECORD.size
            records += self.buckets[index][at:at + RECORD.size]
        return [bytes(records), entries, self.id_bytes, self.oldest_put, self.newest_put, self.newest_seq,
                [[position - self.popped, put] for position, put in self.far_puts.items()]]

    @classmethod
    def from_state(cls, state: list) -> "DedupWindow":
        window = cls()
        if not state:
            return window
        records, entries, id_bytes, oldest_put, newest_put, newest_seq, far_puts = state
        window.count = len(entries) // ENTRY.size
        buckets = -(-window.count // LOAD)          # as few as hold LOAD ids each: no split is due
        window.level = buckets.bit_length() - 1
        window.split = buckets - (1 << window.level)
        window.buckets = [bytearray() for _ in range(buckets)]
        for at in range(0, len(records), RECORD.size):
            window._bucket(ADDRESS.unpack_from(records, at)[0]).extend(records[at:at + RECORD.size])
        window.fifo = [bytearray(entries[at:at + LARGEST_CHUNK_BYTES])
                       for at in range(0, len(entries), LARGEST_CHUNK_BYTES)]
        window.tail_at = len(window.fifo[-1])
        window.id_bytes = id_bytes
        window.oldest_put, window.newest_put, window.newest_seq = oldest_put, newest_put, newest_seq
        window.far_puts = {position: put for position, put in far_puts}
        window.seq_floor = window._oldest_seq()
        return window

    @classmethod
    def from_ids(cls, ids: list) -> "DedupWindow":
        """The window of a snapshot from before version 8: [id, seq, put_at] triples in put order."""
        window = cls()
        for mid, seq, put_at in ids:
            window.remember(mid, seq, put_at)
        return window
