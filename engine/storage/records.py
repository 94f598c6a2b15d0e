"""Checksummed record files: the one on-disk format of everything a node keeps.

The journal's segments and its meta file, the snapshot, and the put buffer
(its log, its read position, its dead letters) are all record files:

- a 16-byte header ``<8-byte magic><u64 tag>``: the magic names what the file
  holds (a file is never read as another kind), the tag is the file's own
  (a journal segment's sequence number; 0 elsewhere);
- then records ``<u32 length><u32 crc32(length bytes + payload)><payload>``.
  The checksum covers the length too, so a damaged length is caught like a
  damaged payload rather than sending the reader off to a wrong offset.

Reading (``iter_records``, ``read_file``) stops at the first record that is
short or fails its checksum: what follows a torn or damaged record is never
trusted, and the caller decides whether that is a torn tail to cut (the
journal, the buffer) or a damaged file to refuse (the snapshot, meta).

Writing, one way for each shape of file:
- a whole file (``write_file``; ``replace_file`` when an older version must
  survive a crash): created 0600, written, fsynced; ``replace_file`` writes a
  temp file, renames it over the old one and fsyncs the directory. A payload
  too large to hold in memory twice (a snapshot's state) is encoded straight
  into the file, and its record header written last;
- an appended log (``Appender``): records written at the end and made durable
  by ``sync`` (fdatasync) before anything acknowledges them. With
  ``preallocate`` the file is extended that many bytes at a time with
  ``posix_fallocate`` and written with ``pwrite``: a data sync then has no
  file size to commit (measured with three processes syncing on one ext4
  disk: fdatasync p50 from about 0.25 ms to 0.20 ms). Zero bytes after the
  last record are that unused preallocation, not damage (``zero_tail``).
Every file and directory a node creates is its owner's only (0600 / 0700),
whatever the process umask.

Every write is checked (issue 47): a short count from ``write``/``pwrite`` is
completed, and a write that finds no room (ENOSPC, EDQUOT) raises
``InsufficientStorage`` with nothing of it counted -- an ``Appender`` cuts its
file back to its last whole record, a file being written is removed. A failed
``fsync``/``fdatasync`` is fatal (``SyncFailed``): after one, Linux may have
dropped the dirty pages and cleared the error, so a second sync would report
success for data that is gone (PostgreSQL's "fsyncgate"). The process's
``on_fatal`` handler runs first (an engine exits to be started again and
recover from what is on disk and from its peers: raftq/engine_process.py),
and an ``Appender`` whose sync failed never syncs again.

The system calls that write and sync stored bytes go through ``calls`` (a
``SystemCalls``): production never replaces it; a fault injector for tests
and the chaos suite (chaos/disk_faults.py, which is not installed) does, to
make them fail, come up short or land at the wrong offset.
"""

from __future__ import annotations

import contextlib
import errno
import io
import logging
import mmap
import os
import struct
import zlib
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, Iterator, NamedTuple

logger = logging.getLogger(__name__)

FILE_HEADER = struct.Struct("<8sQ")
RECORD_HEADER = struct.Struct("<II")
_LENGTH = struct.Struct("<I")
FILE_MODE = 0o600


class DamagedFile(ValueError):
    """A whole-file record file (snapshot, meta) that is not exactly what was written."""


class InsufficientStorage(OSError):
    """A write found no room on its filesystem (ENOSPC, EDQUOT): nothing of it counts."""


class SyncFailed(OSError):
    """A sync of stored bytes failed: what it was to make durable may be lost, and no later
    sync may say otherwise. Fatal to the process that gets it."""


NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


