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
from pathlib import Path
from typing import Callable, Iterator

from pysyncobj.journal import Journal

from . import records
from .records import FILE_HEADER as SEGMENT_HEADER, fsync_dir

logger = logging.getLogger(__name__)

SEGMENT_MAGIC = b"RAFTQJ\x00\x01"
META_MAGIC = b"RAFTQJM1"
ENTRY_PREFIX = struct.Struct("<QQ")
_SEGMENT_NAME = re.compile(r"^seg-(\d{12})\.log$")
META_NAME = "meta.rec"
PREALLOCATE_BYTES = 4 * 1024 * 1024


def _segment_name(seq: int) -> str:
    return f"seg-{seq:012d}.log"


def encode_record(command: bytes, idx: int, term: int) -> bytes:
    return records.encode(ENTRY_PREFIX.pack(idx, term) + command)


class DurableJournal(Journal):
    """pysyncobj's journal interface over fsynced, checksummed segment files.

    Entries are the tuples pysyncobj uses, ``(command: bytes, index, term)``;
    positions passed to deleteEntriesFrom/To are list positions, as in
    pysyncobj. All methods run on pysyncobj's tick thread except
    ``stats()``, which only reads plain attributes.
    """

    def __init__(self, directory: str | Path, *, fsync: bool = True,
                 segment_bytes: int = 64 * 1024 * 1024,
                 snapshot_path: str | Path | None = None):
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

        self._entries: list[tuple[bytes, int, int]] = []
        self._positions: list[tuple[int, int]] = []  # (segment seq, offset) per entry
        self._segment_sizes: dict[int, int] = {}     # seq -> size of its records
        self._deferred = 0
        self._meta_dirty = False
        self._appender: records.Appender | None = None   # the live segment
        self._seq = 0
        self.syncs = 0

        meta = self._read_meta()
        self._term: int = meta.get("term", 0)
        self._voted_for = meta.get("voted_for")
        self._commit_index: int = meta.get("commit_index", 1)
        self._open_log(meta.get("start"))

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

    def _open_log(self, start: list[int] | None) -> None:
        seqs = self._existing_segments()
        if start is None:
            start_seq, start_off = (seqs[0] if seqs else 1), SEGMENT_HEADER.size
        else:
            start_seq, start_off = start
        changed = False
        for seq in seqs:
            if seq < start_seq:
                # left over by a compaction interrupted after its meta write
                os.unlink(self._dir / _segment_name(seq))
                changed = True
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
            for command, idx, term, pos in found:
                self._entries.append((command, idx, term))
                self._positions.append((seq, pos))
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
        """(end of the good records, [(command, index, term, offset)]): the log
        ends at the first record that is torn, damaged or out of sequence."""
        found = []
        end = offset
        for start, record_end, payload in records.iter_records(data, offset):
            if len(payload) < ENTRY_PREFIX.size:
                break
            idx, term = ENTRY_PREFIX.unpack_from(payload)
            if prev_idx is not None and idx != prev_idx + 1:
                break
            found.append((bytes(payload[ENTRY_PREFIX.size:]), idx, term, start))
            prev_idx, end = idx, record_end
        return end, found

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
        self._positions.append((self._seq, self._segment_sizes[self._seq]))
        self._write(encode_record(command, idx, term))
        self._entries.append((command, idx, term))
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
        if entryFrom >= len(self._entries):
            return
        self._prepare_rewrite()
        seq, offset = self._positions[entryFrom]
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
        del self._entries[entryFrom:]
        del self._positions[entryFrom:]

    def deleteEntriesTo(self, entryTo):
        if entryTo <= 0:
            return
        if entryTo < len(self._entries):
            start = self._positions[entryTo]
        else:
            start = (self._seq, self._segment_sizes[self._seq])
        self._make_snapshot_durable()
        self._write_meta(start=start, durable_now=True)
        self._drop_segments_before(start[0])
        del self._entries[:entryTo]
        del self._positions[:entryTo]

    def clear(self):
        self._prepare_rewrite()
        self._make_snapshot_durable()
        old = list(self._segment_sizes)
        self._start_segment()
        self._write_meta(start=(self._seq, SEGMENT_HEADER.size), durable_now=True)
        for s in old:
            os.unlink(self._dir / _segment_name(s))
            del self._segment_sizes[s]
        fsync_dir(self._dir)
        self._entries = []
        self._positions = []

    def _drop_segments_before(self, seq: int) -> None:
        dead = [s for s in self._segment_sizes if s < seq]
        for s in dead:
            os.unlink(self._dir / _segment_name(s))
            del self._segment_sizes[s]
        if dead:
            fsync_dir(self._dir)

    # -- meta ------------------------------------------------------------

    def _log_start(self) -> tuple[int, int]:
        if self._positions:
            return self._positions[0]
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
        if self._entries:
            return min(self._commit_index, self._entries[-1][1])
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
        return self._entries[item]

    def last_index(self) -> int | None:
        """The last entry's index, None while the log is empty. Safe from a thread other than
        pysyncobj's: a snapshot's install empties the log before it adds the snapshot's entry,
        and a status read in between found no last entry (IndexError)."""
        entries = self._entries
        try:
            return entries[-1][1]
        except IndexError:
            return None

    def __len__(self):
        return len(self._entries)

    def _destroy(self):
        if self._appender is None:
            return
        self._sync_data(force=True)
        self._appender.trim()
        if self._meta_dirty:
            self._write_meta(durable_now=True)
        self._appender.close()
        self._appender = None

    def bytes_before(self, position: int) -> int:
        """Bytes of the records before list position ``position`` (all of them
        past the end): what compacting up to that entry would drop."""
        if not self._positions:
            return 0
        start_seq, start_off = self._positions[0]
        if position < len(self._positions):
            end_seq, end_off = self._positions[position]
        else:
            end_seq, end_off = self._seq, self._segment_sizes[self._seq]
        if start_seq == end_seq:
            return end_off - start_off
        between = sum(size - SEGMENT_HEADER.size for seq, size in self._segment_sizes.items()
                      if start_seq < seq < end_seq)
        return self._segment_sizes[start_seq] - start_off + between + end_off - SEGMENT_HEADER.size

    def stats(self) -> dict:
        return {
            "entries": len(self._entries),
            "bytes": sum(self._segment_sizes.values()),
            "segments": len(self._segment_sizes),
            "data_syncs": self.syncs,
        }
