"""The Raft log on disk: checksummed records in append-only segment files.

pysyncobj 0.3.17's own FileJournal never fsyncs and has no checksums
(docs/guarantees.md, "What pysyncobj 0.3.17 lacks"). This journal implements
the same interface (pysyncobj.journal.Journal) so that pysyncobj keeps driving
the protocol while every acknowledgement rests on bytes that reached the disk.

Layout of the directory:

- ``seg-<seq>.log``: record files (``engine.storage.records``: header with the
  segment's sequence number as its tag, then checksummed records) whose
  payloads are ``<u64 index><u64 term><command>``. A new segment is started
  once the current one passes ``segment_bytes``, so compaction
  (deleteEntriesTo) unlinks whole dead segments instead of rewriting the
  live log.
- ``meta.rec`` and ``meta.copy.rec``: two copies of one record holding
  currentTerm, votedFor, commit index, where the live log starts (segment,
  offset, and the index of the entry there: damage to that very record names
  no index of its own), an index the log must reach again before this node votes (below,
  "Start-up") and a sequence number, as JSON. Each write overwrites both in
  place, in turn, each synced before the other is written (as superblocks
  are kept): a crash or a damaged sector spoils at most one copy, and the
  newer whole one holds what was last acted on or what was about to be.
  Both damaged, the journal refuses to open (``records.DamagedFile``)
  rather than start from term 0, which could vote twice in one term.
  Written in place, meta needs no new room on a full disk.
- ``kept.rec``: the compacted entries kept for the snapshot (below), replaced
  atomically (temp file, fsync, rename, directory fsync).

Kept entries. A stored message's body is a reference into the log entry that
carried it (statemachine/bodies.py), and the snapshot names the entries the
state still reads bodies from instead of copying them
(``engine.storage.snapshot_file``). Compaction (``deleteEntriesTo``,
``clear``) therefore keeps, of the entries it drops, those the durable
snapshot names (``retain``): their segments stay on disk, their bytes leave
RAM, and ``kept.rec`` maps each one's index to (segment, offset, record
length) in arrays; ``command`` reads one back with pread. A segment below the
live log that holds no kept entry is unlinked; one whose kept records fill
less than half of it is rewritten with only them (``_rewrite``: temp file,
fsync, rename over, directory fsync, then the new offsets into ``kept.rec``),
the most dead one at each compaction.
``kept.rec`` records each kept segment's size: at open, a kept segment of
another size (a crash between a rewrite's rename and the new offsets) is
scanned again for its entries, and a rewrite's leftover temp file is removed.

Entries in memory. Only each entry's term and where its record lies are
held for the whole log; its command is read back from the segment with pread
(from the page cache, mostly) unless it is among the newest appended ones,
whose commands are kept up to ``recent_bytes`` (the ones about to be sent to
followers and applied), or the first entry, whose command pysyncobj reads on
every append it sends. Before, every command stayed in RAM until compaction,
which by then held up to ``compaction_min_bytes`` (32-48 MiB) per node
(issue 25).

Every record read back (``command``, the log's entries, ``check``, ``copy``)
is checked before it is used: its checksum, and the index and term it
begins with against those the journal holds for it (a kept entry's term is
kept in ``kept.rec`` too), so bit rot, a misdirected write and a lost one
(a stale record of another term) all fail the same way: DamagedRecord,
told to ``on_damage`` (``engine.storage.damage``). ``repair`` writes an
intact copy, from a replica, back in place.

Start-up: a torn tail from damage. At open, records are read from the
recorded start; the first record with a bad checksum, a short read or an
index that does not follow its predecessor ends the good log. Zero bytes
after a segment's last record are the unused part of its preallocation, not
damage: they are trimmed quietly. Anything else is one of two things:

- a torn write (a crash while writing): what no sync covered, so never
  acknowledged -- only ever at the end of the last segment. It is cut.
- damage (a flipped or lost sector, a misdirected write) of records a sync
  made durable, which this node may have acknowledged: it is in a segment
  before the last (each is synced when the next is started), or a sync
  mark after it says that it was synced. Sync marks are records that are
  not entries (index ``SYNC_MARK``): each append after a sync starts with
  one naming the last index that sync made durable.

Damage is never taken for the end of the log (Alagappan et al.,
"Protocol-Aware Recovery for Consensus-Based Storage", FAST '18): the node
gives up the damaged entry and everything after it -- it takes them again
from the leader, as a follower that lags -- but first records, durably in
meta, the highest index it held durably (``regain_index``: what the later
segments and the sync marks past the damage show). Until its log holds that
index again, it does not vote or stand for election (``engine.raft.node``):
a voter never forgets an entry it acknowledged. Damage that the same index
shows on a majority of the replicas is beyond repair (docs/guarantees.md).

Preallocation: the live segment is extended ``PREALLOCATE_BYTES`` at a time
(``records.Appender``): bench/consensus_bench.py's lone commit p50 went from
1.09 ms to 1.00 ms with it. A segment is trimmed to its records when it is
rolled or closed.

Durability: ``add`` writes and fdatasyncs before it returns, unless the caller
opened a ``deferred()`` block, in which case the block's end syncs once for all
its appends (the consensus module uses this to overlap the leader's fsync with
replication and to sync a follower once per network poll, never acknowledging
before the sync). ``fsync=False`` skips data syncs (tests, benchmarks).
An ``add`` that finds no room raises ``records.InsufficientStorage`` and
changes nothing (no row, no bytes after the last record); a failed sync is
fatal (``records.SyncFailed``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Iterable, Iterator, NamedTuple

from pysyncobj.journal import Journal

from . import records
from .damage import DamagedRecord, intact_payload, write_in_place
from .records import FILE_HEADER as SEGMENT_HEADER, fsync_dir

logger = logging.getLogger(__name__)

SEGMENT_MAGIC = b"RAFTQJ\x00\x01"
META_MAGIC = b"RAFTQJM1"
KEPT_MAGIC = b"RAFTQJK1"
ENTRY_PREFIX = struct.Struct("<QQ")
_SEGMENT_NAME = re.compile(r"^seg-(\d{12})\.log$")
META_NAME = "meta.rec"
META_COPY_NAME = "meta.copy.rec"
KEPT_NAME = "kept.rec"
REWRITE_SUFFIX = ".rewrite"
PREALLOCATE_BYTES = 4 * 1024 * 1024
# Commands of the newest entries kept in memory: those being sent to the followers and
# applied, mostly (group commit's entries are 2.5 MB at most in a fill of 10 KiB messages;
# one missed is read back from the page cache).
RECENT_BYTES = 4 * 1024 * 1024


def _segment_name(seq: int) -> str:
    return f"seg-{seq:012d}.log"


def encode_record(command: bytes, idx: int, term: int) -> bytes:
    return records.encode(ENTRY_PREFIX.pack(idx, term) + command)


# The index field of a sync mark, which is no entry: its term field is the last index a sync made
# durable. No log reaches this index.
SYNC_MARK = (1 << 64) - 1


def encode_sync_mark(synced: int) -> bytes:
    return records.encode(ENTRY_PREFIX.pack(SYNC_MARK, synced))


SYNC_MARK_BYTES = len(encode_sync_mark(0))
# A sync mark found by its bytes: a length of 16, any checksum, the mark's index field.
_SYNC_MARK_BYTES_FOUND = re.compile(re.escape(records.RECORD_HEADER.pack(ENTRY_PREFIX.size, 0)[:4]) + b"...."
                                    + re.escape(ENTRY_PREFIX.pack(SYNC_MARK, 0)[:8]), re.DOTALL)
# The fewest bytes an entry's record takes: what lies between two records bounds how many
# entries were there.
MIN_ENTRY_RECORD_BYTES = records.RECORD_HEADER.size + ENTRY_PREFIX.size + 1
# Past a damaged record, the next entries' records are looked for by their index (``_intact_past``):
# within this many bytes (the largest entry's record fits), over at most this many missing entries.
_ENTRY_INDEX = struct.Struct("<Q")
INTACT_WINDOW_BYTES = 32 << 20
INTACT_MISSES = 16


class Kept(NamedTuple):
    """Compacted entries kept on disk, in index order (so their segments ascend too): for each,
    its index, segment, record offset, record length and term (0: not known, a ``kept.rec``
    written before terms were kept), which a read of its record checks."""
    indexes: array
    seqs: array
    offsets: array
    lengths: array
    terms: array

    @staticmethod
    def empty() -> "Kept":
        return Kept(array("Q"), array("I"), array("I"), array("I"), array("Q"))

    def find(self, index: int) -> int | None:
        k = bisect_left(self.indexes, index)
        return k if k < len(self.indexes) and self.indexes[k] == index else None

    def in_segment(self, seq: int) -> range:
        return range(bisect_left(self.seqs, seq), bisect_right(self.seqs, seq))


class _Place(NamedTuple):
    """Where an entry's record lies, the term it must say (0: not known), and what it is."""
    seq: int
    offset: int
    length: int
    term: int
    what: str


