"""The snapshot file: what log compaction leaves on disk, and what a follower
that lacks the compacted log is sent.

A record file (``engine.storage.records``) with magic ``RAFTQSN3`` holding exactly two
records and then one per live entry it carries:
1. CBOR ``{"last": entry, "prev": entry, "cluster": [[raft_addr, node_id], ...],
   "entries": [index, ...], "journal": [index, ...]}``: the two last applied
   log entries (``[command, index, term]``; pysyncobj keeps them as the first
   entries of the compacted log), the membership, and the live entries: a
   log entry (as the state machine applied it) that a stored body's
   reference names (statemachine/bodies.py) is either carried by the file
   ("entries") or named as one this node's journal keeps ("journal");
2. the state machine's own snapshot bytes;
3. each carried entry, in the order of "entries".
Compaction keeps in the journal's segments the entries the snapshot names
(``engine.storage.journal``), so a snapshot is the state and a list of
indexes. It carries only the live entries this node holds in no journal:
those a follower received in its leader's snapshot. A follower is sent the
file with every named entry carried (``Shipment``), so what it receives is
self-contained ("journal" empty), and ``LiveEntries`` reads the carried
entries back with pread. A ``RAFTQSN2`` file (raftq before kept journal
entries) is the same without "journal", and is read as it is.

pysyncobj writes it through its serializer hooks to a temp name, which this
module creates 0600 and fsyncs, and renames it over ``snapshot.bin``; the
journal fsyncs the file and its directory before it drops an entry the
snapshot replaces. A follower receives the file byte for byte and reads it
with the same checks: anything but exactly the two intact records and the
carried entries is a damaged snapshot, refused before the state machine sees it.
"""

from __future__ import annotations

import os
from itertools import chain
from pathlib import Path
from typing import BinaryIO, Callable

import cbor2

from . import records

MAGIC = b"RAFTQSN3"
READABLE = (MAGIC, b"RAFTQSN2")


def check_format(path: str | Path) -> None:
    """Refuse (DamagedFile) a snapshot file of another format, before pysyncobj
    would try to load it: it logs and swallows a failed load, and the node
    would then wait forever for log entries its journal no longer holds."""
    try:
        with open(path, "rb") as f:
            head = f.read(records.FILE_HEADER.size)
    except FileNotFoundError:
        return
    if not any(records.has_header(head, magic) for magic in READABLE):
        raise records.DamagedFile(
            f"{path} is not a {MAGIC.decode()} snapshot (written by an older raftq, or damaged): this node cannot "
            f"restart from its data directory; move the directory aside and the node rejoins from the leader")


def write(path: str | Path, *, last, prev, cluster: list[list[str]], state: bytes | Callable[[BinaryIO], None],
          carried: list[int] = (), entry_at: Callable[[int], bytes] | None = None,
          in_journal: list[int] = ()) -> int:
    """Write and fsync the file, carrying the entries at the `carried` indexes as `entry_at` gives
    them and naming those at `in_journal` (both ascending); returns its size. `state` is the
    state machine's snapshot, or a function that encodes it into the file it is given
    (``records.write_file``): a node's is written as it is encoded, never held whole."""
    header = cbor2.dumps({"last": list(last), "prev": list(prev), "cluster": sorted(cluster),
                          "entries": list(carried), "journal": list(in_journal)})
    return records.write_file(path, MAGIC, chain([header, state], map(entry_at, carried)))


