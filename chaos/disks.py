"""The means of the disk faults that go around a node's write seam: bytes that rot on its
disk, and a disk that fills up. (Short writes, EIO from fsync and misdirected writes go
through the seam itself: chaos/disk_faults.py, armed by the nemesis.)

Which disks go bad. A disk fault lands on the nodes of ``bad_disks``: a minority of every
Raft group's replicas, drawn once per campaign from its seed. Damage stays on a disk until a
read or the scrubber finds it and a replica's copy is written back, so faults drawn one at a
time could leave the same entries damaged on a majority, which raftq does not promise to
survive (docs/guarantees.md, "Storage faults"): with the bad disks fixed, every entry keeps
an intact copy on a majority, however long its damage on the others lasts. Only the full disk
strikes every node at once (replicas with equal disks fill up together).

Bit rot (``rot``). Bytes flipped in place, the file the same length, as a failing disk returns
them, in *live* records: the journal's log from where meta says it starts, its kept entries
(``kept.rec``: compacted entries a stored body still lies in), and the records of its
snapshot (its header, its state, the entries it carries). A record is chosen only if it is
intact and some sync covered it -- in a segment before its journal's last, or before the last
sync mark of the last -- since what no sync covered is a torn write's, which start-up rightly
cuts. A flip either changes a letter or a digit of a word in the record to its neighbour
(the text of a stored body, mostly: the same length and still valid text, what the checker
must never see served), or any bit of any byte of the record (its header, its identity, the
command's encoding). Each flip is written through the descriptor it was read through, so a
segment that compaction rewrote meanwhile takes it in the unlinked copy, never at an offset
of another file.

A full disk (``SmallDisks``). Each node's data directory is a tmpfs of its own (mounting
needs root): ``fill`` remounts it at the size its files take now plus a little, ``grow``
back at its full size (``mount -o remount,size=...``). Chosen over the seam's ``no_room``
because it is a real filesystem running out of room: the node's free-space watermark reads
it (statvfs) and raises its disk alarm, and every write that races the alarm meets the
kernel's own ENOSPC -- the journal's appends and preallocation, the snapshot writer, meta.
``unmount`` copies what each holds to the directory beneath first, so a campaign's results
keep the data directories; the runner unmounts whatever it mounted, whatever happens.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from raftq.engine.storage import records
from raftq.engine.storage.journal import (ENTRY_PREFIX, KEPT_MAGIC, KEPT_NAME, META_COPY_NAME, META_MAGIC, META_NAME,
                                          SEGMENT_MAGIC, SYNC_MARK, Kept)
from raftq.engine.storage.snapshot_file import READABLE as SNAPSHOT_MAGICS

SNAPSHOT_NAME = "snapshot.bin"
SEGMENT_NAME = re.compile(r"^seg-(\d{12})\.log$")
WORD = re.compile(rb"[A-Za-z0-9]{4,}")
# tmpfs sizes: room for every group's disk alarm reserve (api/disk.py: 128 MiB a group held) and
# far more than a campaign writes; a filled disk keeps a little room beyond what its files take
FULL_SIZE_BASE_MIB = 1024
FULL_SIZE_PER_GROUP_MIB = 512
PAGE = 4096


def bad_disks(seed: int, ids: list[str], smallest_group: int) -> list[str]:
    """The nodes whose disks misbehave in a campaign: a minority of the smallest Raft group's
    replicas (one of 3, two of 5), drawn from the seed."""
    return sorted(random.Random(f"{seed}-disks").sample(ids, (smallest_group - 1) // 2))


@dataclass(frozen=True)
class Flip:
    """A byte flipped in place: the file, its inode (a rewritten segment is another), where."""
    path: str
    inode: int
    offset: int
    was: int
    now: int
    what: str           # "word": a letter or digit of a word; "bit": any bit of the record
    index: int | None   # the log entry the record holds (a snapshot's header and state: None)

    def as_dict(self) -> dict:
        return {"path": self.path, "offset": self.offset, "what": self.what, "index": self.index}

    def still_there(self) -> bool:
        """Whether the flipped byte is still on disk: not written back by a repair, nor gone
        with its file (compaction, a rewrite, a start-up that gave the entry up)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            return os.fstat(fd).st_ino == self.inode and os.pread(fd, 1, self.offset) == bytes([self.now])
        finally:
            os.close(fd)


