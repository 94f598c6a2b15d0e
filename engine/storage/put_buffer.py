"""The local put buffer: puts accepted (`buffer=allow`) while no leader is reachable.

Queen MQ's failover file buffer, for a Raft cluster: a node that cannot reach
a leader may still take a producer's messages, write them to its own disk
(fsynced before the 202 answer) and forward them, in order, once a leader is
back.  Every buffered message carries an idempotency id, so a replay that is
interrupted and repeated stores each message once.

Files (record files, ``engine.storage.records``):
- ``buffer.log``: one record per buffered put, ``CBOR [queue, messages]``,
  appended and fdatasynced.  A torn tail from a crash fails its checksum and
  is cut at start-up.
- ``buffer.pos``: the offset of the first record not yet forwarded, replaced
  atomically.  When everything has been forwarded, the log is cut back to its
  header and the position reset.
- ``dead.log``: a record the leader refuses for good (a bad request, a missing
  queue) must not hold back the ones behind it: it moves here as
  ``CBOR [queue, messages, reason]``, where an operator finds it;
  ``dead_lettered`` counts them.
"""

import logging
import struct
import threading
from pathlib import Path

import cbor2

from . import records

logger = logging.getLogger(__name__)

LOG_MAGIC = b"RAFTQPB1"
POS_MAGIC = b"RAFTQPP1"
DEAD_MAGIC = b"RAFTQPD1"
POSITION = struct.Struct("<Q")
START = records.FILE_HEADER.size


class BufferFull(Exception):
    pass


def _open_log(path: Path, magic: bytes) -> tuple[records.Appender, int]:
    """An appender after the last whole record of ``path`` (created if missing,
    a torn tail cut), and how many records it holds."""
    data = path.read_bytes() if path.exists() else b""
    if not data:
        records.write_file(path, magic)
        records.fsync_dir(path.parent)
        return records.Appender(path), 0
    if not records.has_header(data, magic):
        raise records.DamagedFile(f"{path} is not a raftq put buffer file ({magic!r}); move it aside to start")
    count, end = 0, START
    for _, end, _ in records.iter_records(data):
        count += 1
    appender = records.Appender(path, end)
    if end < len(data):
        logger.warning("%s: a torn record after offset %d was cut (it was never acknowledged)", path, end)
        appender.truncate(end)
    return appender, count


class PutBuffer:
    def __init__(self, directory: Path, max_bytes: int = 256 << 20):
        self.dir = records.make_dir(directory)
        self.log_path = self.dir / "buffer.log"
        self.pos_path = self.dir / "buffer.pos"
        self.dead_path = self.dir / "dead.log"
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._log, _ = _open_log(self.log_path, LOG_MAGIC)
        self._dead, self.dead_lettered = _open_log(self.dead_path, DEAD_MAGIC)
        self._reader = open(self.log_path, "rb")
        # A crash between emptying the log and recording it leaves an old offset.
        self._pos = min(self._read_pos(), self._log.end)

    def _read_pos(self) -> int:
        try:
            (raw,) = records.read_file(self.pos_path, POS_MAGIC)
            return max(START, POSITION.unpack(raw)[0])
        except FileNotFoundError:
            return START
        except ValueError:
            # written atomically, so only a damaged disk gets here: forwarding
            # everything again is safe, the messages carry idempotency ids
            logger.critical("%s is damaged; every buffered put will be forwarded again", self.pos_path)
            return START

    def dead_letter(self, next_pos: int, queue: str, messages: list, reason: str) -> None:
        """Set the oldest record aside in dead.log (durably) and move past it."""
        payload = cbor2.dumps([queue, messages, reason])
        with self._lock:
            self._dead.append(records.encode(payload))
            self._dead.sync()
            self.dead_lettered += 1
        self.forwarded(next_pos)

    def dead_records(self) -> list:
        """[queue, messages, reason] of every record set aside, oldest first."""
        data = self.dead_path.read_bytes()
        return [cbor2.loads(payload) for _, _, payload in records.iter_records(data)]

    @property
    def pending_bytes(self) -> int:
        return self._log.end - self._pos

    def append(self, queue: str, messages: list) -> None:
        record = records.encode(cbor2.dumps([queue, messages]))
        with self._lock:
            if self.pending_bytes + len(record) > self.max_bytes:
                raise BufferFull()
            self._log.append(record)
            self._log.sync()

    def oldest(self):
        """(next_pos, queue, messages) of the first record not yet forwarded, or None."""
        with self._lock:
            if self._pos >= self._log.end:
                return None
            self._reader.seek(self._pos)
            length, _ = records.RECORD_HEADER.unpack(self._reader.read(records.RECORD_HEADER.size))
            queue, messages = cbor2.loads(self._reader.read(length))
            return self._pos + records.RECORD_HEADER.size + length, queue, messages

    def forwarded(self, next_pos: int) -> None:
        with self._lock:
            self._pos = next_pos
            if self._pos >= self._log.end:
                self._log.truncate(START)
                self._pos = START
            records.replace_file(self.pos_path, POS_MAGIC, [POSITION.pack(self._pos)])

    def close(self) -> None:
        self._reader.close()
        self._log.close()
        self._dead.close()