def _magic(path: str | Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(records.FILE_HEADER.size)
    return next((magic for magic in READABLE if records.has_header(head, magic)), MAGIC)


def _header(path: str | Path) -> dict:
    (header,) = records.read_file(path, _magic(path), first=1)
    return cbor2.loads(header)


def last_entry(path: str | Path) -> tuple[int, int]:
    """(index, term) of the last log entry the snapshot covers, from its first
    record alone; ValueError naming the file if that record is damaged."""
    try:
        _, index, term = _header(path)["last"]
        return index, term
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


def check(path: str | Path, *, self_contained: bool = False) -> None:
    """ValueError naming the file unless every record of it is intact, and there are as many as its
    header says; with `self_contained`, also if it names entries it does not carry (a leader's
    snapshot must carry them all)."""
    try:
        header = _header(path)
        records.check_file(path, _magic(path), 2 + len(header.get("entries", ())))
        if self_contained and header.get("journal"):
            raise ValueError(f"it names {len(header['journal'])} live entries it does not carry")
    except (ValueError, AttributeError) as exc:   # DamagedFile, bad CBOR, a header that is not a map
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


def read(path: str | Path) -> tuple[dict, bytes, "LiveEntries"]:
    """(header, state bytes, its live entries); ValueError naming the file if it is damaged."""
    check(path)
    try:
        header, state = records.read_file(path, _magic(path), first=2)
        return cbor2.loads(header), state, LiveEntries(path)
    except ValueError as exc:   # DamagedFile, bad CBOR
        raise ValueError(f"damaged snapshot {path}: {exc}") from None


def _places(fd: int, header: bytes, carried) -> tuple[tuple[int, int], dict[int, tuple[int, int]]]:
    """(offset, length) of the state's record, and of each carried entry's record by its index,
    walking the records' lengths only (a pread of 4 bytes each)."""
    def record_at(offset: int) -> tuple[int, int]:
        return offset, records.RECORD_HEADER.size + int.from_bytes(os.pread(fd, 4, offset), "little")

    state = record_at(records.FILE_HEADER.size + records.RECORD_HEADER.size + len(header))
    places, offset = {}, sum(state)
    for index in carried:
        places[index] = record_at(offset)
        offset = sum(places[index])
    return state, places


class LiveEntries:
    """The live entries a snapshot file carries after its state, read back with pread, and the
    indexes of those it names as kept by this node's journal (``in_journal``).

    Opening one walks the records' lengths only: the file is one this node
    wrote and synced, or checked whole (``read``).  The descriptor keeps the
    file readable after a newer snapshot replaces it, until ``close``."""

    def __init__(self, path: str | Path | None = None):
        self._fd = None
        self._places: dict[int, tuple[int, int]] = {}      # index -> (offset of the record, its length)
        self.in_journal: list[int] = []
        if path is None:
            return
        (header,) = records.read_file(path, _magic(path), first=1)
        decoded = cbor2.loads(header)
        self.in_journal = decoded.get("journal", [])
        if not decoded.get("entries"):
            return
        self._fd = os.open(path, os.O_RDONLY)
        _, self._places = _places(self._fd, header, decoded["entries"])

    def get(self, index: int) -> bytes | None:
        place = self._places.get(index)
        if place is None:
            return None
        offset, length = place
        return os.pread(self._fd, length - records.RECORD_HEADER.size, offset + records.RECORD_HEADER.size)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Shipment:
    """A snapshot file as its followers are sent it: every live entry carried, those it names
    read from this node's journal (`entry_at`) as the stream reaches them. A file-like object
    (``read``) for pysyncobj's transmission, over the file as it was when the shipment began
    (the open file keeps it if a newer snapshot replaces it; pysyncobj drops the shipment, and
    the file closes, when the last chunk is read or a newer snapshot restarts transmissions)."""

    CHUNK = 1 << 20

    def __init__(self, path: str | Path, entry_at: Callable[[int], bytes]):
        self._file = open(path, "rb")
        self._pending = bytearray()
        fd = self._file.fileno()
        at = records.FILE_HEADER.size
        raw = os.pread(fd, int.from_bytes(os.pread(fd, 4, at), "little"), at + records.RECORD_HEADER.size)
        header = cbor2.loads(raw)
        carried, named = header.get("entries", []), header.get("journal", [])
        header["entries"], header["journal"] = sorted([*carried, *named]), []
        state, places = _places(fd, raw, carried)
        self._parts = self._stream(fd, cbor2.dumps(header), state, places, header["entries"], entry_at)

    @staticmethod
    def _stream(fd, header: bytes, state, places, entries, entry_at):
        yield records.file_header(MAGIC) + records.encode(header)
        yield from Shipment._copy(fd, *state)
        for index in entries:
            place = places.get(index)
            if place is None:
                yield records.encode(entry_at(index))
            else:
                yield from Shipment._copy(fd, *place)

    @staticmethod
    def _copy(fd, offset: int, length: int):
        end = offset + length
        while offset < end:
            chunk = os.pread(fd, min(Shipment.CHUNK, end - offset), offset)
            offset += len(chunk)
            yield chunk

    def read(self, size: int) -> bytes:
        while len(self._pending) < size:
            part = next(self._parts, None)
            if part is None:
                break
            self._pending += part
        data = bytes(self._pending[:size])
        del self._pending[:size]
        return data
