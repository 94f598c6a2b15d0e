"""Damage a read finds in a stored record, and an intact copy written back over it.

A disk may return wrong bytes with no error (bit rot, a misdirected or lost
write: docs/guarantees.md, "Storage faults: the read side"). So every
read of a record a node serves from -- a log entry or a kept entry of the
journal (``engine.storage.journal``), an entry a snapshot carries
(``engine.storage.snapshot_file``) -- checks it before it is used: the
record's checksum, and for a journal record the identity its payload
begins with, the entry's index and term. A record that fails raises
``DamagedRecord``, naming the log index of the entry it should hold; it is
never served, and never copied anywhere as if it were good.

Such an entry is committed (or, in a log's tail, held by the replicas that
have it) and every replica holds the same bytes for it, so it is repaired
from a replica whose copy verifies (``engine.raft.repair``): the copy's
record is the damaged one's bytes as they were written, and
``write_in_place`` puts it back at the same offset, synced before it
counts.
"""

from __future__ import annotations

from .records import DamagedFile, iter_records, pwrite_all, sync_fd


class DamagedRecord(DamagedFile):
    """The record that should hold log entry ``index`` (of term ``term``, when the reader knows
    it) fails its checks; ``where`` names the file or the part of it."""

    def __init__(self, index: int, where: str, term: int | None = None):
        super().__init__(f"{where}: the record of log entry {index} is damaged")
        self.index = index
        self.term = term
        self.where = where


def intact_payload(record: bytes) -> memoryview | None:
    """The payload of ``record`` (one whole record, header included) if it is intact and fills
    it exactly; None otherwise."""
    return next((payload for _, end, payload in iter_records(record, 0) if end == len(record)), None)


def write_in_place(fd: int, offset: int, record: bytes, what) -> None:
    """Write ``record`` over the bytes at ``offset`` of the file open at ``fd``, ``what`` (a record
    of the same length), and fdatasync it: checked as every write is (``records.pwrite_all``),
    and a failed sync is fatal (``records.sync_fd``)."""
    pwrite_all(fd, record, offset, what)
    sync_fd(fd, what, data_only=True)
