"""The snapshot file: what log compaction leaves on disk, and what a follower
that lacks the compacted log is sent.

A record file (``engine.storage.records``) with magic ``RAFTQSN2`` holding exactly two
records and then one per live entry:
1. CBOR ``{"last": entry, "prev": entry, "cluster": [[raft_addr, node_id], ...],
   "entries": [index, ...]}``: the two last applied log entries (``[command,
   index, term]``; pysyncobj keeps them as the first entries of the compacted
   log), the membership, and the indexes of the live entries;
2. the state machine's own snapshot bytes;
3. each live entry, in the order of "entries": a log entry (as the state
   machine applied it) that a stored body's reference names
   (statemachine/bodies.py). Compaction drops the entries from the journal;
   the snapshot keeps those the state still reads bodies from, and a
   follower sent the file receives them with the state (``LiveEntries``
   reads them back with pread).

pysyncobj writes it through its serializer hooks to a temp name, which this
module creates 0600 and fsyncs, and renames it over ``snapshot.bin``; the
journal fsyncs the file and its directory before it drops an entry the
snapshot replaces. A follower receives the file byte for byte and reads it
with the same checks: anything but exactly the two intact records is a
damaged snapshot, refused before the state machine sees it.
"""

from __future__ import annotations

import os
from itertools import chain
from pathlib import Path
from typing import Callable

import cbor2

from . import records

MAGIC = b"RAFTQSN2"


def check_format(path: str | Path) -> None:
    """Refuse (DamagedFile) a snapshot file of another format, before pysyncobj
    would try to load it: it logs and swallows a failed load, and the node
    would then wait forever for log entries its journal no longer holds."""
    try:
        with open(path, "rb") as f:
            head = f.read(records.FILE_HEADER.size)
    except FileNotFoundError:
        return
    if not records.has_header(head, MAGIC):
        raise records.DamagedFile(
            f"{path} is not a {MAGIC.decode()} snapshot (written by an older raftq, or damaged): this node cannot "
            f"restart from its data directory; move the directory aside and the node rejoins from the leader")


def write(path: str | Path, *, last, prev, cluster: list[list[str]], state: bytes,
          live: list[int] = (), entry_at: Callable[[int], bytes] | None = None) -> int:
    """Write and fsync the file, with the entries at the `live` indexes as `entry_at` gives them;
    returns its size."""
    header = cbor2.dumps({"last": list(last), "prev": list(prev), "cluster": sorted(cluster),
                          "entries": list(live)})
    return records.write_file(path, MAGIC, chain([header, state], map(entry_at, live)))


def last_entry(path: str | Path) -> tuple[int, int]:
    """(index, term) of the last log entry the snapshot covers, from its first
    record alone; ValueError naming the file if that record is damaged."""
    try:
        _, index, term = cbor2.loads(records.read_file(path, MAGIC, first=1)[0])["last"]
        return index, term
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


def check(path: str | Path) -> None:
    """ValueError naming the file unless every record of it is intact, and there are as many as its
    header says."""
    try:
        (header,) = records.read_file(path, MAGIC, first=1)
        records.check_file(path, MAGIC, 2 + len(cbor2.loads(header).get("entries", ())))
    except (ValueError, AttributeError) as exc:   # DamagedFile, bad CBOR, a header that is not a map
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


def read(path: str | Path) -> tuple[dict, bytes, "LiveEntries"]:
    """(header, state bytes, its live entries); ValueError naming the file if it is damaged."""
    check(path)
    try:
        header, state = records.read_file(path, MAGIC, first=2)
        return cbor2.loads(header), state, LiveEntries(path)
    except ValueError as exc:   # DamagedFile, bad CBOR
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


class LiveEntries:
    """The live entries a snapshot file holds after its state, read back with pread.

    Opening one walks the records' lengths only (a pread of 8 bytes each): the
    file is one this node wrote and synced, or checked whole (``read``).  The
    descriptor keeps the file readable after a newer snapshot replaces it,
    until ``close``."""

    def __init__(self, path: str | Path | None = None):
        self._fd = None
        self._places: dict[int, tuple[int, int]] = {}      # index -> (offset, length)
        if path is None:
            return
        (header,) = records.read_file(path, MAGIC, first=1)
        live = cbor2.loads(header).get("entries", ())
        if not live:
            return
        self._fd = os.open(path, os.O_RDONLY)
        offset = records.FILE_HEADER.size + records.RECORD_HEADER.size + len(header)
        offset += records.RECORD_HEADER.size + self._length_at(offset)        # the state
        for index in live:
            length = self._length_at(offset)
            self._places[index] = (offset + records.RECORD_HEADER.size, length)
            offset += records.RECORD_HEADER.size + length

    def _length_at(self, offset: int) -> int:
        return int.from_bytes(os.pread(self._fd, 4, offset), "little")

    def get(self, index: int) -> bytes | None:
        place = self._places.get(index)
        return None if place is None else os.pread(self._fd, place[1], place[0])

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
