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
- ``meta.rec``: one record holding currentTerm, votedFor, commit index and
  where the live log starts (segment, offset), as JSON -- replaced atomically
  (temp file, fsync, rename, directory fsync).
- ``kept.rec``: the compacted entries kept for the snapshot (below), replaced
  atomically like meta.

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

At open, records are read from the recorded start; the first record with a
bad checksum, a short read or an index that does not follow its predecessor
ends the log: the file is truncated there and later segments are removed.
Zero bytes after a segment's last record are the unused part of its
preallocation, not damage: they are trimmed quietly.

Preallocation: the live segment is extended ``PREALLOCATE_BYTES`` at a time
(``records.Appender``): bench/consensus_bench.py's lone commit p50 went from
1.09 ms to 1.00 ms with it. A segment is trimmed to its records when it is
rolled or closed.

Durability: ``add`` writes and fdatasyncs before it returns, unless the caller
opened a ``deferred()`` block, in which case the block's end syncs once for all
its appends (the consensus module uses this to overlap the leader's fsync with
replication and to sync a follower once per network poll, never acknowledging
before the sync). ``fsync=False`` skips data syncs (tests, benchmarks).
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
from .records import FILE_HEADER as SEGMENT_HEADER, fsync_dir

logger = logging.getLogger(__name__)

SEGMENT_MAGIC = b"RAFTQJ\x00\x01"
META_MAGIC = b"RAFTQJM1"
KEPT_MAGIC = b"RAFTQJK1"
ENTRY_PREFIX = struct.Struct("<QQ")
_SEGMENT_NAME = re.compile(r"^seg-(\d{12})\.log$")
META_NAME = "meta.rec"
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


