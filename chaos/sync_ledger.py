"""Power cuts through the production write path.

kill -9 ends a process but leaves its writes in the page cache: the file
still holds them. A power cut also loses every write the disk was not told to
keep (fsync, fdatasync). To turn a kill -9 into a power cut, a node records,
each time an fsync or fdatasync of a journal segment returns, how far that
file's written bytes reached (`record_syncs`, installed by
chaos/node_site/sitecustomize.py when RAFTQ_SYNC_LEDGER names a ledger file);
after the kill, `cut` truncates every segment to the length its last sync
covered. The node runs its production code: `pwrite` into preallocated
segments, `fdatasync` before any acknowledgement.

The line for a sync is written after the sync returns and before the journal
returns to its caller (the engine's tick does both), so anything acknowledged
is covered by a line. Only segment data is cut: the journal makes every other
change (segment creation, truncation, meta.rec, directory entries) durable
before it goes on, so a power cut finds them as they are. A segment the
ledger never mentions keeps the length it had when the node started.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SEGMENT = re.compile(r"/seg-\d+\.log$")


def record_syncs(ledger_path: str) -> None:
    """In a node process: wrap os's write and sync calls to keep the ledger."""
    ledger = os.open(ledger_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    written: dict[int, int] = {}       # fd -> end of the furthest pwrite through it
    real = {name: getattr(os, name) for name in ("pwrite", "ftruncate", "close", "fsync", "fdatasync")}

    def pwrite(fd, data, offset):
        count = real["pwrite"](fd, data, offset)
        written[fd] = max(written.get(fd, 0), offset + count)
        return count

    def ftruncate(fd, length):
        real["ftruncate"](fd, length)
        if fd in written:
            written[fd] = min(written[fd], length)

    def close(fd):
        written.pop(fd, None)
        real["close"](fd)

    def synced(fd) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if SEGMENT.search(path):
            # Past the last pwrite a segment holds only its preallocation.
            end = written[fd] if fd in written else os.fstat(fd).st_size
            os.write(ledger, f"{path}\t{end}\n".encode())

    def fsync(fd):
        real["fsync"](fd)
        synced(fd)

    def fdatasync(fd):
        real["fdatasync"](fd)
        synced(fd)

    os.pwrite, os.ftruncate, os.close, os.fsync, os.fdatasync = pwrite, ftruncate, close, fsync, fdatasync


def segment_sizes(data_dir: Path) -> dict[str, int]:
    """Every journal segment under `data_dir` with its size now."""
    return {str(p): p.stat().st_size for p in Path(data_dir).rglob("seg-*.log")}


def cut(data_dir: Path, ledger_path: Path, baseline: dict[str, int]) -> dict[str, int]:
    """After kill -9 of the node that wrote `ledger_path`: drop from each of its
    segments what no sync covered. Returns the bytes dropped per segment."""
    durable = dict(baseline)
    if ledger_path.exists():
        for line in ledger_path.read_text().splitlines():
            path, _, end = line.rpartition("\t")
            if path:
                durable[path] = int(end)
    dropped = {}
    for path, size in segment_sizes(data_dir).items():
        keep = durable.get(path, 0)     # created and never synced: nothing of it reached the disk
        if size > keep:
            os.truncate(path, keep)
            dropped[path] = size - keep
    ledger_path.unlink(missing_ok=True)
    return dropped