@dataclass(frozen=True)
class _Record:
    path: Path
    start: int          # of the record's header
    body: int           # where what may be flipped begins (past the header, or an entry's index and term)
    end: int
    index: int | None


def _read_meta(journal: Path) -> dict | None:
    copies = []
    for name in (META_NAME, META_COPY_NAME):
        try:
            (body,) = records.read_file(journal / name, META_MAGIC)
            copies.append(json.loads(body))
        except (OSError, ValueError):
            continue
    return max(copies, key=lambda meta: meta.get("seq", 0)) if copies else None


def _read_kept(journal: Path) -> dict[int, list[tuple[int, int]]]:
    """segment seq -> [(offset, index)] of the kept entries ``kept.rec`` names."""
    try:
        _, *columns = records.read_file(journal / KEPT_NAME, KEPT_MAGIC)
    except FileNotFoundError:
        return {}
    kept = Kept.empty()
    for column, raw in zip(kept, columns):
        column.frombytes(raw)
    out: dict[int, list[tuple[int, int]]] = {}
    for index, seq, offset in zip(kept.indexes, kept.seqs, kept.offsets):
        out.setdefault(seq, []).append((offset, index))
    return out


def _journal_records(journal: Path, data_of) -> list[_Record]:
    """The live entries' records of one journal that a sync covered, intact now."""
    meta = _read_meta(journal)
    if meta is None:
        return []
    seqs = sorted(int(m.group(1)) for name in os.listdir(journal) if (m := SEGMENT_NAME.match(name)))
    start_seq, start_offset = meta.get("start") or (seqs[0] if seqs else 0, records.FILE_HEADER.size)
    kept = _read_kept(journal)
    out = []
    for seq in seqs:
        if seq < start_seq and seq not in kept:
            continue
        path = journal / f"seg-{seq:012d}.log"
        data = data_of(path)
        if data is None or not records.has_header(data, SEGMENT_MAGIC, seq):
            continue
        found = []
        covered_end = None if seq == seqs[-1] else len(data)   # the last segment: up to its last sync mark
        for start, end, payload in records.iter_records(data):
            index = ENTRY_PREFIX.unpack_from(payload)[0] if len(payload) >= ENTRY_PREFIX.size else None
            if index == SYNC_MARK:
                covered_end = start
                continue
            if index is not None and len(payload) > ENTRY_PREFIX.size:
                found.append(_Record(path, start, start + records.RECORD_HEADER.size + ENTRY_PREFIX.size, end, index))
        live_kept = {offset for offset, _ in kept.get(seq, ())}
        for record in found:
            live = record.start in live_kept or (seq > start_seq or (seq == start_seq and record.start >= start_offset))
            if live and covered_end is not None and record.end <= covered_end:
                out.append(record)
    return out


def _snapshot_records(path: Path, data_of) -> list[_Record]:
    data = data_of(path)
    if data is None or not any(records.has_header(data, magic) for magic in SNAPSHOT_MAGICS):
        return []
    return [_Record(path, start, start + records.RECORD_HEADER.size, end, None)
            for start, end, _ in records.iter_records(data)]