class Kept(NamedTuple):
    """Compacted entries kept on disk, in index order (so their segments ascend too): for each,
    its index, segment, record offset and record length."""
    indexes: array
    seqs: array
    offsets: array
    lengths: array

    @staticmethod
    def empty() -> "Kept":
        return Kept(array("Q"), array("I"), array("I"), array("I"))

    def find(self, index: int) -> int | None:
        k = bisect_left(self.indexes, index)
        return k if k < len(self.indexes) and self.indexes[k] == index else None

    def in_segment(self, seq: int) -> range:
        return range(bisect_left(self.seqs, seq), bisect_right(self.seqs, seq))


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
        self._kept_fds: dict[int, int] = {}
        self._deferred = 0
        self._meta_dirty = False
        self._appender: records.Appender | None = None   # the live segment
        self._seq = 0
        self.syncs = 0
        # The indexes of the entries found at open whose command's first byte is
        # ``noted_kind``: what a restarted node reads its log's membership from
        # without reading every command back (engine.raft.node).
        self._noted_kind = noted_kind
        self.noted_at_open: list[int] = []

        meta = self._read_meta()
        self._term: int = meta.get("term", 0)
        self._voted_for = meta.get("voted_for")
        self._commit_index: int = meta.get("commit_index", 1)
        kept, kept_sizes = self._read_kept()
        self._open_log(meta.get("start"), kept, kept_sizes)

    # -- opening ---------------------------------------------------------

    def _read_meta(self) -> dict:
        path = self._dir / META_NAME
        if not path.exists() and (self._dir / "meta.json").exists():
            # term and vote of a journal written before the record format:
            # starting from term 0 could vote twice in a term
            raise records.DamagedFile(f"{self._dir} was written by an older raftq (meta.json); this node cannot "
                                      "restart from it: move its data directory aside and it rejoins from the leader")
        try:
            (body,) = records.read_file(path, META_MAGIC)
            return json.loads(body)
        except FileNotFoundError:
            return {}
        except ValueError:
            logger.critical("journal meta %s is damaged; starting from term 0", path)
            return {}

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
        """``kept`` with the offsets of segment ``seq``'s entries read from the file itself."""
        data = (self._dir / _segment_name(seq)).read_bytes()
        found = {}
        for start, end, payload in records.iter_records(data):
            found[ENTRY_PREFIX.unpack_from(payload)[0]] = (start, end - start)
        offsets, lengths = array("I", kept.offsets), array("I", kept.lengths)
        for k in kept.in_segment(seq):
            if kept.indexes[k] not in found:
                logger.critical("journal %s: kept entry %d is not in segment %d", self._dir, kept.indexes[k], seq)
                continue
            offsets[k], lengths[k] = found[kept.indexes[k]]
        return kept._replace(offsets=offsets, lengths=lengths)

    def _open_log(self, start: list[int] | None, kept: Kept, kept_sizes: dict[int, int]) -> None:
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
            if not records.has_header(data, SEGMENT_MAGIC, seq):
                good_end, found = 0, []
            else:
                offset = min(start_off if seq == start_seq else SEGMENT_HEADER.size, len(data))
                good_end, found = self._scan(data, offset, prev_idx)
            for idx, term, pos, length, kind in found:
                self._append_row(idx, term, seq, pos, length)
                if kind == self._noted_kind:
                    self.noted_at_open.append(idx)
                prev_idx = idx
            self._segment_sizes[seq] = good_end
            if good_end == len(data):
                continue
            if records.zero_tail(data, good_end):
                os.truncate(path, good_end)    # unused preallocation
                continue
            logger.warning("journal %s: invalid data at offset %d of %d bytes; truncating the log there "
                           "(%d later segment(s) dropped)", path, good_end, len(data), len(live) - n - 1)
            for later in live[n + 1:]:
                os.unlink(self._dir / _segment_name(later))
            live = live[:n + 1]
            if good_end == 0:
                self._write_new_segment_file(seq)
                self._segment_sizes[seq] = SEGMENT_HEADER.size
            else:
                with open(path, "r+b") as f:
                    f.truncate(good_end)
                    os.fsync(f.fileno())
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
        if start is not None and tuple(start) != self._log_start():
            # the recorded start no longer describes the files (damage above):
            # appends must not land before a start that reopen would skip to
            self._write_meta(durable_now=True)

    @staticmethod
    def _scan(data: bytes, offset: int, prev_idx: int | None):
        """(end of the good records, [(index, term, offset, record length, the command's first
        byte or None)]): the log ends at the first record that is torn, damaged or out of
        sequence."""
        found = []
        end = offset
        for start, record_end, payload in records.iter_records(data, offset):
            if len(payload) < ENTRY_PREFIX.size:
                break
            idx, term = ENTRY_PREFIX.unpack_from(payload)
            if prev_idx is not None and idx != prev_idx + 1:
                break
            kind = payload[ENTRY_PREFIX.size] if len(payload) > ENTRY_PREFIX.size else None
            found.append((idx, term, start, record_end - start, kind))
            prev_idx, end = idx, record_end
        return end, found

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

    def _write(self, data: bytes) -> None:
        self._segment_sizes[self._seq] = self._appender.append(data) + len(data)

    def _sync_data(self, force: bool = False) -> None:
        """Make appended bytes durable; ``force`` even when fsync is off."""
        if (self._fsync or force) and self._appender.sync():
            self.syncs += 1

    def _roll_segment(self) -> None:
        self._sync_data(force=True)
        self._appender.trim()
        self._start_segment()

    def _start_segment(self) -> None:
        """Close the current segment and append to a new, empty one."""
        self._appender.close()
        self._seq += 1
        self._write_new_segment_file(self._seq)
        fsync_dir(self._dir)
        self._segment_sizes[self._seq] = SEGMENT_HEADER.size
        self._open_segment()

    def add(self, command, idx, term):
        if self._segment_sizes[self._seq] >= self._segment_bytes:
            self._roll_segment()
        command = bytes(command)
        record = encode_record(command, idx, term)
        offset = self._segment_sizes[self._seq]
        self._write(record)
        self._append_row(idx, term, self._seq, offset, len(record))
        self._recent[idx] = command
        self._recent_bytes += len(command)
        while self._recent_bytes > self._recent_limit and len(self._recent) > 1:
            self._recent_bytes -= len(self._recent.popitem(last=False)[1])
        if not self._deferred:
            self._sync_data()

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
                os.fsync(f.fileno())
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
        neither holds it."""
        last = self._last
        if last is not None and self._first <= index <= last:
            return self._command_at(index - self._first)
        kept = self._kept
        k = kept.find(index)
        if k is None:
            return None
        record = os.pread(self._kept_fds[kept.seqs[k]], kept.lengths[k], kept.offsets[k])
        return self._payload(record, index, "kept entry")

    def _payload(self, record: bytes, index: int, what: str) -> bytes:
        payload = next((payload for _, _, payload in records.iter_records(record, 0)), None)
        if payload is None or ENTRY_PREFIX.unpack_from(payload)[0] != index:
            raise records.DamagedFile(f"journal {self._dir}: {what} {index} is not where the journal says")
        return bytes(payload[ENTRY_PREFIX.size:])

    def _command_at(self, position: int) -> bytes:
        """The command of the log's entry at ``position``: held, or read back from its segment."""
        index = self._first + position
        command = self._recent.get(index)
        if command is not None:
            return command
        head = self._head
        if head is not None and head[0] == index:
            return head[1]
        fd = os.open(self._dir / _segment_name(self._seqs[position]), os.O_RDONLY)
        try:
            record = os.pread(fd, self._lengths[position], self._offsets[position])
        finally:
            os.close(fd)
        command = self._payload(record, index, "log entry")
        if position == 0:
            self._head = (index, command)
        return command

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
        whole tail of the log from disk to send a part of it."""
        found, total = [], 0
        for entry in self.iterate(index, count):
            found.append(entry)
            total += len(entry[0])
            if max_bytes is not None and total >= max_bytes:
                break
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

    def _compact(self, entryTo: int, start: tuple[int, int]) -> None:
        """Drop the first ``entryTo`` entries from the log, which then starts at ``start``; keep
        those the snapshot names. The snapshot, then the kept entries, then the new start are
        durable before a segment is unlinked."""
        self._make_snapshot_durable()
        kept = self._kept_after(entryTo)
        needed = set(kept.seqs)
        self._use_kept(kept)
        self._write_kept()
        self._write_meta(start=start, durable_now=True)
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
                place = (old.seqs[k], old.offsets[k], old.lengths[k])
            elif dropped_first is not None and dropped_first <= index < dropped_first + entryTo:
                position = index - dropped_first
                place = (self._seqs[position], self._offsets[position], self._lengths[position])
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
        part = kept.in_segment(seq)
        offsets = array("I", kept.offsets)
        fd = self._kept_fds[seq]
        with open(temporary, "wb") as out:
            out.write(records.file_header(SEGMENT_MAGIC, seq))
            for k in part:
                offsets[k] = out.tell()
                out.write(os.pread(fd, kept.lengths[k], kept.offsets[k]))
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
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

    def _write_meta(self, start: tuple[int, int] | None = None, *, durable_now: bool = False) -> None:
        """Persist meta; ``durable_now`` fsyncs it even when fsync is off
        (structural changes: the log start moves and segments get unlinked)."""
        body = {
            "term": self._term,
            "voted_for": self._voted_for,
            "commit_index": self._commit_index,
            "start": list(start or self._log_start()),
        }
        self._meta_dirty = False
        records.replace_file(self._dir / META_NAME, META_MAGIC, [json.dumps(body).encode()],
                             sync=self._fsync or durable_now)

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
            "data_syncs": self.syncs,
        }