class SystemCalls:
    """The system calls through which stored bytes are written and made durable: the os's own.
    ``calls`` is the one instance production uses; a fault injector replaces it."""

    def pwrite(self, fd: int, data, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def write(self, fd: int, data) -> int:
        return os.write(fd, data)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fallocate(self, fd: int, offset: int, length: int) -> None:
        os.posix_fallocate(fd, offset, length)


calls = SystemCalls()
_on_fatal: Callable[[str], None] | None = None


def on_fatal(handler: Callable[[str], None] | None) -> None:
    """What this process does once its stored state can no longer be trusted (a failed sync):
    an engine exits, to be started again and recover from what is on disk and from its peers;
    None (tests, tools): the error is only raised."""
    global _on_fatal
    _on_fatal = handler


def fatal(reason: str) -> None:
    """Stored state this process can no longer trust: say why, then run the process's handler."""
    logger.critical("%s; this process stops, to recover from what is on disk", reason)
    if _on_fatal is not None:
        _on_fatal(reason)


def sync_fd(fd: int, what, *, data_only: bool = False) -> None:
    """fsync (or fdatasync) ``fd``, which holds ``what`` (its path, for the message); a failure
    is fatal (``on_fatal``), then ``SyncFailed``."""
    try:
        calls.fdatasync(fd) if data_only else calls.fsync(fd)
    except OSError as exc:
        reason = f"{'fdatasync' if data_only else 'fsync'} of {what} failed: {exc.strerror or exc}"
        fatal(f"{reason}. What it was to make durable may be lost, and a second sync would say it was not "
              "(fsyncgate): nothing it covers is acknowledged")
        raise SyncFailed(exc.errno, reason) from exc


def _write_error(exc: OSError, what) -> OSError:
    if exc.errno in NO_ROOM:
        return InsufficientStorage(exc.errno, f"no room to write {what}: {exc.strerror}")
    return exc


def pwrite_all(fd: int, data, offset: int, what) -> None:
    """Write all of ``data`` at ``offset`` (a short count is completed); InsufficientStorage when
    the filesystem runs out of room part-way."""
    view = memoryview(data)
    while view:
        try:
            written = calls.pwrite(fd, view, offset)
        except OSError as exc:
            raise _write_error(exc, what) from exc
        if written <= 0:
            raise InsufficientStorage(errno.ENOSPC, f"no room to write {what}: nothing was written")
        view = view[written:]
        offset += written


def record_header(payload) -> bytes:
    length = _LENGTH.pack(len(payload))
    return length + _LENGTH.pack(zlib.crc32(payload, zlib.crc32(length)))


def encode(payload: bytes) -> bytes:
    return record_header(payload) + payload


def file_header(magic: bytes, tag: int = 0) -> bytes:
    return FILE_HEADER.pack(magic, tag)


def _intact(header, payload) -> bool:
    """Whether ``payload`` is the one its record header announced."""
    length, crc = RECORD_HEADER.unpack(header)
    return len(payload) == length and zlib.crc32(payload, zlib.crc32(header[:_LENGTH.size])) == crc


def iter_records(data, offset: int = FILE_HEADER.size) -> Iterator[tuple[int, int, memoryview]]:
    """(start, end, payload) of each whole, intact record from ``offset``, up to
    the first one that is not; payloads are views into ``data``."""
    view = memoryview(data)
    size = len(view)
    while offset + RECORD_HEADER.size <= size:
        body = offset + RECORD_HEADER.size
        (length,) = _LENGTH.unpack_from(view, offset)
        if body + length > size or not _intact(view[offset:body], view[body:body + length]):
            return
        yield offset, body + length, view[body:body + length]
        offset = body + length


def payload_at(data, offset: int) -> memoryview | None:
    """The payload of the intact record that starts at ``offset`` of ``data``, or None."""
    return next((payload for _, _, payload in iter_records(memoryview(data)[offset:], 0)), None)


def has_header(data, magic: bytes, tag: int | None = None) -> bool:
    if len(data) < FILE_HEADER.size:
        return False
    found, found_tag = FILE_HEADER.unpack_from(data)
    return found == magic and (tag is None or found_tag == tag)


def zero_tail(data, end: int) -> bool:
    """True if everything after ``end`` is zero bytes (unused preallocation)."""
    return data.count(0, end) == len(data) - end


def check_file(path: str | Path, magic: bytes, count: int) -> None:
    """DamagedFile unless ``path`` holds exactly ``count`` intact records
    after its header, as ``write_file`` wrote them. Read through a map, so
    a large snapshot is checked without a copy of it in memory."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < FILE_HEADER.size:
            raise DamagedFile(f"{path}: not a {magic!r} file")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if not has_header(data, magic):
                raise DamagedFile(f"{path}: not a {magic!r} file")
            ends = [end for _, end, _ in iter_records(data)]
    if len(ends) != count or (ends[-1] if ends else FILE_HEADER.size) != size:
        raise DamagedFile(f"{path}: {len(ends)} intact record(s) of {count}, ending at "
                          f"{ends[-1] if ends else FILE_HEADER.size} of {size} bytes")


def read_file(path: str | Path, magic: bytes, *, first: int | None = None) -> list[bytes]:
    """Every record of a whole file written by ``write_file`` (or only its
    ``first`` ones); DamagedFile if the header, any record read or the length
    is not exactly as written. Each payload is read straight into its own
    bytes (a snapshot's state is most of the file: no second copy of it)."""
    payloads = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not has_header(f.read(FILE_HEADER.size), magic):
            raise DamagedFile(f"{path}: not a {magic!r} file")
        while (first is None or len(payloads) < first) and (header := f.read(RECORD_HEADER.size)):
            at = f.tell() - len(header)
            if len(header) < RECORD_HEADER.size:
                raise DamagedFile(f"{path}: torn record at offset {at}")
            # a damaged length must not make us read (or allocate) past the file
            payload = f.read(min(_LENGTH.unpack_from(header)[0], size - f.tell()))
            if not _intact(header, payload):
                raise DamagedFile(f"{path}: damaged record at offset {at}")
            payloads.append(payload)
    return payloads


def write_file(path: str | Path, magic: bytes, payloads: Iterable[bytes | Callable[[BinaryIO], None]] = (), *,
               tag: int = 0, sync: bool = True) -> int:
    """Create (or overwrite) ``path`` holding ``payloads``, fsynced unless told
    otherwise; returns its size. A large payload is written as it is, not copied.
    A payload may also be a function that writes it into the binary file it is
    given as it encodes it: a state too large to hold twice (the snapshot's)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        writer = _SyncedAsWritten(fd, path, sync)
        writer.write(file_header(magic, tag))
        for payload in payloads:
            if isinstance(payload, Encoded):
                writer.write(payload.record)
            elif callable(payload):
                writer.write_streamed(payload)
            else:
                writer.write(record_header(payload))
                writer.write(payload)
        if sync:
            sync_fd(fd, path)
    except BaseException:
        # half a file would read as a damaged one: none is left
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    return writer.size


class Encoded(NamedTuple):
    """A record already encoded (read from another record file), written to a file as it is."""
    record: bytes


# A snapshot of a million messages is hundreds of MiB: left dirty in the page
# cache until one fsync at the end, it is flushed all at once, and the
# journal's fdatasync of a 100-byte append (ext4's ordered mode commits them
# together) waited 0.3 s behind it on this machine's disk -- longer than the
# leader lease. Synced every few MiB as it is written, it holds an append back
# ~0.1 s at most.
WRITEBACK_BYTES = 8 << 20
# How much of a streamed payload is gathered before it is written, and read back at once to
# checksum it
STREAM_BUFFER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = (1 << 32) - 1     # what a record's u32 length can say


class _SyncedAsWritten:
    """Writes to a descriptor (of ``path``) whole, syncing the data every WRITEBACK_BYTES (if
    asked to sync)."""

    def __init__(self, fd: int, path, sync: bool):
        self.fd, self.path, self.sync, self.size, self._unsynced = fd, path, sync, 0, 0

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = calls.write(self.fd, view[:WRITEBACK_BYTES])
            except OSError as exc:
                raise _write_error(exc, self.path) from exc
            if written <= 0:
                raise InsufficientStorage(errno.ENOSPC, f"no room to write {self.path}: nothing was written")
            view = view[written:]
            self.size += written
            self._unsynced += written
            if self.sync and self._unsynced >= WRITEBACK_BYTES:
                sync_fd(self.fd, self.path, data_only=True)
                self._unsynced = 0

    def write_streamed(self, produce: Callable[[BinaryIO], None]) -> None:
        """A record whose payload `produce` writes: its header (the payload's length, and a
        checksum that begins with that length) is written over a blank one once the payload
        is done, read back from the page cache to checksum it."""
        start = self.size
        self.write(bytes(RECORD_HEADER.size))
        with io.BufferedWriter(_Into(self), STREAM_BUFFER_BYTES) as out:
            produce(out)
        length = self.size - start - RECORD_HEADER.size
        if length > MAX_PAYLOAD_BYTES:
            raise ValueError(f"a record of {length} bytes is longer than a record can say")
        size = _LENGTH.pack(length)
        crc = zlib.crc32(size)
        at = start + RECORD_HEADER.size
        while at < self.size:
            chunk = os.pread(self.fd, min(STREAM_BUFFER_BYTES, self.size - at), at)
            if not chunk:
                raise OSError(f"the record written at {start} of the file reads back short")
            crc = zlib.crc32(chunk, crc)
            at += len(chunk)
        pwrite_all(self.fd, size + _LENGTH.pack(crc), start, self.path)


class _Into(io.RawIOBase):
    """A raw binary file that hands what it is written to a ``_SyncedAsWritten``."""

    def __init__(self, writer: _SyncedAsWritten):
        super().__init__()
        self._writer = writer

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._writer.write(data)
        return len(data)


def replace_file(path: str | Path, magic: bytes, payloads: Iterable[bytes], *, sync: bool = True) -> None:
    """Replace ``path`` atomically: a crash leaves the old file or the new one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    write_file(tmp, magic, payloads, sync=sync)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sync_fd(fd, path)
    finally:
        os.close(fd)


def make_dir(path: str | Path) -> Path:
    """``path`` (0700 if it is new) and its missing parents."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


class Appender:
    """Appends records at the end of one record file; ``sync`` makes them durable.

    ``end`` is where the records end (a file opened after a crash may hold
    unused preallocation or a torn tail past it, which the next append
    overwrites). An append that fails (no room, an I/O error) leaves ``end``
    where it was and cuts the file back to it: no part of a record is left
    after the last whole one, for a later append to leave a hole before it.
    Once a sync has failed, every later ``sync`` and ``append`` raises the same
    ``SyncFailed``: a second sync could succeed without the data.
    """

    def __init__(self, path: str | Path, end: int | None = None, *, preallocate: int = 0):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_WRONLY)
        self.allocated = os.fstat(self.fd).st_size   # the file's size on disk
        self.end = self.allocated if end is None else end
        self.dirty = False                           # appended since the last sync
        self.failed: SyncFailed | None = None        # the sync that failed
        self._preallocate = preallocate

    def append(self, data: bytes) -> int:
        """Write ``data`` (encoded records) at the end; returns the offset it starts at.
        InsufficientStorage (or the OSError of the write) with nothing appended."""
        if self.failed is not None:
            raise self.failed
        offset = self.end
        end = offset + len(data)
        try:
            if end > self.allocated:
                self._allocate(end)
            pwrite_all(self.fd, data, offset, self.path)
        except OSError:
            self._cut_back()
            raise
        self.allocated = max(self.allocated, end)
        self.end = end
        self.dirty = True
        return offset

    def _allocate(self, end: int) -> None:
        """Room up to ``end`` at least, ``preallocate`` bytes ahead when there is room for that."""
        if not self._preallocate:
            return
        for target in dict.fromkeys((max(end, self.allocated + self._preallocate), end)):
            try:
                calls.fallocate(self.fd, self.allocated, target - self.allocated)
            except OSError as exc:
                if exc.errno in NO_ROOM:
                    self._cut_back()      # what it may have allocated before it gave up
                    continue
                if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    logger.info("%s: no preallocation on this filesystem", self.path)
                    self._preallocate = 0
                    return
                raise
            self.allocated = target
            return
        raise InsufficientStorage(errno.ENOSPC, f"no room to write {self.path}: {end - self.end} bytes more")

    def _cut_back(self) -> None:
        os.ftruncate(self.fd, self.end)
        self.allocated = self.end

    def sync(self) -> bool:
        """fdatasync what was appended since the last sync; True if it had to."""
        if self.failed is not None:
            raise self.failed
        if not self.dirty:
            return False
        try:
            sync_fd(self.fd, self.path, data_only=True)
        except SyncFailed as failed:
            self.failed = failed
            raise
        self.dirty = False
        return True

    def truncate(self, end: int) -> None:
        """Cut the file back to ``end``, durably: a lost truncation followed by
        shorter appends would bring stale records back."""
        if self.failed is not None:
            raise self.failed
        os.ftruncate(self.fd, end)
        try:
            sync_fd(self.fd, self.path)
        except SyncFailed as failed:
            self.failed = failed
            raise
        self.allocated = self.end = end
        self.dirty = False

    def trim(self) -> None:
        """Give back the unused preallocation."""
        if self.allocated > self.end:
            os.ftruncate(self.fd, self.end)
            self.allocated = self.end

    def close(self) -> None:
        os.close(self.fd)
