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
        self._file = open(self.log_path, "a+b")
        self._end = self._valid_end()
        self._file.truncate(self._end)
        # A crash between emptying the log and recording it leaves an old offset.
        self._pos = min(self._pos, self._end)

    def _valid_end(self) -> int:
        self._file.seek(0)
        data = self._file.read()
        offset = 0
        while offset + RECORD.size <= len(data):
            length, crc = RECORD.unpack_from(data, offset)
            payload = data[offset + RECORD.size: offset + RECORD.size + length]
            if len(payload) < length or zlib.crc32(payload) != crc:
                break
            offset += RECORD.size + length
        return offset

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
