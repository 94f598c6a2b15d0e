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
snapshot replaces. A follower receives the file byte for byte and checks it
whole (``check``): anything but exactly the two intact records and the
carried entries is a damaged snapshot, refused before the state machine sees it.

Reads check what they read (engine.storage.damage): a node's own snapshot is
loaded only if its header and state are intact and its records end where
the file does (``read``); each carried entry is checked as it is read back
(``LiveEntries``: DamagedRecord, and a repair from a replica writes the
intact copy back in place), so a damaged one is never carried into the
node's next snapshot with a fresh checksum; a shipment checks every record
it copies (``Shipment``).
"""

from __future__ import annotations

import os
import zlib
from bisect import bisect_left
from itertools import chain
from pathlib import Path
from typing import BinaryIO, Callable

import cbor2

from . import records
from .damage import DamagedRecord, intact_payload, write_in_place

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
    """(header, state bytes, its live entries); ValueError naming the file if its header or state
    is damaged or its records do not end where the file does. A carried entry is checked as it is
    read (``LiveEntries``): one damaged is repaired from a replica, not a reason to lose the state."""
    try:
        header, state = records.read_file(path, _magic(path), first=2)
        entries = LiveEntries(path)
        return cbor2.loads(header), state, entries
    except (ValueError, AttributeError) as exc:   # DamagedFile, bad CBOR, a header that is not a map
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

    Opening one walks the records' lengths (a pread of 4 bytes each), which must end where the
    file does; each carried entry's record is checked as it is read (``get``; DamagedRecord if it
    fails), and a damaged one is written back from an intact copy (``repair``). The descriptor
    keeps the file readable after a newer snapshot replaces it, until ``close``."""

    def __init__(self, path: str | Path | None = None):
        self._fd = None
        self._path = path
        self._places: dict[int, tuple[int, int]] = {}      # index -> (offset of the record, its length)
        self._indexes: list[int] = []                       # of the carried entries, ascending
        self.in_journal: list[int] = []
        if path is None:
            return
        (header,) = records.read_file(path, _magic(path), first=1)
        decoded = cbor2.loads(header)
        self.in_journal = decoded.get("journal", [])
        self._fd = os.open(path, os.O_RDWR)     # a repair writes into the file read here
        try:
            state, self._places = _places(self._fd, header, decoded.get("entries", []))
            end, size = sum(self._places[decoded["entries"][-1]] if self._places else state), \
                os.fstat(self._fd).st_size
            if end != size:
                raise records.DamagedFile(f"{path}: its records end at {end} of {size} bytes")
        except BaseException:
            self.close()
            raise
        self._indexes = sorted(self._places)
        if not self._places:
            self.close()

    def next_carried(self, index: int) -> int | None:
        """The first index at or after `index` of an entry carried, None past the last."""
        k = bisect_left(self._indexes, index)
        return self._indexes[k] if k < len(self._indexes) else None

    def carries(self, index: int) -> bool:
        return index in self._places

    def carried_bytes(self) -> int:
        return sum(length for _, length in self._places.values())

    def get(self, index: int) -> bytes | None:
        """The carried entry at log index `index`, checked; None if the file carries no such entry."""
        payload = self._read(index)
        return None if payload is None else bytes(payload)

    def check(self, index: int) -> int | None:
        """Read the carried entry's record back and check it (the scrubber): its length, None if not
        carried; DamagedRecord if it fails."""
        return None if self._read(index) is None else self._places[index][1]

    def _read(self, index: int) -> memoryview | None:
        place = self._places.get(index)
        if place is None:
            return None
        offset, length = place
        payload = intact_payload(os.pread(self._fd, length, offset))
        if payload is None:
            raise DamagedRecord(index, f"snapshot {self._path}: carried entry at offset {offset}")
        return payload

    def repair(self, index: int, entry: bytes) -> bool:
        """Write carried entry `index`'s record back in place from an intact copy: True once it is
        synced and reads back intact; False if not carried, or if its record would not fill the
        damaged one's place exactly."""
        place = self._places.get(index)
        record = records.encode(entry)
        if place is None or len(record) != place[1]:
            return False
        write_in_place(self._fd, place[0], record, self._path)
        try:
            return self._read(index) is not None
        except DamagedRecord:
            return False

    def stored_bytes(self, index: int) -> int | None:
        """The length of the record that carries the entry at `index`; None if none does."""
        place = self._places.get(index)
        return None if place is None else place[1]
    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Shipment:
    """A snapshot file as its followers are sent it: every live entry carried, those it names
    read from this node's journal (`entry_at`) as the stream reaches them. A file-like object
    (``read``) for pysyncobj's transmission, over the file as it was when the shipment began
    (the open file keeps it if a newer snapshot replaces it; pysyncobj drops the shipment, and
    the file closes, when the last chunk is read or a newer snapshot restarts transmissions).

    Every record copied from the file is checked as it streams, and its last chunk is sent only
    if the record is intact: a damaged one ends the shipment (DamagedRecord naming a carried
    entry, DamagedFile for the header or the state), once `on_damage` is told of it; pysyncobj
    starts the shipment over at a later append. A follower checks what it receives whole too
    (``check``), but a damaged record sent would be sent again at every append."""

    CHUNK = 1 << 20

    def __init__(self, path: str | Path, entry_at: Callable[[int], bytes],
                 on_damage: Callable[[records.DamagedFile], None] | None = None):
        self._file = open(path, "rb")
        self._pending = bytearray()
        self._on_damage = on_damage
        try:
            fd = self._file.fileno()
            at = records.FILE_HEADER.size
            length = records.RECORD_HEADER.size + int.from_bytes(os.pread(fd, 4, at), "little")
            raw = intact_payload(os.pread(fd, length, at))
            if raw is None:
                raise records.DamagedFile(f"snapshot {path}: its header record is damaged")
            header = cbor2.loads(raw)
            carried, named = header.get("entries", []), header.get("journal", [])
            header["entries"], header["journal"] = sorted([*carried, *named]), []
            state, places = _places(fd, raw, carried)
        except records.DamagedFile as damage:
            self._file.close()
            self._told(damage)
            raise
        self._parts = self._stream(fd, path, cbor2.dumps(header), state, places, header["entries"], entry_at)

    @staticmethod
    def _stream(fd, path, header: bytes, state, places, entries, entry_at):
        yield records.file_header(MAGIC) + records.encode(header)
        yield from Shipment._checked(fd, *state, lambda: records.DamagedFile(f"snapshot {path}: its state is damaged"))
        for index in entries:
            place = places.get(index)
            if place is None:
                yield records.encode(entry_at(index))
            else:
                yield from Shipment._checked(fd, *place, lambda at=place[0], index=index: DamagedRecord(
                    index, f"snapshot {path}: carried entry at offset {at}"))

    @staticmethod
    def _checked(fd, offset: int, length: int, damaged: Callable[[], records.DamagedFile]):
        """The record at `offset` (`length` bytes, its header included) in chunks, its checksum
        checked as they are read: `damaged()` is raised in place of the last chunk of one that fails."""
        header = os.pread(fd, records.RECORD_HEADER.size, offset)
        if len(header) < records.RECORD_HEADER.size:
            raise damaged()
        size, crc = records.RECORD_HEADER.unpack(header)
        if size != length - records.RECORD_HEADER.size:
            raise damaged()
        running = zlib.crc32(header[:4])
        yield header
        at, end = offset + records.RECORD_HEADER.size, offset + length
        while at < end:
            chunk = os.pread(fd, min(Shipment.CHUNK, end - at), at)
            if not chunk:
                raise damaged()
            running = zlib.crc32(chunk, running)
            at += len(chunk)
            if at >= end and running != crc:
                raise damaged()
            yield chunk
        if length == records.RECORD_HEADER.size and running != crc:
            raise damaged()

    def _told(self, damage: records.DamagedFile) -> None:
        if self._on_damage is not None:
            self._on_damage(damage)

    def read(self, size: int) -> bytes:
        try:
            while len(self._pending) < size:
                part = next(self._parts, None)
                if part is None:
                    break
                self._pending += part
        except records.DamagedFile as damage:
            self._told(damage)
            raise
        data = bytes(self._pending[:size])
        del self._pending[:size]
        return data
