"""Disk faults through the production write path, for tests and the chaos suite.

raftq writes and syncs every stored byte through one seam, ``records.calls``
(engine/storage/records.py). ``install(control)`` puts ``FaultyCalls`` there,
in this process: each call first looks at the faults armed in the control
file (JSON, read again whenever it changes), so a test or the chaos nemesis
arms and disarms faults while the nodes run, by writing that file. Node
processes load this module through chaos/node_site/sitecustomize.py when
``RAFTQ_DISK_FAULTS`` names the control file (``chaos.power.node_site_env``);
production never does (chaos/ is not installed).

The control file is ``{"faults": [fault, ...]}``; a fault is
``{"kind": ..., "path": ..., "count": ...}``:

- ``kind``, one of ``KINDS``:
  - ``short_write``: a write (``pwrite``, ``write``) writes half of what it is
    given and returns that count: what the disk does when it runs out of
    room part-way, or a signal arrives, and what the caller must complete;
  - ``no_room``: a full disk. A write writes half and returns that count,
    the next write to the same file raises ENOSPC; ``fallocate`` raises
    ENOSPC. It hits writes in place too, which a real full disk lets
    through (meta is overwritten in place for that): ``path`` picks the
    files that grow (``/seg-``);
  - ``sync_eio``: ``fsync``/``fdatasync`` raise EIO (a disk that could not
    write back what the page cache held);
  - ``misdirect``: a ``pwrite`` lands ``len(data)`` bytes before its offset
    -- over the record written before it -- and says it wrote where it was
    told, where nothing arrives.
- ``path``: the fault hits only files whose path contains it (a node's data
  directory, ``/seg-`` for journal segments, ``meta.rec``...); all by default.
  One control file may serve a whole cluster: ``path`` picks the node.
- ``count``: how many calls it hits in all, every process of every node
  together (an engine started again after a fault reads the same file): each
  hit claims a file ``<control>.hit.<fault>.<n>``; without it, every call
  while the fault is armed.
- ``id``: names the fault for its count (default: its place in the list).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from raftq.engine.storage import records

KINDS = ("short_write", "no_room", "sync_eio", "misdirect")
WRITES = ("pwrite", "write")
SYNCS = ("fsync", "fdatasync")


def arm(control: str | Path, *faults: dict) -> None:
    """Arm `faults` (replacing those armed before) in every process that watches `control`."""
    for fault in faults:
        if fault.get("kind") not in KINDS:
            raise ValueError(f"a disk fault is one of {KINDS}, not {fault.get('kind')!r}")
    temporary = Path(f"{control}.tmp")
    temporary.write_text(json.dumps({"faults": list(faults)}))
    os.replace(temporary, control)


def disarm(control: str | Path) -> None:
    arm(control)


def hits(control: str | Path, fault_id: str | int = 0) -> int:
    """How many calls the fault (with a count) has hit so far, in every process."""
    control = Path(control)
    return len(list(control.parent.glob(f"{control.name}.hit.{fault_id}.*")))


class FaultyCalls(records.SystemCalls):
    """``records.SystemCalls`` that fail, come up short or misplace what the control file says."""

    def __init__(self, control: str | Path):
        self.control = Path(control)
        self._seen: tuple | None = None
        self._faults: list[dict] = []
        self._refuse_next: set[int] = set()     # descriptors whose next write finds no room

    def _armed(self) -> list[dict]:
        try:
            stat = os.stat(self.control)
        except FileNotFoundError:
            self._seen, self._faults = None, []
            return []
        seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if seen != self._seen:
            try:
                faults = json.loads(self.control.read_text())["faults"]
            except (OSError, ValueError, KeyError):
                return self._faults         # caught mid-write: the last faults read stand
            self._seen = seen
            self._faults = [dict(fault, id=str(fault.get("id", n))) for n, fault in enumerate(faults)]
        return self._faults

    def _hit(self, kinds: tuple[str, ...], fd: int) -> str | None:
        """The kind of the first armed fault of `kinds` that hits a call on `fd`, claiming it."""
        faults = [fault for fault in self._armed() if fault["kind"] in kinds]
        if not faults:
            return None
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        for fault in faults:
            if fault.get("path", "") in path and self._claim(fault):
                return fault["kind"]
        return None

    def _claim(self, fault: dict) -> bool:
        count = fault.get("count")
        if count is None:
            return True
        for n in range(count):
            try:
                os.close(os.open(f"{self.control}.hit.{fault['id']}.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            return True
        return False

    def pwrite(self, fd: int, data, offset: int) -> int:
        if fd in self._refuse_next:
            self._refuse_next.discard(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        kind = self._hit(("short_write", "no_room", "misdirect"), fd)
        data = memoryview(data)
        if kind == "misdirect" and offset - len(data) >= records.FILE_HEADER.size:
            os.pwrite(fd, data, offset - len(data))
            return len(data)
        if kind in ("short_write", "no_room") and len(data) > 1:
            if kind == "no_room":
                self._refuse_next.add(fd)
            return super().pwrite(fd, data[:len(data) // 2], offset)
        return super().pwrite(fd, data, offset)

    def write(self, fd: int, data) -> int:
        if fd in self._refuse_next:
            self._refuse_next.discard(fd)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        kind = self._hit(("short_write", "no_room"), fd)
        data = memoryview(data)
        if kind is not None and len(data) > 1:
            if kind == "no_room":
                self._refuse_next.add(fd)
            return super().write(fd, data[:len(data) // 2])
        return super().write(fd, data)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        if self._hit(("no_room",), fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().fallocate(fd, offset, length)

    def fdatasync(self, fd: int) -> None:
        if self._hit(("sync_eio",), fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        if self._hit(("sync_eio",), fd):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fsync(fd)


def install(control: str | Path) -> FaultyCalls:
    """Route this process's stored writes and syncs through the faults `control` arms."""
    records.calls = FaultyCalls(control)
    return records.calls


def uninstall() -> None:
    records.calls = records.SystemCalls()