class _OpenFiles:
    """Each file read once, through a descriptor kept open until the flips are written."""

    def __init__(self):
        self.fds: dict[Path, int] = {}
        self.data: dict[Path, bytes] = {}

    def __call__(self, path: Path) -> bytes | None:
        if path not in self.fds:
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                return None
            self.fds[path] = fd
            self.data[path] = os.pread(fd, os.fstat(fd).st_size, 0)
        return self.data[path]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def rot(data_dir: Path, rng: random.Random, count: int, *, snapshot: bool, word_share: float = 0.5) -> list[Flip]:
    """Flip one byte in each of up to `count` live records of the node whose data directory is
    `data_dir` (journal records; with `snapshot`, one of its snapshot's records among them, if
    it has one). Returns the flips, as written."""
    files = _OpenFiles()
    try:
        journal = [r for directory in sorted(data_dir.rglob("journal")) if directory.is_dir()
                   for r in _journal_records(directory, files)]
        chosen = rng.sample(journal, min(count, len(journal)))
        snapshots = [r for path in sorted(data_dir.rglob(SNAPSHOT_NAME)) for r in _snapshot_records(path, files)]
        if snapshot and snapshots:
            chosen = chosen[:max(0, count - 1)] + [rng.choice(snapshots)]
        flips = []
        for record in chosen:
            data = files.data[record.path]
            words = [w for w in WORD.finditer(data, record.body, record.end)]
            if words and rng.random() < word_share:
                word = rng.choice(words)
                at, what = rng.randrange(word.start(), word.end()), "word"
                now = data[at] ^ 0x01
            else:
                at, what = rng.randrange(record.start, record.end), "bit"
                now = data[at] ^ (1 << rng.randrange(8))
            fd = files.fds[record.path]
            os.pwrite(fd, bytes([now]), at)
            os.fsync(fd)
            flips.append(Flip(str(record.path), os.fstat(fd).st_ino, at, data[at], now, what, record.index))
        return flips
    finally:
        files.close()


@dataclass
class Disks:
    """What a campaign's disk faults strike: the cluster's directory (a node's data directory is
    `root`/<id>), the nodes whose disks go bad, the control file the nodes' write seam watches,
    and their small filesystems (None when they could not be mounted: `why_not`)."""
    root: Path
    bad: list[str]
    control: Path
    small: "SmallDisks | None" = None
    why_not: str | None = None


class SmallDisks:
    """Each node's data directory on a tmpfs of its own, filled up and grown back on demand."""

    def __init__(self, root: Path, ids: list[str], raft_groups: int):
        self.dirs = {nid: Path(root) / nid for nid in ids}
        self.full_mib = FULL_SIZE_BASE_MIB + FULL_SIZE_PER_GROUP_MIB * raft_groups
        self.mounted: list[str] = []
        self.filled = False

    def mount(self) -> str | None:
        """Mount them all; None, or why they could not be (then none is mounted)."""
        for nid, path in self.dirs.items():
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.full_mib}m,mode=0700", "tmpfs",
                                   str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                self.unmount()
                return f"cannot mount a tmpfs for {nid}'s data directory ({done.stderr.strip()}): run as root"
            self.mounted.append(nid)
        return None

    def fill(self, headroom_bytes: int) -> dict[str, int]:
        """Shrink each to what its files take now plus `headroom_bytes`; the free bytes each was left."""
        self.filled = True
        left = {}
        for nid in self.mounted:
            for _ in range(10):     # the node writes meanwhile: a size below what it uses is refused
                disk = os.statvfs(self.dirs[nid])
                used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
                size = -(-(used + headroom_bytes) // PAGE) * PAGE
                if self._remount(nid, f"{size}"):
                    disk = os.statvfs(self.dirs[nid])
                    left[nid] = disk.f_bavail * disk.f_frsize
                    break
        return left

    def grow(self) -> None:
        for nid in self.mounted:
            self._remount(nid, f"{self.full_mib}m")
        self.filled = False

    def _remount(self, nid: str, size: str) -> bool:
        return subprocess.run(["mount", "-o", f"remount,size={size}", str(self.dirs[nid])],
                              capture_output=True).returncode == 0

    def unmount(self) -> list[str]:
        """Unmount each (every node is stopped), its files copied to the directory beneath
        first; returns what could not be done, having tried every one."""
        problems = []
        for nid in list(self.mounted):
            path = self.dirs[nid]
            saved = path.with_name(f"{path.name}.tmpfs")
            try:
                shutil.copytree(path, saved, symlinks=True)
            except OSError as exc:
                problems.append(f"{nid}'s data directory not kept: {exc}")
                saved = None
            done = subprocess.run(["umount", "--lazy", str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                problems.append(f"{path} not unmounted: {done.stderr.strip()}")
                continue
            self.mounted.remove(nid)
            if saved is not None:
                shutil.copytree(saved, path, symlinks=True, dirs_exist_ok=True)
                shutil.rmtree(saved)
        return problems