class DurableJournal(Journal):
    """pysyncobj's journal interface over fsynced, checksummed segment files.

    Entries are the tuples pysyncobj uses, ``(command: bytes, index, term)``;
    positions passed to deleteEntriesFrom/To are list positions, as in
    pysyncobj. One thread uses it, the engine's (pysyncobj's ticks run on its
    loop); the snapshot writer's child calls ``holds``.
    """

    def __init__(self, directory: str | Path, *, fsync: bool = True,
                 segment_bytes: int = 64 * 1024 * 1024,
                 snapshot_path: str | Path | None = None, recent_bytes: int = RECENT_BYTES,
                 noted_kind: int | None = None):
        self._dir = records.make_dir(directory)
        self._fsync = fsync
        self._segment_bytes = segment_bytes
        # Compaction and snapshot installation drop log entries that only the
        # snapshot file then holds: pysyncobj renames that file into place
        # without fsync, so it is made durable here first.
        self._snapshot_path = Path(snapshot_path) if snapshot_path else None
        # Called before any change that could make an already-queued
        # acknowledgement untrue (truncation, clear, a new term).
        self.before_rewrite: Callable[[], None] | None = None
        # Told of each damaged record a read of the log or of a kept entry finds, and whether the
        # read served something (an entry to apply or send, a body) or tidied up in the background
        # (a kept segment's rewrite): engine.raft.repair fetches an intact copy from a replica.
        self.on_damage: Callable[[DamagedRecord, bool], None] | None = None

        # The log, one row per entry from index ``_first`` on: its term and where its record
        # lies (segment, offset, record length). ``_last`` is the last index, None while empty.
        self._first = 0
        self._last: int | None = None
        self._terms = array("Q")
        self._seqs = array("I")
        self._offsets = array("Q")
        self._lengths = array("I")
        # Commands held in memory: the newest appended ones up to ``recent_bytes`` (at least
        # the last), and the first entry's (index, command).
        self._recent: OrderedDict[int, bytes] = OrderedDict()
        self._recent_bytes = 0
        self._recent_limit = recent_bytes
        self._head: tuple[int, bytes] | None = None
        self._segment_sizes: dict[int, int] = {}     # seq -> size of its records (kept segments too)
        # The indexes the durable snapshot names (``retain``), the kept
        # entries and a read descriptor per kept segment.
        self._live = array("Q")
        self._kept = Kept.empty()
        self._kept_bytes = 0                          # their records' lengths, summed
        self._kept_fds: dict[int, int] = {}
        self._deferred = 0
        self._meta_dirty = False
        self._meta_seq = 0                            # of the meta copies last written
        self._appender: records.Appender | None = None   # the live segment
        self._seq = 0
        self.syncs = 0
        self.out_of_room = False                      # the last append found no room on the disk
        # The last index a sync made durable, and the one the last sync mark named.
        self._synced: int | None = None
        self._marked: int | None = None
        # The indexes of the entries found at open whose command's first byte is
        # ``noted_kind``: what a restarted node reads its log's membership from
        # without reading every command back (engine.raft.node).
        self._noted_kind = noted_kind
        self.noted_at_open: list[int] = []

        meta = self._read_meta()
        self._term: int = meta.get("term", 0)
        self._voted_for = meta.get("voted_for")
        self._commit_index: int = meta.get("commit_index", 1)
        self._meta_seq = meta.get("seq", 0)
        # The index this node's log must reach again before it votes or stands for election: it
        # gave up entries it may have acknowledged to damage (see the module's docstring).
        self.regain_index: int | None = meta.get("regain")
        kept, kept_sizes = self._read_kept()
        self._open_log(meta.get("start"), meta.get("first"), kept, kept_sizes)
        if not meta:
            # from its first moment a journal has meta: entries without it mean it was lost
            self._write_meta(durable_now=True)

    # -- opening ---------------------------------------------------------

    def _read_meta(self) -> dict:
        """Meta from the newer of its intact copies; {} for a new journal. DamagedFile when
        neither copy is intact, or none is there for a journal that holds entries."""
        if not (self._dir / META_NAME).exists() and (self._dir / "meta.json").exists():
            # term and vote of a journal written before the record format:
            # starting from term 0 could vote twice in a term
            raise records.DamagedFile(f"{self._dir} was written by an older raftq (meta.json); this node cannot "
                                      "restart from it: move its data directory aside and it rejoins from the leader")
        copies, problems = [], []
        for name in (META_NAME, META_COPY_NAME):
            try:
                (body,) = records.read_file(self._dir / name, META_MAGIC)
                copies.append(json.loads(body))
            except FileNotFoundError:
                problems.append(f"{name} is missing")
            except ValueError as exc:     # DamagedFile, or a record that is no meta
                problems.append(f"{name} is damaged ({exc})")
        if copies:
            if any("damaged" in problem for problem in problems):
                logger.error("journal %s: one copy of its meta is damaged (%s); the other is whole and used, "
                             "and both are written again at the next change", self._dir, "; ".join(problems))
            return max(copies, key=lambda meta: meta.get("seq", 0))
        if not any("damaged" in problem for problem in problems) and self._holds_entries() \
                and not self._holds_sync_marks():
            # Written by a release before sync marks and two meta copies (7c4791e and its kind),
            # which wrote meta.rec at its first vote or term change only: a follower of a group
            # that never voted has none. It cast no vote to forget, so it starts as that release
            # did, from term 0; pysyncobj takes the leader's term at its first append.
            logger.warning("journal %s: written by an older release that kept no meta for it (it never voted); "
                           "starting from term 0 with no vote, as that release did", self._dir)
            return {}
        if any("damaged" in problem for problem in problems) or self._holds_entries():
            raise records.DamagedFile(
                f"journal {self._dir}: its meta is gone ({'; '.join(problems)}), so this node's Raft term and "
                "vote are unknown, and a node that forgot them could vote twice in one term. It cannot start "
                "from this directory: remove the node from the cluster (raftq cluster remove), empty its data "
                "directory and add it again (docs/operations.md, \"A damaged disk\")")
        return {}

    def _holds_entries(self) -> bool:
        """Whether any segment holds a record, or entries were kept: a journal with a history."""
        return (self._dir / KEPT_NAME).exists() or any(
            os.path.getsize(self._dir / _segment_name(seq)) > SEGMENT_HEADER.size for seq in self._existing_segments())

    def _holds_sync_marks(self) -> bool:
        """Whether any segment holds a sync mark: this release's journals, which write meta from
        their first moment and a mark at every append after a sync, do."""
        for seq in self._existing_segments():
            if _SYNC_MARK_BYTES_FOUND.search((self._dir / _segment_name(seq)).read_bytes()):
                return True
        return False

    def _existing_segments(self) -> list[int]:
        seqs = []
        for name in os.listdir(self._dir):
            m = _SEGMENT_NAME.match(name)
            if m:
                seqs.append(int(m.group(1)))
        return sorted(seqs)

    def _read_kept(self) -> tuple[Kept, dict[int, int]]:
        """The kept entries as ``kept.rec`` has them, and the size it recorded for each kept segment."""
        try:
            sizes, *columns = records.read_file(self._dir / KEPT_NAME, KEPT_MAGIC)
        except FileNotFoundError:
            return Kept.empty(), {}
        kept = Kept.empty()
        for column, raw in zip(kept, columns):
            column.frombytes(raw)
        if len(kept.terms) != len(kept.indexes):      # written before terms were kept: not known
            kept = kept._replace(terms=array("Q", [0]) * len(kept.indexes))
        return kept, {int(seq): size for seq, size in json.loads(sizes).items()}

    def _open_kept(self, kept: Kept, sizes: dict[int, int], below: int) -> bool:
        """Take up the kept segments below the live log's first one; True if the files changed."""
        rescan = [seq for seq, size in sizes.items()
                  if seq < below and os.path.getsize(self._dir / _segment_name(seq)) != size]
        for seq in rescan:
            # a rewrite renamed over it before it could record the new offsets
            kept = self._rescan(kept, seq)
        for name in os.listdir(self._dir):
            if name.endswith(REWRITE_SUFFIX):
                os.unlink(self._dir / name)   # a rewrite interrupted before its rename
        for seq in sizes:
            self._segment_sizes[seq] = os.path.getsize(self._dir / _segment_name(seq))
        self._use_kept(kept)
        if rescan:
            self._write_kept()
        return bool(rescan)

    def _rescan(self, kept: Kept, seq: int) -> Kept:
        """``kept`` with the offsets of segment ``seq``'s entries in the file a rewrite left: its
        kept records one after the other, in index order (``_rewrite``) -- found where their
        lengths put them, whatever a damaged record among them says; read from the file if it is
        not that rewrite's."""
        part = kept.in_segment(seq)
        offsets, lengths = array("I", kept.offsets), array("I", kept.lengths)
        size = os.path.getsize(self._dir / _segment_name(seq))
        if SEGMENT_HEADER.size + sum(lengths[part.start:part.stop]) == size:
            at = SEGMENT_HEADER.size
            for k in part:
                offsets[k], at = at, at + lengths[k]
            return kept._replace(offsets=offsets)
        data = (self._dir / _segment_name(seq)).read_bytes()
        found = {}
        for start, end, payload in records.iter_records(data):
            found[ENTRY_PREFIX.unpack_from(payload)[0]] = (start, end - start)
        for k in part:
            if kept.indexes[k] not in found:
                logger.critical("journal %s: kept entry %d is not in segment %d", self._dir, kept.indexes[k], seq)
                continue
            offsets[k], lengths[k] = found[kept.indexes[k]]
        return kept._replace(offsets=offsets, lengths=lengths)

    def _open_log(self, start: list[int] | None, first: int | None, kept: Kept, kept_sizes: dict[int, int]) -> None:
        """Read the log from ``start``, whose record holds entry ``first`` (None: unknown, the log
        was empty when meta was written)."""
        seqs = self._existing_segments()
        if start is None:
            start_seq, start_off = (seqs[0] if seqs else 1), SEGMENT_HEADER.size
        else:
            start_seq, start_off = start
        changed = False
        for seq in seqs:
            if seq < start_seq and seq not in kept_sizes:
                # left over by a compaction interrupted after its meta write
                os.unlink(self._dir / _segment_name(seq))
                changed = True
        changed |= self._open_kept(kept, kept_sizes, start_seq)
        live = [s for s in seqs if s >= start_seq]
        prev_idx = None
        for n, seq in enumerate(live):
            path = self._dir / _segment_name(seq)
            data = path.read_bytes()
            offset = min(start_off if seq == start_seq else SEGMENT_HEADER.size, len(data))
            good_end, found = self._scan(data, offset, prev_idx) \
                if records.has_header(data, SEGMENT_MAGIC, seq) else (0, [])
            for idx, term, pos, length, kind in found:
                self._append_row(idx, term, seq, pos, length)
                if kind == self._noted_kind:
                    self.noted_at_open.append(idx)
                prev_idx = idx
            self._segment_sizes[seq] = good_end
            if good_end == len(data):
                continue
            if records.zero_tail(data, good_end) and (good_end or n == len(live) - 1):
                os.truncate(path, good_end)    # unused preallocation (or a new segment that never got its header)
                if good_end:
                    continue
            self._end_log_at(live[n:], data, good_end, prev_idx, first)
            live = live[:n + 1]
            if good_end == 0:
                self._write_new_segment_file(seq)
                self._segment_sizes[seq] = SEGMENT_HEADER.size
            changed = True
            break
        if not live:
            self._write_new_segment_file(start_seq)
            self._segment_sizes[start_seq] = SEGMENT_HEADER.size
            live = [start_seq]
            changed = True
        if changed:
            fsync_dir(self._dir)
        self._seq = live[-1]
        self._open_segment()
        if self._fsync and self._last is not None:
            # What was found is durable from here on (a kill -9 leaves writes no sync covered in
            # the page cache): the next append's sync mark may say so.
            records.sync_fd(self._appender.fd, self._appender.path, data_only=True)
            self._synced = self._last
        if self.regain_index is not None and self._last is not None and self._last >= self.regain_index:
            self._regained()
        if start is not None and tuple(start) != self._log_start():
            # the recorded start no longer describes the files (damage above):
            # appends must not land before a start that reopen would skip to
            self._write_meta(durable_now=True)

    def _end_log_at(self, segments: list[int], data: bytes, good_end: int, prev_idx: int | None,
                    first: int | None) -> None:
        """The log ends at ``good_end`` of ``segments[0]`` (whose bytes are ``data``), where a
        record is torn, damaged or out of sequence; ``prev_idx`` is the last index before it, None
        when it is the log's first record, which holds entry ``first`` if meta knew it.
        Cut the log there, and if what is cut is damage rather than a torn write, first record
        the index the log must reach again before this node votes."""
        path = self._dir / _segment_name(segments[0])
        if prev_idx is not None:
            base = prev_idx
        elif first is not None:
            base = first - 1
        else:
            # The whole log is cut, from an entry no intact record names: say so from entry 1.
            # Sync marks are still believed as far as the commit index makes them plausible.
            base = self._commit_index
        first_lost = base + 1 if prev_idx is not None or first is not None else 1
        offset = max(good_end, SEGMENT_HEADER.size)
        shown = [self._synced_past(data, offset, base)]
        # entries whose records lie intact past the damage: among them those of the last sync, which
        # no mark names and this node may have acknowledged (they only raise what it must regain)
        intact = [self._intact_past(data, offset, base)]
        between = len(data) - offset          # bytes of the log from the damage to the segment scanned
        for later in segments[1:]:
            later_data = (self._dir / _segment_name(later)).read_bytes()
            shown.append(self._shown_by(later_data, later, last=later == segments[-1], base=base, between=between))
            intact.append(self._intact_past(later_data, SEGMENT_HEADER.size, None))
            between += len(later_data)
        shown = max((index for index in shown if index is not None), default=None)
        if len(segments) == 1 and (shown is None or shown < first_lost):
            logger.warning("journal %s: a torn write at offset %d of %d bytes, where the log ends (a crash while "
                           "writing, never synced nor acknowledged): cut there", path, good_end, len(data))
        else:
            regain = max(first_lost, shown or 0, *(index for index in intact if index is not None),
                         self.regain_index or 0)
            logger.error("journal %s: damaged record at offset %d (log index %d) in a part of the log a sync made "
                         "durable (synced entries up to index %d follow it). This node gives up entries %d to %d "
                         "and takes them again from the leader; until its log holds index %d again it neither "
                         "votes nor stands for election (docs/operations.md, \"A damaged disk\")",
                         path, good_end, first_lost, regain, first_lost, regain, regain)
            self.regain_index = regain
            self._write_meta(start=None if self._last is not None else (segments[0], max(good_end, SEGMENT_HEADER.size)),
                             durable_now=True)
        for later in segments[1:]:
            os.unlink(self._dir / _segment_name(later))
        if good_end:
            fd = os.open(path, os.O_RDWR)
            try:
                os.ftruncate(fd, good_end)
                records.sync_fd(fd, path)
            finally:
                os.close(fd)

    @staticmethod
    def _scan(data: bytes, offset: int, prev_idx: int | None):
        """(end of the good records, [(index, term, offset, record length, the command's first
        byte or None)]): the log ends at the first record that is torn, damaged or out of
        sequence. Sync marks among the records are stepped over."""
        found = []
        end = offset
        for start, record_end, payload in records.iter_records(data, offset):
            if len(payload) < ENTRY_PREFIX.size:
                break
            idx, term = ENTRY_PREFIX.unpack_from(payload)
            if idx == SYNC_MARK:
                if len(payload) != ENTRY_PREFIX.size:
                    break
                end = record_end
                continue
            if prev_idx is not None and idx != prev_idx + 1:
                break
            kind = payload[ENTRY_PREFIX.size] if len(payload) > ENTRY_PREFIX.size else None
            found.append((idx, term, start, record_end - start, kind))
            prev_idx, end = idx, record_end
        return end, found

    @staticmethod
    def _synced_past(data: bytes, offset: int, base: int, between: int = 0) -> int | None:
        """The highest index a sync mark at or after ``offset`` says was synced. Marks are found
        by their bytes, not by walking the records (what lies between may be damaged); one that
        names more entries than the bytes before it (and ``between`` bytes before ``offset``)
        could hold after index ``base`` is not believed (a message body may hold bytes that look
        like one)."""
        shown = None
        for found in _SYNC_MARK_BYTES_FOUND.finditer(data, offset):
            payload = records.payload_at(data, found.start())
            if payload is None or len(payload) != ENTRY_PREFIX.size:
                continue
            synced = ENTRY_PREFIX.unpack_from(payload)[1]
            if synced <= base + 1 + (between + found.start() - offset) // MIN_ENTRY_RECORD_BYTES:
                shown = synced if shown is None else max(shown, synced)
        return shown

    @classmethod
    def _intact_past(cls, data: bytes, offset: int, base: int | None) -> int | None:
        """The highest index of an entry whose record lies intact in ``data`` from ``offset`` on, in
        sequence with those before it; ``base`` is the index before the (damaged) record at
        ``offset``, or None when the records there are whole. A damaged record may hide where the
        next one starts (its length may be what is damaged): the next is found by the index its
        payload must begin with, within a window an entry's record fits in, stepping over up to
        ``INTACT_MISSES`` entries whose records are not found."""
        if base is None:
            _, found = cls._scan(data, offset, None)
            return found[-1][0] if found else None
        best, want, at, misses = None, base + 2, offset, 0
        while misses < INTACT_MISSES and at < len(data):
            found_at = data.find(_ENTRY_INDEX.pack(want), at + records.RECORD_HEADER.size,
                                 at + INTACT_WINDOW_BYTES)
            if found_at < 0:
                want, misses = want + 1, misses + 1
                continue
            start = found_at - records.RECORD_HEADER.size
            end, found = cls._scan(data, start, want - 1)
            if not found:
                at = start + 1               # the index's bytes, but not a record's: look further
                continue
            best, want, at, misses = found[-1][0], found[-1][0] + 2, end, 0
        return best

    def _shown_by(self, data: bytes, seq: int, *, last: bool, base: int, between: int) -> int | None:
        """The highest index segment ``seq`` (its bytes ``data``, ``between`` bytes of the log
        after index ``base`` before it) shows was synced: every entry of a segment before the
        last (each was synced before the next was started), and what the sync marks of the last
        say."""
        shown = self._synced_past(data, SEGMENT_HEADER.size, base, between)
        if not last and records.has_header(data, SEGMENT_MAGIC, seq):
            _, found = self._scan(data, SEGMENT_HEADER.size, None)
            if found:
                shown = max(shown or 0, found[-1][0])
        return shown

    def _append_row(self, idx: int, term: int, seq: int, offset: int, length: int) -> None:
        if self._last is None:
            self._first = idx
        self._terms.append(term)
        self._seqs.append(seq)
        self._offsets.append(offset)
        self._lengths.append(length)
        self._last = idx

    def _write_new_segment_file(self, seq: int) -> None:
        records.write_file(self._dir / _segment_name(seq), SEGMENT_MAGIC, tag=seq)

    # -- writing ---------------------------------------------------------

    def _open_segment(self) -> None:
        self._appender = records.Appender(self._dir / _segment_name(self._seq),
                                          end=self._segment_sizes[self._seq], preallocate=PREALLOCATE_BYTES)

    def _write(self, data: bytes) -> int:
        """Append ``data`` to the live segment; the offset it starts at. InsufficientStorage (or the
        write's OSError) with nothing appended."""
        offset = self._appender.append(data)
        self._segment_sizes[self._seq] = offset + len(data)
        return offset

    def _sync_data(self, force: bool = False) -> None:
        """Make appended bytes durable; ``force`` even when fsync is off."""
        if self._fsync or force:
            if self._appender.sync():
                self.syncs += 1
            self._synced = self._last

    def _roll_segment(self) -> None:
        self._sync_data(force=True)
        self._appender.trim()
        self._start_segment()

    def _start_segment(self) -> None:
        """Append to a new, empty segment from now on. InsufficientStorage with the current
        segment still the live one."""
        seq = self._seq + 1
        self._write_new_segment_file(seq)     # removed again if it fails
        fsync_dir(self._dir)
        self._appender.close()
        self._seq = seq
        self._segment_sizes[seq] = SEGMENT_HEADER.size
        self._open_segment()

    def add(self, command, idx, term):
        """Append the entry (synced before this returns, outside a ``deferred`` block). With no
        room on the disk, ``records.InsufficientStorage`` and the log as it was."""
        command = bytes(command)
        record = encode_record(command, idx, term)
        try:
            if self._segment_sizes[self._seq] >= self._segment_bytes:
                self._roll_segment()
            mark = b""
            if self._synced is not None and self._synced != self._marked:
                mark = encode_sync_mark(self._synced)
            offset = self._write(mark + record) + len(mark)
        except records.InsufficientStorage as exc:
            if not self.out_of_room:            # one line when it starts, not one per entry refused
                logger.error("journal %s: %s; entries are refused until there is room", self._dir, exc.strerror)
            self.out_of_room = True
            raise
        if self.out_of_room:
            logger.warning("journal %s: room on the disk again; entries are written again", self._dir)
            self.out_of_room = False
        if mark:
            self._marked = self._synced
        self._append_row(idx, term, self._seq, offset, len(record))
        self._recent[idx] = command
        self._recent_bytes += len(command)
        while self._recent_bytes > self._recent_limit and len(self._recent) > 1:
            self._recent_bytes -= len(self._recent.popitem(last=False)[1])
        if self.regain_index is not None and idx >= self.regain_index:
            self._regained()
        if not self._deferred:
            self._sync_data()

    @property
    def directory(self) -> Path:
        return self._dir

    def give_up_everything(self) -> None:
        """The snapshot this log's entries follow failed its checks: none of them can be applied
        without the state it held, nor can the kept entries be used. Drop them all and, as for
        damage found in the log, neither vote nor stand for election until the log holds again
        the highest index it held (the leader sends its snapshot, then what follows)."""
        regain = max(self._last or 0, self.regain_index or 0)
        self.regain_index = regain or None      # in every meta written from here on
        self.retain(())
        self.clear()
        self._write_meta(durable_now=True)

    def forget_regain(self) -> None:
        """Vote again without the entries given up to damage: no other replica holds them (a
        group of one replica)."""
        self.regain_index = None
        self._write_meta(durable_now=True)

    def _regained(self) -> None:
        """The log holds again the index it had to reach after damage: this node votes again.
        Written down with the next meta, which syncs the log first."""
        logger.warning("journal %s: the log holds index %d again, as before the damage found at start-up; "
                       "this node votes and stands for election again", self._dir, self.regain_index)
        self.regain_index = None
        self._meta_dirty = True

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Appends inside the block share one data sync, done at its end."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
            if not self._deferred:
                self._sync_data()

    def sync(self) -> None:
        self._sync_data()

    def flush(self):
        self._sync_data(force=True)

    def _prepare_rewrite(self) -> None:
        if self.before_rewrite is not None:
            self.before_rewrite()

    def _make_snapshot_durable(self) -> None:
        if self._snapshot_path is not None and self._snapshot_path.exists():
            with open(self._snapshot_path, "rb") as f:
                records.sync_fd(f.fileno(), self._snapshot_path)
            fsync_dir(self._snapshot_path.parent)

    def deleteEntriesFrom(self, entryFrom):
        if entryFrom >= len(self):
            return
        self._prepare_rewrite()
        seq, offset = self._seqs[entryFrom], self._offsets[entryFrom]
        dropped = [s for s in self._segment_sizes if s > seq]
        if dropped:
            self._appender.close()
            for s in dropped:
                os.unlink(self._dir / _segment_name(s))
                del self._segment_sizes[s]
            fsync_dir(self._dir)
            self._seq = seq
            self._open_segment()
        # A lost truncation followed by a shorter rewrite would resurrect
        # stale records with continuous indexes: truncate() syncs it now.
        self._appender.truncate(offset)
        self._segment_sizes[seq] = offset
        for column in self._rows():
            del column[entryFrom:]
        self._last = self._first + entryFrom - 1 if entryFrom else None
        self._synced = self._marked = self._last
        self._forget_commands()

    def retain(self, indexes: Iterable[int]) -> None:
        """The entries the durable snapshot names as held here, ascending: compaction keeps them."""
        self._live = array("Q", indexes)

    def holds(self, index: int) -> bool:
        """Whether ``command(index)`` finds the entry. Takes no lock: the snapshot writer's child asks."""
        last = self._last
        if last is not None and self._first <= index <= last:
            return True
        return self._kept.find(index) is not None

    def command(self, index: int) -> bytes | None:
        """The command of the entry at log index ``index``, from the log or the kept entries; None if
        neither holds it. DamagedRecord if its record fails its checks (reported to ``on_damage``)."""
        last = self._last
        if last is not None and self._first <= index <= last:
            return self._command_at(index - self._first)
        place = self._kept_place(index)
        return None if place is None else self._reported(self._read_place, index, place)

    def stored_bytes(self, index: int) -> int | None:
        """The length of the record that holds the entry at log index ``index`` (in the log or
        kept), read from no file; None if neither holds it."""
        place = self._place(index)
        return None if place is None else place.length

    def _command_at(self, position: int) -> bytes:
        """The command of the log's entry at ``position``: held, or read back from its segment."""
        index = self._first + position
        command = self._recent.get(index)
        if command is not None:
            return command
        head = self._head
        if head is not None and head[0] == index:
            return head[1]
        command = self._reported(self._read_place, index, self._log_place(position))
        if position == 0:
            self._head = (index, command)
        return command

    # -- verified reads ----------------------------------------------------
    # Every record read back is checked before it is used: its checksum, and the index and term it
    # begins with against those the journal holds for it (engine.storage.damage). Memory holds
    # only what was appended or read back intact.

    def _log_place(self, position: int) -> _Place:
        return _Place(self._seqs[position], self._offsets[position], self._lengths[position],
                      self._terms[position], "log entry")

    def _kept_place(self, index: int) -> _Place | None:
        kept = self._kept
        k = kept.find(index)
        if k is None:
            return None
        return _Place(kept.seqs[k], kept.offsets[k], kept.lengths[k], kept.terms[k], "kept entry")

    def _place(self, index: int) -> _Place | None:
        """Where the record of entry ``index`` lies, in the log or among the kept entries."""
        last = self._last
        if last is not None and self._first <= index <= last:
            return self._log_place(index - self._first)
        return self._kept_place(index)

    def _read_place(self, index: int, place: _Place) -> bytes:
        """The command the record at ``place`` holds for entry ``index``; DamagedRecord unless the
        record is intact and is that entry's."""
        fd = self._kept_fds.get(place.seq)
        if fd is not None:
            return self._verified(os.pread(fd, place.length, place.offset), index, place)
        fd = os.open(self._dir / _segment_name(place.seq), os.O_RDONLY)
        try:
            return self._verified(os.pread(fd, place.length, place.offset), index, place)
        finally:
            os.close(fd)

    def _verified(self, record: bytes, index: int, place: _Place) -> bytes:
        payload = intact_payload(record)
        said = ENTRY_PREFIX.unpack_from(payload) if payload is not None and len(payload) >= ENTRY_PREFIX.size else None
        if said is None or said[0] != index or (place.term and said[1] != place.term):
            raise DamagedRecord(index, f"journal {self._dir}: {place.what} in {_segment_name(place.seq)} "
                                       f"at offset {place.offset}", place.term or None)
        return bytes(payload[ENTRY_PREFIX.size:])

    def _reported(self, read: Callable, index: int, place: _Place) -> bytes:
        try:
            return read(index, place)
        except DamagedRecord as damage:
            if self.on_damage is not None:
                self.on_damage(damage, True)
            raise

    def check(self, index: int) -> int | None:
        """Read entry ``index``'s record back and check it (the scrubber): its length, None if
        neither the log nor the kept entries hold it; DamagedRecord if it fails (not reported)."""
        place = self._place(index)
        if place is None:
            return None
        self._read_place(index, place)
        return place.length

    def copy(self, index: int) -> tuple[int, bytes] | None:
        """(term, command) of entry ``index`` for a replica repairing its own (term 0: not known,
        a kept entry of an older ``kept.rec``); None if not held. DamagedRecord if this copy fails
        its checks too (not reported: the caller asks for its repair)."""
        place = self._place(index)
        if place is None:
            return None
        return place.term, self._read_place(index, place)

    def term_of(self, index: int) -> int | None:
        """The term of entry ``index`` as the journal holds it, without reading its record; None if
        not held or not known."""
        place = self._place(index)
        return (place.term or None) if place is not None else None

    def next_held(self, index: int) -> int | None:
        """The first index at or after `index` of an entry the log or the kept entries hold, None
        past the last (the scrubber's walk)."""
        kept = self._kept.indexes
        k = bisect_left(kept, index)
        candidates = [kept[k]] if k < len(kept) else []
        if self._last is not None and index <= self._last:
            candidates.append(max(index, self._first))
        return min(candidates, default=None)

    def repair(self, index: int, term: int | None, command: bytes) -> bool:
        """Write entry ``index``'s record back in place from an intact copy (``command`` of term
        ``term``, None if not known, from a replica whose copy verified): True once it is synced
        and reads back intact. False if the journal no longer holds the entry, or knows it by
        another term or by none, or the copy's record would not fill the damaged one's place
        exactly."""
        place = self._place(index)
        term = term or (place.term if place is not None else None)
        if place is None or not term or (place.term and place.term != term):
            return False
        record = encode_record(command, index, term)
        if len(record) != place.length:
            logger.error("journal %s: the intact copy of entry %d is %d bytes, its record here %d; not written",
                         self._dir, index, len(record), place.length)
            return False
        path = self._dir / _segment_name(place.seq)
        fd = os.open(path, os.O_WRONLY)
        try:
            write_in_place(fd, place.offset, record, path)
        finally:
            os.close(fd)
        try:
            self._read_place(index, place)
        except DamagedRecord:
            return False
        return True

    def _rows(self) -> tuple[array, ...]:
        return self._terms, self._seqs, self._offsets, self._lengths

    def _forget_commands(self) -> None:
        """Drop the held commands of entries no longer in the log."""
        recent, last = self._recent, self._last
        while recent and (last is None or next(reversed(recent)) > last):
            self._recent_bytes -= len(recent.popitem()[1])
        while recent and next(iter(recent)) < self._first:
            self._recent_bytes -= len(recent.popitem(last=False)[1])
        if self._head is not None and (last is None or self._head[0] != self._first):
            self._head = None

    def entries(self, index: int, count: int | None = None, max_bytes: int | None = None) -> list:
        """The entries from log index ``index`` on, at most ``count``, and no more than it takes for
        their commands to reach ``max_bytes``: pysyncobj's ``__getEntries``, without reading the
        whole tail of the log from disk to send a part of it. An entry whose record fails its
        checks ends them (``on_damage`` is told): what precedes it goes out while it is repaired."""
        found, total = [], 0
        try:
            for entry in self.iterate(index, count):
                found.append(entry)
                total += len(entry[0])
                if max_bytes is not None and total >= max_bytes:
                    break
        except DamagedRecord:
            pass
        return found

    def iterate(self, index: int, count: int | None = None) -> Iterator[tuple[bytes, int, int]]:
        """The entries from log index ``index`` on, at most ``count``, each read as it is reached;
        none if the log starts after ``index``. The log must not change meanwhile."""
        if self._last is None or index < self._first:
            return
        start = index - self._first
        stop = len(self) if count is None else min(len(self), start + count)
        for position in range(start, stop):
            yield self[position]

    def index_and_term(self, position: int) -> tuple[int, int]:
        """The index and term of the entry at list position ``position`` (negative from the end), its
        command left on disk."""
        position = range(len(self))[position]
        return self._first + position, self._terms[position]

    def deleteEntriesTo(self, entryTo):
        if entryTo <= 0:
            return
        if entryTo < len(self):
            start = (self._seqs[entryTo], self._offsets[entryTo])
        else:
            start = (self._seq, self._segment_sizes[self._seq])
        self._compact(entryTo, start)

    def clear(self):
        self._prepare_rewrite()
        self._appender.trim()
        self._start_segment()
        self._compact(len(self), (self._seq, SEGMENT_HEADER.size))
        self._synced = self._marked = None

    def _compact(self, entryTo: int, start: tuple[int, int]) -> None:
        """Drop the first ``entryTo`` entries from the log, which then starts at ``start``; keep
        those the snapshot names. The snapshot, then the kept entries, then the new start are
        durable before a segment is unlinked."""
        self._make_snapshot_durable()
        kept = self._kept_after(entryTo)
        needed = set(kept.seqs)
        self._use_kept(kept)
        self._write_kept()
        self._write_meta(start=start, first=self._first + entryTo if entryTo < len(self) else None,
                         durable_now=True)
        # out of the rows before their segments go: a read finds them kept, or not at all
        for column in self._rows():
            del column[:entryTo]
        self._first += entryTo
        if not self._terms:
            self._last = None
        self._forget_commands()
        dead = [s for s in self._segment_sizes if s < start[0] and s not in needed]
        for s in dead:
            os.unlink(self._dir / _segment_name(s))
            del self._segment_sizes[s]
        if dead:
            fsync_dir(self._dir)
        # One rewrite per compaction, the most dead segment's: each holds the engine's loop for a
        # write and an fsync of up to half a segment, and a leader that stops ticking is deposed.
        live_share = {seq: self._live_share(seq) for seq in needed if seq < start[0]}
        deadest = min(sorted(live_share), key=live_share.get, default=None)
        if deadest is not None and live_share[deadest] < 0.5:
            self._rewrite(deadest)

    def _kept_after(self, entryTo: int) -> Kept:
        """The kept entries once the first ``entryTo`` entries of the log are dropped: those
        ``retain`` named, found among the kept ones and the dropped ones."""
        old, new = self._kept, Kept.empty()
        dropped_first = self._first if entryTo else None
        k = 0
        for index in self._live:
            while k < len(old.indexes) and old.indexes[k] < index:
                k += 1
            if k < len(old.indexes) and old.indexes[k] == index:
                place = (old.seqs[k], old.offsets[k], old.lengths[k], old.terms[k])
            elif dropped_first is not None and dropped_first <= index < dropped_first + entryTo:
                position = index - dropped_first
                place = (self._seqs[position], self._offsets[position], self._lengths[position],
                         self._terms[position])
            else:
                continue   # still in the log, or named by a snapshot this node replaced
            new.indexes.append(index)
            for column, value in zip(new[1:], place):
                column.append(value)
        return new

    def _live_share(self, seq: int) -> float:
        """How much of kept segment ``seq`` its kept records (and header) would fill."""
        kept = self._kept
        part = kept.in_segment(seq)
        return (SEGMENT_HEADER.size + sum(kept.lengths[part.start:part.stop])) / self._segment_sizes[seq]

    def _rewrite(self, seq: int) -> None:
        """Rewrite kept segment ``seq`` with only its kept records: a crash at any step leaves
        the old file and its offsets, or the new file, whose offsets the next open finds if
        ``kept.rec`` does not say them yet."""
        kept = self._kept
        path = self._dir / _segment_name(seq)
        temporary = path.with_name(path.name + REWRITE_SUFFIX)
        offsets = array("I", kept.offsets)
        fd = self._kept_fds[seq]

        def copies() -> Iterator[records.Encoded]:
            at = SEGMENT_HEADER.size
            for k in kept.in_segment(seq):
                record = os.pread(fd, kept.lengths[k], kept.offsets[k])
                # copied, its damage would move with it: the segment waits for its repair
                self._verified(record, kept.indexes[k], self._kept_place(kept.indexes[k]))
                offsets[k], at = at, at + len(record)
                yield records.Encoded(record)
        try:
            size = records.write_file(temporary, SEGMENT_MAGIC, copies(), tag=seq)
        except DamagedRecord as damage:
            if self.on_damage is not None:
                self.on_damage(damage, False)
            return
        os.replace(temporary, path)
        fsync_dir(self._dir)
        self._segment_sizes[seq] = size
        self._use_kept(kept._replace(offsets=offsets), reopen=(seq,))
        self._write_kept()

    def _use_kept(self, kept: Kept, reopen: tuple[int, ...] = ()) -> None:
        """Read kept entries from ``kept`` from now on, through a descriptor per segment."""
        wanted = set(kept.seqs)
        fds, old = {}, self._kept_fds
        for seq in wanted:
            fds[seq] = old.pop(seq) if seq in old and seq not in reopen else \
                os.open(self._dir / _segment_name(seq), os.O_RDONLY)
        self._kept, self._kept_fds = kept, fds
        self._kept_bytes = sum(kept.lengths)
        for fd in old.values():
            os.close(fd)

    def _write_kept(self) -> None:
        kept = self._kept
        sizes = {seq: self._segment_sizes[seq] for seq in set(kept.seqs)}
        records.replace_file(self._dir / KEPT_NAME, KEPT_MAGIC,
                             [json.dumps(sizes).encode(), *(column.tobytes() for column in kept)])

    # -- meta ------------------------------------------------------------

    def _log_start(self) -> tuple[int, int]:
        if self._last is not None:
            return self._seqs[0], self._offsets[0]
        return (self._seq, self._segment_sizes[self._seq])

    def _write_meta(self, start: tuple[int, int] | None = None, first: int | None = None, *,
                    durable_now: bool = False) -> None:
        """Persist meta, in both copies in turn; ``durable_now`` fsyncs them even when fsync is off
        (structural changes: the log start moves and segments get unlinked). ``start`` (and the
        entry ``first`` its record holds, None if none) when the log is about to start elsewhere."""
        if start is None:
            start, first = self._log_start(), (self._first if self._last is not None else None)
        if self._appender is not None:
            # the log first: meta that says the log holds its regain index again is never ahead of it
            self._sync_data()
        self._meta_seq += 1
        body = {
            "term": self._term,
            "voted_for": self._voted_for,
            "commit_index": self._commit_index,
            "start": list(start),
            "seq": self._meta_seq,
        }
        if first is not None:
            # the index of the record at ``start``: damage found there at open is given up from it
            body["first"] = first
        if self.regain_index is not None:
            body["regain"] = self.regain_index
        self._meta_dirty = False
        encoded = records.file_header(META_MAGIC) + records.encode(json.dumps(body).encode())
        for name in (META_NAME, META_COPY_NAME):
            self._write_meta_copy(self._dir / name, encoded, sync=self._fsync or durable_now)

    @staticmethod
    def _write_meta_copy(path: Path, encoded: bytes, *, sync: bool) -> None:
        """Overwrite one copy in place (no new room needed on a full disk), synced before the
        other copy is written: a crash or a damaged sector spoils at most the one being written."""
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, records.FILE_MODE)
        try:
            records.pwrite_all(fd, encoded, 0, path)
            os.ftruncate(fd, len(encoded))
            if sync:
                records.sync_fd(fd, path)
        finally:
            os.close(fd)
        if created and sync:
            fsync_dir(path.parent)

    def setRaftCommitIndex(self, raftCommitIndex):
        if raftCommitIndex != self._commit_index:
            self._commit_index = raftCommitIndex
            self._meta_dirty = True

    def getRaftCommitIndex(self):
        # A commit index beyond the surviving log (entries lost with fsync
        # off) would point at entries this node does not have yet.
        if self._last is not None:
            return min(self._commit_index, self._last)
        return self._commit_index

    def setCurrentTerm(self, term, votedForNodeId):
        self._prepare_rewrite()
        self._term = term
        self._voted_for = votedForNodeId
        # Raft: term and vote are durable before any message reflecting them.
        self._write_meta()

    def getCurrentTerm(self):
        return self._term

    def getVotedForNodeId(self):
        return self._voted_for

    def onOneSecondTimer(self):
        # The commit index only speeds up a restart, it is not a safety
        # property: persisting it lazily is enough.
        if self._meta_dirty:
            self._write_meta()

    # -- interface -------------------------------------------------------

    def __getitem__(self, item):
        """(command, index, term) of the entry at list position ``item``, or a list of them for a slice."""
        positions = range(len(self))[item]
        if isinstance(positions, range):
            return [(self._command_at(p), self._first + p, self._terms[p]) for p in positions]
        return self._command_at(positions), self._first + positions, self._terms[positions]

    def last_index(self) -> int | None:
        """The last entry's index, None while the log is empty (a snapshot's install empties the
        log before it adds the snapshot's entry)."""
        return self._last

    def __len__(self):
        return len(self._terms)

    def _destroy(self):
        if self._appender is None:
            return
        self._use_kept(Kept.empty())
        self._sync_data(force=True)
        if self._synced is not None and self._synced != self._marked:
            # a closed log says how far it was synced, to its last entry: damage found there at
            # the next start is not taken for a torn write (without room for it, the next start
            # knows as much as after a crash)
            with contextlib.suppress(records.InsufficientStorage):
                self._write(encode_sync_mark(self._synced))
                self._marked = self._synced
                self._sync_data(force=True)
        self._appender.trim()
        if self._meta_dirty:
            self._write_meta(durable_now=True)
        self._appender.close()
        self._appender = None

    def bytes_before(self, position: int) -> int:
        """Bytes of the records before list position ``position`` (all of them
        past the end): what compacting up to that entry would drop."""
        if self._last is None:
            return 0
        start_seq, start_off = self._seqs[0], self._offsets[0]
        if position < len(self):
            end_seq, end_off = self._seqs[position], self._offsets[position]
        else:
            end_seq, end_off = self._seq, self._segment_sizes[self._seq]
        if start_seq == end_seq:
            return end_off - start_off
        between = sum(size - SEGMENT_HEADER.size for seq, size in self._segment_sizes.items()
                      if start_seq < seq < end_seq)
        return self._segment_sizes[start_seq] - start_off + between + end_off - SEGMENT_HEADER.size

    def held_command_bytes(self) -> int:
        """Bytes of commands held in memory: at most ``recent_bytes`` (or the last command) and the first."""
        head = self._head
        return self._recent_bytes + (len(head[1]) if head is not None and head[0] not in self._recent else 0)

    def stats(self) -> dict:
        return {
            "entries": len(self),
            "held_command_bytes": self.held_command_bytes(),
            "bytes": sum(self._segment_sizes.values()),
            "segments": len(self._segment_sizes),
            "kept_entries": len(self._kept.indexes),
            "kept_bytes": self._kept_bytes,
            "data_syncs": self.syncs,
            "out_of_room": self.out_of_room,
            "regain_index": self.regain_index,
        }
