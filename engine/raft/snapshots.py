"""Snapshots written by a forked child, so that no node stalls while one is taken.

pysyncobj takes a snapshot through its ``Serializer``: ``serialize`` when the
log is long enough, then ``checkSerializing`` on every tick until it reports
success, when the log prefix the snapshot covers is dropped. With raftq's own
file format (``engine.storage.snapshot_file``) pysyncobj calls the writer on the tick
thread, and a million stored messages take 1.5 s or more to encode and write:
meanwhile that node neither sends heartbeats (a leader is deposed) nor reads
them (a follower calls an election when it wakes up).

``ForkedSnapshots`` forks instead. The child holds a copy-on-write image of
the state as it is between two applies -- the tick, which alone changes the
state, is what forks -- and encodes and writes it while the parent goes on
ticking. The parent pays for the fork (page tables: some
milliseconds per GiB) and for the pages it changes while the child runs;
the child's reads copy the pages of objects whose reference counts they
touch, so a snapshot may briefly cost up to as much memory again as the
state. The child disables garbage collection (it would touch every object)
and is killed if its parent ends (``engine.lifetime.die_with``); it
leaves through ``os._exit``, never running the parent's clean-up.

The child's state is a copy that no other thread touches, so its writer must
not take locks: a lock held by another thread at the fork stays held in the
child for ever.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import time
from typing import Callable

from . import pysyncobj_pin  # noqa: F401  -- the release this override was written for
from pysyncobj.config import SERIALIZER_STATE

from ..lifetime import die_with
from ..storage.damage import DamagedRecord
from ..storage.records import DamagedFile, InsufficientStorage
from .internals import SerializerInternals

logger = logging.getLogger(__name__)

# How much lower the snapshot writer runs than the engine (os.nice).
SNAPSHOT_NICENESS = 10
# The writer's exit status when a carried entry's record failed its checks (it names the entry on
# its pipe): a failed snapshot like another (tried again later, engine.raft.node), and the entry
# is repaired meanwhile.
DAMAGED_EXIT = 3


class ForkedSnapshots(SerializerInternals):
    """pysyncobj's Serializer for a file, with ``write(path, (last, prev, cluster))``
    run in a forked child; ``on_written(last_index, seconds)`` runs in the
    parent once the file is in place. A follower is sent ``ship(path)``, a
    file-like object (the snapshot with every live entry it names carried:
    ``engine.storage.snapshot_file.Shipment``).

    Name-mangled ``_Serializer__*`` attributes are pysyncobj 0.3.17 internals.
    """

    def __init__(self, path: str, transmission_batch: int, *, write: Callable, read: Callable,
                 on_written: Callable[[int, float], None], ship: Callable,
                 on_damaged: Callable[[DamagedRecord], None]):
        super().__init__(path, transmission_batch, False, write, read, None)
        self._path = path
        self._write = write
        self._ship = ship
        self._on_written = on_written
        self._on_damaged = on_damaged
        self._started = 0.0
        self._last_index = 0
        self.failed_at: float | None = None   # when the last snapshot failed (None: it succeeded)
        self._damage_pipe: int | None = None     # the running writer's report of a damaged record

    def busy(self) -> bool:
        return self.fork_pid != 0

    def serialize(self, data, id):
        if self.busy():
            return
        _, last, _, _ = data
        parent = os.getpid()
        started = time.monotonic()
        report, told = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(report)
            self._write_in_child(parent, data[1:], told)
        os.close(told)
        self._damage_pipe = report
        self.current_id = id
        self.fork_pid = pid
        self._started = started
        self._last_index = last[1]

    def _write_in_child(self, parent: int, data, told: int) -> None:
        status = 1
        try:
            gc.disable()
            die_with(parent)
            # Encoding a million messages takes seconds of a core: below the
            # engines and the fronts, it cannot delay a heartbeat, and it
            # still gets a share under load so that the log is compacted.
            os.nice(SNAPSHOT_NICENESS)
            temporary = self._path + ".tmp"
            self._write(temporary, data)
            os.replace(temporary, self._path)
            status = 0
        except DamagedRecord as damage:
            # never carried on with a fresh checksum: the parent repairs it, a later writer carries it
            logger.error("writing a snapshot stopped at a damaged record: %s", damage)
            os.write(told, f"{damage.index}\n{damage.where}".encode())
            status = DAMAGED_EXIT
        except InsufficientStorage as exc:
            # a full disk is the operator's to fix, not a broken invariant: the log is kept, the
            # snapshot is taken again later (engine.raft.node SNAPSHOT_RETRY_S)
            logger.error("no room on the disk for a snapshot (%s); the log is kept and a snapshot is "
                         "taken again later", exc)
        except BaseException:
            logger.critical("writing a snapshot failed", exc_info=True)
        finally:
            os._exit(status)

    def checkSerializing(self):
        pid = self.fork_pid
        if pid == 0:
            return SERIALIZER_STATE.NOT_SERIALIZING, None
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:   # reaped elsewhere: its outcome is unknown
            done, status = pid, -1
        if done == 0:
            return SERIALIZER_STATE.SERIALIZING, self.current_id
        self.fork_pid = 0
        report = self._read_damage_report()
        if status != -1 and os.WIFEXITED(status) and os.WEXITSTATUS(status) == DAMAGED_EXIT and report:
            index, where = report.split("\n", 1)
            self.failed_at = time.monotonic()
            self._on_damaged(DamagedRecord(int(index), where))
            return SERIALIZER_STATE.FAILED, self.current_id
        if status == -1 or not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            logger.error("the snapshot writer (pid %d) failed with status %#x; the log is kept", pid, status)
            self.failed_at = time.monotonic()
            return SERIALIZER_STATE.FAILED, self.current_id
        self.failed_at = None
        # transmissions of the previous file to followers start over with this one
        self.transmissions = {}
        self._on_written(self._last_index, time.monotonic() - self._started)
        return SERIALIZER_STATE.SUCCESS, self.current_id

    def _read_damage_report(self) -> str:
        report, self._damage_pipe = self._damage_pipe, None
        if report is None:
            return ""
        try:
            return os.read(report, 4096).decode(errors="replace")
        finally:
            os.close(report)

    # -- this node's snapshot, sent ------------------------------------------

    def getTransmissionData(self, transmissionID):
        if self.busy():
            return None
        transmissions = self.transmissions
        if transmissionID not in transmissions:
            try:
                transmissions[transmissionID] = {"file": self._ship(self._path), "transmitted": 0}
            except DamagedFile as damage:
                # told where it was found, and repaired or replaced; asked again at every append
                logger.debug("cannot ship the snapshot to %s yet: %s", transmissionID, damage)
                return None
            except Exception:
                logger.exception("cannot ship the snapshot to %s; trying again at the next append", transmissionID)
                return None
        data = super().getTransmissionData(transmissionID)
        # pysyncobj answers False to a read that failed, then indexes it as a chunk (TypeError in
        # the tick); None sends nothing and it starts over at the next append
        return None if data is False else data

    # -- a leader's snapshot, received ---------------------------------------

    @property
    def incoming(self) -> str:
        """Where a leader's snapshot is received: beside this node's own, which
        it replaces only once the Raft node decides to load it (``take_incoming``)."""
        return self._path + ".incoming"

    def setTransmissionData(self, data):
        # pysyncobj writes the chunks to a temporary file and renames it over
        # its file name when the last one arrives: here that name is incoming.
        own, self.file_name = self.file_name, self.incoming
        try:
            return super().setTransmissionData(data)
        finally:
            self.file_name = own

    def take_incoming(self) -> None:
        os.replace(self.incoming, self._path)

    def drop_incoming(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.incoming)

    def abandon(self) -> None:
        """Stop a child still writing (the node is stopping); its temporary
        file is left behind and overwritten by the next snapshot."""
        pid = self.fork_pid
        if pid > 0:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            self.fork_pid = 0
            self._read_damage_report()
