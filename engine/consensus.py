"""raftq's consensus module: the only code in raftq that imports pysyncobj.

Theory of operation
-------------------
pysyncobj (pinned to 0.3.17, checked at import) runs the Raft protocol on its
own *tick thread*: network I/O, elections, replication, commit, apply. raftq
gives it one replicated method, ``_raftq_apply(entry: bytes)``, which hands the
entry to the state machine's ``apply``. Everything above this module sees
``Consensus``: ``submit(entry, callback, term=...)``, ``status()``, membership,
leadership transfer and snapshots, with raftq's own node ids; pysyncobj knows
nodes only by their Raft addresses, so an id <-> address map lives here.

A submitted entry is wrapped in a ticket. The ticket's callback runs exactly
once on the tick thread: with the apply result when the entry is committed and
applied here, or with an error string -- ``not_leader``, ``no_quorum``,
``too_large``, ``overloaded`` (definitely not applied); ``discarded``,
``leader_changed``, ``unknown_outcome``, ``timeout`` (maybe applied: retry with
the same idempotency id); ``denied`` (membership change refused). A ticket
that outlives ``submit_timeout`` gets ``timeout`` and any later outcome from
pysyncobj is dropped.

Gaps of pysyncobj 0.3.17 closed here (../shared/PYSYNCOBJ.md)
------------------------------------------------------------------
1. Durability. ``engine.journal.DurableJournal`` (checksummed, fsynced
   segments; term/vote/commit index in an fsynced meta file) replaces
   pysyncobj's mmap journal through pysyncobj's single injection point,
   ``createJournal`` as imported into ``pysyncobj.syncobj``: it is wrapped once
   so that a journal *object* passed as ``conf.journalFile`` is used as is,
   while any other value gets pysyncobj's own behaviour -- per instance, and
   inert for other users of pysyncobj in the process. Syncs are grouped but
   never skipped: the leader appends a round of commands, sends them to the
   followers and fsyncs while they do (Raft allows the leader's own write in
   parallel; it counts itself only at the next tick, after the sync); a
   follower appends what one network poll brought, fsyncs once, and only then
   sends the acknowledgements it queued meanwhile. Anything that could make a
   queued acknowledgement untrue (truncation, clear, a new term) first flushes
   the queue.
2. Follower truncation. ``_RaftNode`` handles AppendEntries itself: it
   deletes entries only on a real conflict (same index, different term),
   appends only entries it lacks, acknowledges the last index of the
   *leader's* message (not its own last index) and advances its commit index
   only up to entries verified against the leader. pysyncobj truncated after
   every overlapping, shorter batch, dropping acknowledged entries.
3. Never raise. The state machine's ``apply`` is wrapped (an exception is
   logged CRITICAL and becomes the result ``{"error": "internal", ...}``, so
   it cannot re-run forever), and so is every user callback (an exception in
   one would otherwise make pysyncobj apply the entry again).
4. Snapshots go through pysyncobj's ``serializer``/``deserializer`` hooks:
   the state machine's own bytes plus the two last applied entries and the
   membership, in a checksummed file written and fsynced on the tick thread
   (no pickle of live objects, no fork). ``journalFile`` and ``fullDumpFile``
   are always both set. Compaction thresholds are jittered per node so the
   replicas do not all stall at once, and the leader defers its own
   compaction (a snapshot stalls the tick thread; on the leader that would
   stop heartbeats and cause an election).
5. Proxy dialing. A node's identity is its ``raft_addr``; ``Peer.dial_addr``
   only changes where this node connects to (``_DialingTransport``). It lives
   in the transport rather than in a Node subclass because Node objects are
   pickled into the replicated log on membership changes, where one node's
   dial address would leak to the others.
6. Commit callbacks drive ``bench/consensus_bench.py``.
7. No forwarding. pysyncobj sends a command queued on a node that has lost
   the lead to the new leader; raftq entries carry their proposer's log
   time, valid for one term only, so ``_TermCheckedQueue`` refuses them.

Also: node-to-node messages sealed with AES-GCM (``engine.sealer``) instead of
pysyncobj's Fernet, at a fraction of its cost per message, and framed without
zlib (``_Connection``); followers told the commit index with the next append
or heartbeat rather than by an extra round after every apply; fast failover
timing, a low ``leaderFallbackTimeout`` and a quorum check before accepting a
write (pysyncobj has no check-quorum), entries above ``max_entry_bytes``
refused before they reach pysyncobj (its chunked path for big entries is
broken), the Raft port bound to the configured host rather than 0.0.0.0, and a
loud warning when no cluster secret is set (node-to-node messages are
unpickled: without the secret anyone reaching the port can run code; the
node process refuses to start without one unless told it is a test).

The Raft port faces whoever can reach it (docs/security.md): a frame longer
than ``max_frame_bytes`` closes its connection as soon as its length is read;
an incoming connection must name a configured peer within
``HANDSHAKE_DEADLINE_S`` (pysyncobj's read-only peers and utility commands
are refused), and an address may hold only ``PENDING_PER_ADDRESS`` such
connections at a time.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import pickle
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import cbor2
import pysyncobj.syncobj as _syncobj
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import FAIL_REASON
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.fast_queue import FastQueue
from pysyncobj.journal import Journal
from pysyncobj.monotonic import monotonic
from pysyncobj import pickle as _pickle
from pysyncobj.node import TCPNode
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.transport import TCPTransport
from pysyncobj.version import VERSION as _PYSYNCOBJ_VERSION

from .journal import DurableJournal
from .sealer import Sealer

logger = logging.getLogger(__name__)

# The overrides below read and replace pysyncobj internals line by line; a
# different release must be re-read before this pin moves.
PYSYNCOBJ_PIN = "0.3.17"
if _PYSYNCOBJ_VERSION != PYSYNCOBJ_PIN:
    raise ImportError(f"engine.consensus needs pysyncobj=={PYSYNCOBJ_PIN}, found {_PYSYNCOBJ_VERSION}")


def _install_journal_hook() -> None:
    original = _syncobj.createJournal
    if getattr(original, "raftq_hook", False):
        return

    def createJournal(journalFile=None):
        if isinstance(journalFile, Journal):
            return journalFile
        return original(journalFile)

    createJournal.raftq_hook = True
    _syncobj.createJournal = createJournal


_install_journal_hook()

_FOLLOWER, _CANDIDATE, _LEADER = _syncobj._RAFT_STATE.FOLLOWER, _syncobj._RAFT_STATE.CANDIDATE, _syncobj._RAFT_STATE.LEADER
_ROLE_NAMES = {_FOLLOWER: "follower", _CANDIDATE: "candidate", _LEADER: "leader"}
LEADER_COMPACTION_FACTOR = 4
_REGULAR = _syncobj._COMMAND_TYPE.REGULAR

_ERRORS = {
    FAIL_REASON.QUEUE_FULL: "overloaded",
    FAIL_REASON.MISSING_LEADER: "no_quorum",
    FAIL_REASON.DISCARDED: "discarded",
    FAIL_REASON.NOT_LEADER: "not_leader",
    FAIL_REASON.LEADER_CHANGED: "leader_changed",
    FAIL_REASON.REQUEST_DENIED: "denied",
    FAIL_REASON.UNKNOWN_OUTCOME: "unknown_outcome",
}

SNAPSHOT_MAGIC = b"RAFTQSN1"
JOURNAL_DIR = "journal"
SNAPSHOT_FILE = "snapshot.bin"


@dataclass(frozen=True)
class Peer:
    id: str
    raft_addr: str
    dial_addr: str | None = None


class _Ticket:
    """One caller's callback, resolved exactly once, on the tick thread.

    ``term`` is the term the caller prepared its entry for: the entry may enter
    the log only while this node leads that term.
    """

    __slots__ = ("callback", "deadline", "term", "done")

    def __init__(self, callback, deadline: float, term: int):
        self.callback = callback
        self.deadline = deadline
        self.term = term
        self.done = False

    def resolve(self, result, error: str | None) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.callback(result, error)
        except Exception:
            logger.exception("a consensus callback raised; ignored so the entry is not applied again")

    def on_pysyncobj_result(self, result, fail_reason) -> None:
        if fail_reason == FAIL_REASON.SUCCESS:
            self.resolve(result, None)
        else:
            self.resolve(None, _ERRORS.get(fail_reason, "unknown_outcome"))


class _TermCheckedQueue(FastQueue):
    """pysyncobj's command queue, handing out only what may enter the log now.

    pysyncobj takes a queued command off this queue on the tick thread and,
    if the node has meanwhile lost the lead, sends it to the new leader
    (``apply_command``), which appends it to its log. A raftq entry carries
    its proposer's log time (``now_ms``), which is only right for the term it
    was stamped in: forwarded, an old leader's clock would run the new term's
    log time ahead of real time and expire leases early (found by the chaos
    suite: a paused leader woke up and put its tick into the new leader's
    log, 223 ms ahead). So a command is handed out only while this node leads
    the term it was submitted for; any other is refused, definitely not
    applied, and its caller retries with the current leader. The check runs
    on the tick thread at the moment pysyncobj decides, so no role change can
    slip in between.
    """

    def __init__(self, node: "_RaftNode", max_size: int):
        super().__init__(max_size)
        self._node = node

    def get_nowait(self):
        while True:
            command, callback = super().get_nowait()
            ticket = getattr(callback, "__self__", None)
            if not isinstance(ticket, _Ticket) or self._node.leads(ticket.term):
                return command, callback
            ticket.resolve(None, "not_leader")


FRAME = struct.Struct("<I")   # a Raft message on the wire: <length><sealed pickle>
# Until a connection has named a configured peer (sealed with the cluster
# secret), it may take this long, and one address may hold this many such
# connections at once (all addresses together: PENDING_LIMIT); anything
# beyond is closed at once, so garbage or stalled sockets cost nothing.
HANDSHAKE_DEADLINE_S = 2.0
PENDING_PER_ADDRESS = 4
PENDING_LIMIT = 64


def max_frame_bytes(max_entry_bytes: int) -> int:
    """The largest Raft message a peer can legitimately send.

    pysyncobj packs entries up to the batch size (max entry + 64 KiB) and may
    overshoot by one entry; snapshots travel in 1 MiB chunks.  The rest is
    pickle and seal overhead.
    """
    return 2 * (max_entry_bytes + 64 * 1024) + (1 << 20)


class _Connection(TcpConnection):
    """pysyncobj's TCP connection with raftq's framing: no zlib.

    pysyncobj deflates every message before encrypting it. ``zlib.compress``
    costs about 40 us even for a 400-byte message (deflateInit's tables) and
    17 ms for a 1 MiB entry, once per follower. Measured with
    bench/consensus_bench.py, leaving it out took the lone commit p50 from
    0.94 to 0.79 ms and 64 KiB entries from 7.7 to 35 MiB/s. Every node of a
    cluster must frame alike (raftq nodes all use this class, both ways).

    The checks pysyncobj makes with ``assert`` (gone under ``python -O``)
    are explicit here, and a connection's last timestamp moves only after
    the message authenticated.  A frame may declare at most ``max_frame``
    bytes (a longer one drops the connection as soon as its length is read),
    and the socket is read only until one frame is complete: pysyncobj reads
    whatever arrives into one growing buffer, which a peer streaming zeros
    turned into hundreds of MiB and a busy tick thread.
    """

    max_frame = max_frame_bytes(2 * 1024 * 1024)
    accepted_at = 0.0

    def _TcpConnection__processRead(self):
        if not self._room_to_read():
            return False
        return TcpConnection._TcpConnection__processRead(self)

    def _room_to_read(self) -> bool:
        """False once the buffer holds a whole frame (parse it first) or declares too big a one."""
        buffer = self._TcpConnection__readBuffer
        if len(buffer) < FRAME.size:
            return True
        declared = FRAME.unpack_from(buffer)[0]
        if declared > self.max_frame:
            logger.warning("a Raft connection declared a %d-byte frame (limit %d); closed", declared, self.max_frame)
            self.disconnect()
            return False
        return len(buffer) < FRAME.size + declared

    def send(self, message):
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = _pickle.dumps(message)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(monotonic()))
        self._TcpConnection__writeBuffer += FRAME.pack(len(data)) + data
        self._TcpConnection__trySendBuffer()

    def _TcpConnection__processParseMessage(self):
        buffer = self._TcpConnection__readBuffer
        if len(buffer) < FRAME.size:
            return None
        declared = FRAME.unpack_from(buffer)[0]
        if declared > self.max_frame:
            self.disconnect()
            return None
        end = FRAME.size + declared
        if len(buffer) < end:
            return None
        try:
            message = self._open(buffer[FRAME.size:end])
        except Exception:
            # forged, replayed or garbled: drop the peer, as pysyncobj does
            self.disconnect()
            return None
        self._TcpConnection__readBuffer = buffer[end:]
        return message

    def _open(self, data: bytes):
        if self.encryptor:
            stamp = self.encryptor.extract_timestamp(data)
            if stamp < self.recvLastTimestamp:
                raise ValueError("the sender's timestamps went backwards")
            data = self.encryptor.decrypt(data)
            self.recvLastTimestamp = stamp
        message = _pickle.loads(data)
        if self.recvRandKey:
            key, message = message
            if key != self.recvRandKey:
                raise ValueError("a message sealed for another connection")
        return message


class _DialingTransport(TCPTransport):
    """TCPTransport that connects to a peer's dial address when one is set,
    over raftq's connections (``_Connection``).

    Identity (what is announced and what the acceptor looks up) stays the
    peer's Raft address; only the TCP destination changes.
    """

    def __init__(self, syncObj, selfNode, otherNodes, *, dial_addrs: dict[str, str], max_frame: int):
        self._dial_addrs = dial_addrs
        self._max_frame = max_frame
        super().__init__(syncObj, selfNode, otherNodes)

    # pysyncobj builds its TcpConnection objects inline, here and in its TCP
    # server; each becomes a _Connection (same state, raftq's framing) before
    # it sends or reads a byte.
    def addNode(self, node):
        super().addNode(node)
        if node in self._connections:
            self._adopt(self._connections[node])

    def _adopt(self, conn) -> None:
        conn.__class__ = _Connection
        conn.max_frame = self._max_frame
        conn.accepted_at = monotonic()

    def _onNewIncomingConnection(self, conn):
        self._adopt(conn)
        address = _remote_address(conn)
        pending = [c for c in self._unknownConnections if c.state != CONNECTION_STATE.DISCONNECTED]
        if len(pending) >= PENDING_LIMIT or \
                sum(1 for c in pending if _remote_address(c) == address) >= PENDING_PER_ADDRESS:
            logger.warning("too many Raft connections from %s that named no peer yet; closed", address)
            conn.disconnect()
            return
        super()._onNewIncomingConnection(conn)

    def _onIncomingMessageReceived(self, conn, message):
        # After the key exchange the first message names the sender. Only a
        # configured peer may connect: pysyncobj would also take 'readonly'
        # (a node that receives every entry) and utility commands (lists).
        if conn.sendRandKey or not self._syncObj.encryptor:
            if not isinstance(message, str) or message not in self._nodeAddrToNode:
                logger.warning("a Raft connection from %s did not name a configured peer; closed",
                               _remote_address(conn))
                conn.disconnect()
                self._unknownConnections.discard(conn)
                return
        super()._onIncomingMessageReceived(conn, message)

    def _onTick(self):
        super()._onTick()
        if self._unknownConnections:
            expired = monotonic() - HANDSHAKE_DEADLINE_S
            for conn in [c for c in self._unknownConnections if c.accepted_at < expired]:
                logger.warning("a Raft connection from %s named no peer within %.0f s; closed",
                               _remote_address(conn), HANDSHAKE_DEADLINE_S)
                conn.disconnect()
                self._unknownConnections.discard(conn)

    def _connectIfNecessarySingle(self, node):
        # pysyncobj 0.3.17's method, with the destination looked up in _dial_addrs
        if node in self._connections and self._connections[node].state != CONNECTION_STATE.DISCONNECTED:
            return True
        if not self._shouldConnect(node):
            return False
        if node in self._lastConnectAttempt and \
                monotonic() - self._lastConnectAttempt[node] < self._syncObj.conf.connectionRetryTime:
            return False
        self._lastConnectAttempt[node] = monotonic()
        dial = self._dial_addrs.get(node.address)
        if dial is None:
            return self._connections[node].connect(node.ip, node.port)
        host, port = dial.rsplit(":", 1)
        return self._connections[node].connect(globalDnsResolver().resolve(host), int(port))


def _remote_address(conn) -> str:
    try:
        return conn._TcpConnection__socket.getpeername()[0]
    except (OSError, AttributeError):
        return "?"


class _RaftNode(SyncObj):
    """SyncObj with raftq's follower fix, grouped fsyncs and one replicated method.

    Name-mangled ``_SyncObj__*`` attributes are pysyncobj 0.3.17 internals
    (see the pin above).
    """

    def __init__(self, owner: "Consensus", self_node, other_nodes, conf, journal: DurableJournal, dial_addrs,
                 *, sealer: Sealer | None, max_frame: int):
        self._owner = owner
        self._sealer = sealer
        self._journal = journal
        self._replies: list[tuple[object, dict]] = []
        journal.before_rewrite = self._flush_replies
        super().__init__(self_node, other_nodes, conf,
                         transportClass=functools.partial(_DialingTransport, dial_addrs=dial_addrs,
                                                         max_frame=max_frame))
        # pysyncobj stops ticking when the thread that built it exits; tie
        # the tick thread to the process instead (close() stops it).
        self._SyncObj__mainThread = threading.main_thread()
        self._SyncObj__commandsQueue = _TermCheckedQueue(self, conf.commandsQueueSize)
        self.apply_func_id = self._methodToID[self._getFuncName("_raftq_apply")]

    @replicated
    def _raftq_apply(self, entry):
        return self._owner._apply_entry(entry)

    @property
    def encryptor(self):
        # pysyncobj's transport encrypts with whatever this returns (Fernet
        # when conf.password is set); raftq's Sealer is AES-GCM (see sealer.py).
        return self._sealer

    def leads(self, term: int) -> bool:
        return self._SyncObj__raftState == _LEADER and self._SyncObj__raftCurrentTerm == term

    # -- snapshots ---------------------------------------------------------

    def _SyncObj__tryLogCompaction(self):
        # A snapshot is taken on the tick thread and stalls this node for as
        # long as the state machine takes to serialize (about a second per
        # million stored messages). On a follower that only delays its
        # acknowledgements; on the leader it stops heartbeats and triggers an
        # election. So the leader leaves compaction to the followers until
        # its log is LEADER_COMPACTION_FACTOR times the threshold (or one is
        # forced); a new leader soon compacts what it owes as a follower did.
        # A finished snapshot (serializer pid -1/-2, pysyncobj 0.3.17) must
        # still get through, so that its log prefix is deleted.
        finished = self._SyncObj__serializer._Serializer__pid != 0
        if (self._SyncObj__raftState == _LEADER and not finished and not self._SyncObj__forceLogCompaction
                and len(self._journal) <= LEADER_COMPACTION_FACTOR * self._SyncObj__conf.logCompactionMinEntries):
            return
        SyncObj._SyncObj__tryLogCompaction(self)

    # -- commit notification ---------------------------------------------

    def _SyncObj__applyLogEntries(self):
        # pysyncobj answers "send AppendEntries now" after every apply, only to
        # tell the followers the new commit index: two more messages and two
        # more acknowledgements per lone write, on the leader's CPU while it
        # answers the client. Followers learn the commit index with the next
        # append or heartbeat instead (appendEntriesPeriod), as in most Raft
        # implementations; nothing waits on a follower's apply.
        SyncObj._SyncObj__applyLogEntries(self)
        return False

    # -- grouped fsyncs --------------------------------------------------

    def _onTick(self, timeToWait=0.0):
        with self._journal.deferred():
            super()._onTick(timeToWait)
        self._send_replies()

    def _checkCommandsToApply(self):
        # The leader's appends were sent to followers as they were made;
        # sync them before this tick polls for acknowledgements, so the
        # leader's own copy is durable before the next tick counts it.
        super()._checkCommandsToApply()
        self._journal.sync()

    def _flush_replies(self) -> None:
        self._journal.sync()
        self._send_replies()

    def _send_replies(self) -> None:
        replies, self._replies = self._replies, []
        transport = self._SyncObj__transport
        for node, message in replies:
            transport.send(node, message)

    def _reply(self, node, next_idx: int, success: bool, reset: bool) -> None:
        self._replies.append((node, {"type": "next_node_idx", "next_node_idx": next_idx,
                                     "reset": reset, "success": success}))

    # -- messages ----------------------------------------------------------

    def _SyncObj__onMessageReceived(self, node, message):
        try:
            self._owner._heard_from(node.id)
            if message["type"] == "append_entries" and message["term"] >= self._SyncObj__raftCurrentTerm:
                self._on_append_entries(node, message)
            else:
                SyncObj._SyncObj__onMessageReceived(self, node, message)
        except Exception:
            kind = message.get("type") if isinstance(message, dict) else type(message).__name__
            logger.critical("failed to handle a %r message from %s", kind, node, exc_info=True)

    def _on_append_entries(self, node, message):
        # pysyncobj 0.3.17's prologue: follow this leader and its term
        term = message["term"]
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__transferInProgress = False
        if not self._SyncObj__transferInProgress:
            self._SyncObj__raftElectionDeadline = monotonic() + self._SyncObj__generateRaftTimeout()
        if self._SyncObj__raftLeader != node:
            self._SyncObj__onLeaderChanged()
        self._SyncObj__raftLeader = node
        if term > self._SyncObj__raftCurrentTerm:
            self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(_FOLLOWER)
        leader_commit = self._SyncObj__leaderCommitIndex = message["commit_index"]
        self._owner._leader_contact = monotonic()

        verified = None  # last index known to equal the leader's log
        if "transmission" in message:
            # raftq leaders never send it: entries stay below the batch size
            logger.critical("ignoring a chunked append_entries from %s (entry above the batch size)", node)
        elif "prevLogIdx" in message:
            verified = self._match_entries(node, message["prevLogIdx"], message["prevLogTerm"],
                                           message.get("entries", []))
        elif message.get("serialized") is not None:
            if self._SyncObj__serializer.setTransmissionData(message["serialized"]):
                self._owner._loaded_snapshot = None
                self._SyncObj__loadDumpFile(clearJournal=True)
                loaded = self._owner._loaded_snapshot
                # pysyncobj logs and swallows a failed load; acknowledging
                # then would vouch for the old log. Without a reply the
                # leader finds the gap and sends the snapshot again.
                if loaded is not None and self._journal[-1] == loaded:
                    verified = loaded[1]
                    self._reply(node, verified + 1, success=True, reset=False)

        if verified is not None and leader_commit > self._SyncObj__raftCommitIndex:
            commit = min(leader_commit, verified)
            if commit > self._SyncObj__raftCommitIndex:
                self._SyncObj__raftCommitIndex = commit
                self._journal.setRaftCommitIndex(commit)

    def _match_entries(self, node, prev_idx: int, prev_term: int, entries: list) -> int | None:
        log = self._journal
        first, last = log[0][1], log[-1][1]
        if not first <= prev_idx <= last:
            self._reply(node, last + 1, success=False, reset=True)
            return None
        base = prev_idx - first
        if log[base][2] != prev_term:
            self._reply(node, prev_idx, success=False, reset=True)
            return None
        have = len(log) - base - 1
        same = 0
        while same < len(entries) and same < have and log[base + 1 + same][2] == entries[same][2]:
            same += 1
        if same < len(entries) and same < have:
            self._truncate_conflict(base + 1 + same)
        for entry in entries[same:]:
            log.add(*entry)
        if self._SyncObj__conf.dynamicMembershipChange:
            for entry in entries[same:]:
                change = self._SyncObj__parseChangeClusterRequest(entry[0])
                if change is not None:
                    self._SyncObj__doChangeCluster(change)
        matched = prev_idx + len(entries)
        self._reply(node, matched + 1, success=True, reset=False)
        return matched

    def _truncate_conflict(self, position: int) -> None:
        log = self._journal
        if self._SyncObj__conf.dynamicMembershipChange:
            for entry in reversed(log[position:]):
                change = self._SyncObj__parseChangeClusterRequest(entry[0])
                if change is not None:
                    self._SyncObj__doChangeCluster(change, reverse=True)
        first_dropped = log[position][1]
        if first_dropped <= self._SyncObj__raftLastApplied:
            logger.critical("conflict truncates applied entries from index %d (last applied %d)",
                            first_dropped, self._SyncObj__raftLastApplied)
        log.deleteEntriesFrom(position)


class Consensus:
    """A Raft node for raftq; see the module docstring for the contract."""

    def __init__(self, *, self_peer: Peer, peers: list[Peer], data_dir: str | Path,
                 apply: Callable[[bytes], object], snapshot: Callable[[], bytes],
                 restore: Callable[[bytes], None], secret: str | None, fsync: bool = True,
                 on_role_change: Callable[[], None] | None = None,
                 election_timeout: tuple[float, float] = (0.15, 0.35),
                 heartbeat: float = 0.03,
                 connection_retry: float = 0.2,
                 submit_timeout: float = 10.0,
                 max_entry_bytes: int = 2 * 1024 * 1024,
                 compaction_min_entries: int = 10_000,
                 compaction_min_seconds: float = 600.0,
                 segment_bytes: int = 64 * 1024 * 1024,
                 bind_addr: str | None = None):
        if secret is None:
            logger.warning("NO CLUSTER SECRET: Raft traffic on %s is unauthenticated and unpickled -- anyone who "
                           "can reach this port can run code on this node. Set a secret and firewall the port.",
                           self_peer.raft_addr)
        self.self_peer = self_peer
        self._apply = apply
        self._snapshot = snapshot
        self._restore = restore
        self._on_role_change = on_role_change
        self._submit_timeout = submit_timeout
        self._max_entry_bytes = max_entry_bytes
        self._election_timeout = election_timeout[1]
        # How recently a leader must have heard from a majority to act as
        # leader (writes, leader reads, readiness). A follower cut off from us
        # may start an election raftMinTimeout after our last heartbeat, and
        # the others vote at once (no PreVote), so from then on a new leader
        # may exist: an isolated leader stops answering before that.
        self._leader_lease = election_timeout[0]
        self._fsync_policy = "fsync-per-append" if fsync else "no-fsync"

        self._ids = {p.raft_addr: p.id for p in [self_peer, *peers]}
        self._dial_addrs = {p.raft_addr: p.dial_addr for p in peers if p.dial_addr}
        self._last_heard: dict[str, float] = {}
        self._leader_contact = 0.0
        self._tickets: collections.deque[_Ticket] = collections.deque()
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()
        self._closed = False
        self._retired = False
        self._close_lock = threading.Lock()
        self._last_role: tuple | None = None
        self._last_quorum = False
        self._snapshot_info = {"index": None, "bytes": None, "seconds": None, "count": 0}
        self._loaded_snapshot: tuple | None = None

        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self._snapshot_path = data_dir / SNAPSHOT_FILE
        self._journal = DurableJournal(data_dir / JOURNAL_DIR, fsync=fsync,
                                       segment_bytes=segment_bytes, snapshot_path=self._snapshot_path)
        # Replicas apply the same entries, so equal thresholds would make them
        # all stall for a snapshot at the same moment; spread them per node.
        jitter = 1 + (zlib.crc32(self_peer.raft_addr.encode()) % 1000) / 2000
        conf = SyncObjConf(
            password=None,   # encryption is the Sealer's (given to _RaftNode), not Fernet
            autoTick=True,
            # the tick thread's poll timeout: heartbeats are only sent from a
            # tick, so an idle node must wake well within the heartbeat period
            autoTickPeriod=heartbeat / 3,
            raftMinTimeout=election_timeout[0],
            raftMaxTimeout=election_timeout[1],
            appendEntriesPeriod=heartbeat,
            # Idle peer links must not be dropped on the first vote request
            # (that forces a second election round); dead links are found by
            # the election timeout and TCP keepalive instead.
            connectionTimeout=max(30.0, election_timeout[1]),
            connectionRetryTime=connection_retry,
            leaderFallbackTimeout=election_timeout[1],
            # Measured: batch mode waits for the next heartbeat (~heartbeat
            # per lone write); per-command sending commits in about an RTT.
            appendEntriesUseBatch=False,
            appendEntriesBatchSizeBytes=max_entry_bytes + 64 * 1024,
            sendBufferSize=2 ** 20,
            recvBufferSize=2 ** 20,
            bindAddress=bind_addr or self_peer.raft_addr,
            dynamicMembershipChange=True,
            commandsWaitLeader=False,
            journalFile=self._journal,
            fullDumpFile=str(self._snapshot_path),
            serializer=self._write_snapshot,
            deserializer=self._read_snapshot,
            useFork=False,
            logCompactionMinEntries=int(compaction_min_entries * jitter),
            logCompactionMinTime=compaction_min_seconds * jitter,
            logCompactionBatchSize=2 ** 20,
        )
        try:
            self._node = _RaftNode(self, self._make_node(self_peer.raft_addr),
                                   [self._make_node(p.raft_addr) for p in peers],
                                   conf, self._journal, self._dial_addrs,
                                   sealer=Sealer(secret) if secret is not None else None,
                                   max_frame=max_frame_bytes(max_entry_bytes))
        except BaseException:
            self._journal._destroy()
            raise
        self._node.addOnTickCallback(self._on_tick)

    # -- public interface --------------------------------------------------

    def submit(self, entry: bytes, callback: Callable[[object | None, str | None], None], *, term: int) -> None:
        """Propose ``entry``, prepared for ``term``: it enters the log only while this node leads that term."""
        ticket = self._ticket(callback, term)
        if ticket is None:
            return
        if len(entry) > self._max_entry_bytes:
            self._later(ticket, "too_large")
            return
        refusal = self._refusal()
        if refusal:
            self._later(ticket, refusal)
            return
        command = pickle.dumps((self._node.apply_func_id, (entry,)), protocol=5)
        self._node._applyCommand(command, ticket.on_pysyncobj_result, _REGULAR)

    def status(self) -> dict:
        node = self._node
        now = monotonic()
        state = node._SyncObj__raftState
        leader = node._SyncObj__raftLeader
        is_leader = state == _LEADER
        match = dict(node._SyncObj__raftMatchIndex) if is_leader else {}
        nxt = dict(node._SyncObj__raftNextIndex) if is_leader else {}
        heard = dict(self._last_heard)
        peers = {}
        for other in list(node._SyncObj__otherNodes):
            addr = other.id
            contact = heard.get(addr)
            peers[self._id_of(other)] = {
                "raft_addr": addr,
                "match_index": match.get(other, 0),
                "next_index": nxt.get(other, 0),
                "connected": node.isNodeConnected(other),
                "last_contact_ms": None if contact is None else round((now - contact) * 1000, 1),
            }
        journal = self._journal.stats()
        return {
            "self_id": self.self_peer.id,
            "role": _ROLE_NAMES[state],
            "leader_id": None if leader is None else self._id_of(leader),
            "term": node.raftCurrentTerm,
            "commit_index": node.raftCommitIndex,
            "applied_index": node.raftLastApplied,
            "last_log_index": self._journal[-1][1],
            "quorum_ok": self._quorum_ok(now),
            "peers": peers,
            "fsync_policy": self._fsync_policy,
            "log_entries": journal["entries"],
            "log_size": journal["bytes"],
            "log_segments": journal["segments"],
            "journal_syncs": journal["data_syncs"],
            "snapshot": dict(self._snapshot_info),
        }

    def applied_index(self) -> int:
        return self._node.raftLastApplied

    def applying_index(self) -> int:
        """Inside ``apply``: the log index of the entry being applied (pysyncobj
        counts an entry applied only once apply has returned)."""
        return self._node._SyncObj__raftLastApplied + 1

    def route(self) -> tuple[str, str | None, int, bool]:
        """Role, leader id, term and whether a majority is heard: what routing a
        request needs, without the rest of status()."""
        node = self._node
        leader = node._SyncObj__raftLeader
        return (_ROLE_NAMES[node._SyncObj__raftState], None if leader is None else self._id_of(leader),
                node.raftCurrentTerm, self._quorum_ok(monotonic()))

    def term(self) -> int:
        """The current term, cheaply (status() builds the whole picture)."""
        return self._node.raftCurrentTerm

    def leader_id(self) -> str | None:
        leader = self._node._SyncObj__raftLeader
        return None if leader is None else self._id_of(leader)

    def add_node(self, peer: Peer, callback) -> None:
        ticket = self._ticket(callback, self.term())
        if ticket is None:
            return
        refusal = self._refusal()
        if refusal:
            self._later(ticket, refusal)
            return
        self._ids[peer.raft_addr] = peer.id
        if peer.dial_addr:
            self._dial_addrs[peer.raft_addr] = peer.dial_addr
        self._node.addNodeToCluster(self._make_node(peer.raft_addr), callback=ticket.on_pysyncobj_result)

    def remove_node(self, node_id: str, callback) -> None:
        ticket = self._ticket(callback, self.term())
        if ticket is None:
            return
        refusal = self._refusal()
        addr = next((a for a, i in self._ids.items() if i == node_id), None)
        if refusal or addr is None or node_id == self.self_peer.id:
            self._later(ticket, refusal or "denied")
            return
        self._node.removeNodeFromCluster(self._make_node(addr), callback=ticket.on_pysyncobj_result)

    def transfer_leadership(self, timeout: float, to: str | None = None) -> bool:
        """Hand leadership to a caught-up follower (``to``, or the most caught-up
        one); True once another node leads.

        Retries until ``timeout`` (a follower may need to catch up first); if
        no other node took over by then, this node steps down and holds back
        from campaigning for a while, and the result is False.
        """
        addr = next((a for a, i in self._ids.items() if i == to), None) if to else None
        target = self._make_node(addr) if addr else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            leader = self.leader_id()
            if leader is not None and leader != self.self_peer.id:
                return True
            if self._node._isLeader():
                self._run_on_tick(lambda: self._node.transferLeadership(target))
            time.sleep(0.02)
        if self._node._isLeader():
            self._run_on_tick(self._step_down)
        return False

    def retire(self) -> None:
        """Never stand for election again (a node shutting down): without
        this, a node that just handed leadership over can win the next
        election during its own shutdown and stall writes once more."""
        self._retired = True
        self._run_on_tick(self._hold_back)

    def _hold_back(self) -> None:
        node = self._node
        node._SyncObj__raftElectionDeadline = monotonic() + 10 * self._election_timeout
        if node._SyncObj__raftState == _LEADER:
            self._step_down()

    def force_snapshot(self, timeout: float = 60.0) -> bool:
        """Compact the log now; True if a new snapshot was written."""
        done = threading.Event()
        outcome = []
        before = self._snapshot_info["count"]

        def arm():
            self._node.forceLogCompaction()
            self._tasks.append(check)

        def check():
            # pysyncobj clears the flag in the tick that attempts compaction,
            # and serialization runs synchronously within that tick.
            if self._node._SyncObj__forceLogCompaction:
                self._tasks.append(check)
                return
            outcome.append(self._snapshot_info["count"] > before)
            done.set()

        self._run_on_tick(arm)
        return done.wait(timeout) and outcome[0]

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._node.destroy()
        self._wake()
        self._node._SyncObj__thread.join()
        notifier = self._node._SyncObj__pipeNotifier
        os.close(notifier._PipeNotifier__pipeR)
        os.close(notifier._PipeNotifier__pipeW)
        while self._tasks:
            self._tasks.popleft()()
        while self._tickets:
            self._tickets.popleft().resolve(None, "unknown_outcome")

    # -- tick thread -------------------------------------------------------

    def _on_tick(self) -> None:
        if self._retired:
            self._hold_back()
        for _ in range(len(self._tasks)):
            task = self._tasks.popleft()
            try:
                task()
            except Exception:
                logger.exception("consensus task failed")
        now = time.monotonic()
        tickets = self._tickets
        while tickets and (tickets[0].done or tickets[0].deadline <= now):
            tickets.popleft().resolve(None, "timeout")
        node = self._node
        role = (node._SyncObj__raftState, node._SyncObj__raftLeader, node.raftCurrentTerm)
        # The fronts route on whether a majority is heard, too: a change of it
        # is reported like a change of role, from here rather than by polling.
        quorum = self._quorum_ok(monotonic())
        if role != self._last_role or quorum != self._last_quorum:
            if role != self._last_role and self._last_role is not None and self._last_role[0] == _LEADER:
                # Deposed (or re-elected in a new term): pysyncobj answers the
                # old term's commands only once an entry at their index is
                # applied, which may take until submit_timeout while callers
                # (group commit's in-flight window) wait. Their outcome is
                # unknown now; say so at once.
                while tickets:
                    tickets.popleft().resolve(None, "leader_changed")
            self._last_role = role
            self._last_quorum = quorum
            if self._on_role_change is not None:
                try:
                    self._on_role_change()
                except Exception:
                    logger.exception("on_role_change raised")

    def _apply_entry(self, entry: bytes):
        try:
            return self._apply(entry)
        except Exception as exc:
            logger.critical("state machine apply raised; recorded as an internal error result", exc_info=True)
            return {"error": "internal", "detail": f"{type(exc).__name__}: {exc}"}

    def _step_down(self) -> None:
        node = self._node
        if node._SyncObj__raftState != _LEADER:
            return
        node._SyncObj__setState(_FOLLOWER)
        node._SyncObj__raftLeader = None
        # without a hold-off this node would win the next election itself
        node._SyncObj__raftElectionDeadline = monotonic() + 10 * self._election_timeout

    def _heard_from(self, addr: str) -> None:
        self._last_heard[addr] = monotonic()

    # -- snapshots (tick thread) -------------------------------------------

    def _write_snapshot(self, filename: str, data) -> None:
        last, prev, cluster = data
        started = time.monotonic()
        state = self._snapshot()
        header = cbor2.dumps({
            "last": list(last), "prev": list(prev),
            "cluster": sorted([n.id, self._id_of(n)] for n in cluster),
        })
        body = SNAPSHOT_MAGIC + struct.pack("<I", len(header)) + header + state
        with open(filename, "wb") as f:
            f.write(body)
            f.write(struct.pack("<I", zlib.crc32(body)))
            f.flush()
            os.fsync(f.fileno())
        self._snapshot_info = {"index": last[1], "bytes": len(body) + 4,
                               "seconds": round(time.monotonic() - started, 4),
                               "count": self._snapshot_info["count"] + 1}

    def _read_snapshot(self, filename: str):
        with open(filename, "rb") as f:
            raw = f.read()
        body, crc = raw[:-4], raw[-4:]
        if not body.startswith(SNAPSHOT_MAGIC) or struct.pack("<I", zlib.crc32(body)) != crc:
            logger.critical("snapshot %s is damaged; not loaded", filename)
            raise ValueError(f"damaged snapshot {filename}")
        (header_len,) = struct.unpack_from("<I", body, len(SNAPSHOT_MAGIC))
        start = len(SNAPSHOT_MAGIC) + 4
        header = cbor2.loads(body[start:start + header_len])
        try:
            self._restore(body[start + header_len:])
        except Exception:
            logger.critical("state machine restore raised; this node's state is unusable", exc_info=True)
            raise
        nodes = []
        for addr, node_id in header["cluster"]:
            self._ids.setdefault(addr, node_id)
            nodes.append(self._make_node(addr))
        last = tuple(header["last"])
        self._snapshot_info = dict(self._snapshot_info, index=last[1], bytes=len(raw))
        self._loaded_snapshot = last
        return last, tuple(header["prev"]), nodes

    # -- helpers -----------------------------------------------------------

    def _make_node(self, addr: str) -> TCPNode:
        return TCPNode(addr, raftq_id=self._ids.get(addr, addr))

    def _id_of(self, node) -> str:
        return self._ids.get(node.id) or getattr(node, "raftq_id", None) or node.id

    def _quorum_ok(self, now: float) -> bool:
        node = self._node
        state = node._SyncObj__raftState
        if state == _LEADER:
            others = list(node._SyncObj__otherNodes)
            recent = sum(1 for n in others if now - self._last_heard.get(n.id, 0.0) < self._leader_lease)
            return recent + 1 > (len(others) + 1) / 2
        if state == _FOLLOWER and node._SyncObj__raftLeader is not None:
            return now - self._leader_contact < self._election_timeout
        return False

    def _refusal(self) -> str | None:
        if not self._node._isLeader():
            return "not_leader"
        if not self._quorum_ok(monotonic()):
            return "no_quorum"
        return None

    def _ticket(self, callback, term: int) -> _Ticket | None:
        ticket = _Ticket(callback, time.monotonic() + self._submit_timeout, term)
        with self._close_lock:
            if not self._closed:
                self._tickets.append(ticket)
                return ticket
        ticket.resolve(None, "not_leader")
        return None

    def _later(self, ticket: _Ticket, error: str) -> None:
        self._run_on_tick(lambda: ticket.resolve(None, error))

    def _run_on_tick(self, task: Callable[[], None]) -> None:
        self._tasks.append(task)
        self._wake()

    def _wake(self) -> None:
        self._node._SyncObj__pipeNotifier.notify()
