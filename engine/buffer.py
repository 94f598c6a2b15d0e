"""The local put buffer: puts accepted (`buffer=allow`) while no leader is reachable.

Queen MQ's failover file buffer, for a Raft cluster: a node that cannot reach
a leader may still take a producer's messages, write them to its own disk
(fsynced before the 202 answer) and forward them, in order, once a leader is
back.  Every buffered message carries an idempotency id, so a replay that is
interrupted and repeated stores each message once.

File format: records ``<u32 length><u32 crc32><CBOR [queue, messages]>``
appended to ``buffer.log``; ``buffer.pos`` holds the offset of the first
record not yet forwarded (temp file, fsync, rename).  A torn tail from a
crash fails its checksum and is cut at start-up.  When everything has been
forwarded, both are reset to empty.

A record the leader refuses for good (a bad request, a missing queue) must
not hold back the ones behind it: it moves to ``dead.log`` (records
``<u32 length><u32 crc32><CBOR [queue, messages, reason]>``), where an
operator finds it; ``dead_lettered`` counts them.
"""

import os
import struct
import threading
import zlib
from pathlib import Path

import cbor2

RECORD = struct.Struct("<II")


class BufferFull(Exception):
    pass


class PutBuffer:
    def __init__(self, directory: Path, max_bytes: int = 256 << 20):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "buffer.log"
        self.pos_path = self.dir / "buffer.pos"
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._pos = int(self.pos_path.read_text()) if self.pos_path.exists() else 0
        self.dead_path = self.dir / "dead.log"
        self._file = open(self.log_path, "a+b")
        self._end = self._valid_end(self._file)
        self.dead_lettered = self._count_dead()
        self._file.truncate(self._end)
        # A crash between emptying the log and recording it leaves an old offset.
        self._pos = min(self._pos, self._end)

    @staticmethod
    def _records(data: bytes):
        """(offset after, payload) of each whole record, up to the first torn one."""
        offset = 0
        while offset + RECORD.size <= len(data):
            length, crc = RECORD.unpack_from(data, offset)
            payload = data[offset + RECORD.size: offset + RECORD.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                return
            offset += RECORD.size + length
            yield offset, payload

    def _valid_end(self, file) -> int:
        file.seek(0)
        end = 0
        for end, _ in self._records(file.read()):
            pass
        return end

    def _count_dead(self) -> int:
        if not self.dead_path.exists():
            return 0
        return sum(1 for _ in self._records(self.dead_path.read_bytes()))

    def dead_letter(self, next_pos: int, queue: str, messages: list, reason: str) -> None:
        """Set the oldest record aside in dead.log (durably) and move past it."""
        payload = cbor2.dumps([queue, messages, reason])
        with self._lock:
            with open(self.dead_path, "ab") as dead:
                dead.write(RECORD.pack(len(payload), zlib.crc32(payload)) + payload)
                dead.flush()
                os.fdatasync(dead.fileno())
            self.dead_lettered += 1
        self.forwarded(next_pos)

    def dead_records(self) -> list:
        """[queue, messages, reason] of every record set aside, oldest first."""
        if not self.dead_path.exists():
            return []
        return [cbor2.loads(p) for _, p in self._records(self.dead_path.read_bytes())]

    @property
    def pending_bytes(self) -> int:
        return self._end - self._pos

    def append(self, queue: str, messages: list) -> None:
        payload = cbor2.dumps([queue, messages])
        with self._lock:
            if self.pending_bytes + len(payload) + RECORD.size > self.max_bytes:
                raise BufferFull()
            self._file.seek(self._end)
            self._file.write(RECORD.pack(len(payload), zlib.crc32(payload)) + payload)
            self._file.flush()
            os.fdatasync(self._file.fileno())
            self._end += RECORD.size + len(payload)

    def oldest(self):
        """(next_pos, queue, messages) of the first record not yet forwarded, or None."""
        with self._lock:
            if self._pos >= self._end:
                return None
            self._file.seek(self._pos)
            length, _ = RECORD.unpack(self._file.read(RECORD.size))
            queue, messages = cbor2.loads(self._file.read(length))
            return self._pos + RECORD.size + length, queue, messages

    def forwarded(self, next_pos: int) -> None:
        with self._lock:
            self._pos = next_pos
            if self._pos >= self._end:
                self._file.truncate(0)
                os.fsync(self._file.fileno())
                self._pos = self._end = 0
            tmp = self.pos_path.with_suffix(".tmp")
            with open(tmp, "w") as f:
                f.write(str(self._pos))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.pos_path)
            dir_fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def close(self) -> None:
        self._file.close()
