"""The Raft wire: how raftq nodes frame, seal and accept pysyncobj's messages.

pysyncobj's TCP transport carries the Raft messages; raftq changes what
travels and who may connect (the classes below say how and why):

- Framing: ``<u32 length><sealed pickle>`` without pysyncobj's zlib
  (``Connection``), read one frame at a time.
- Sealing: messages are sealed with AES-256-GCM (``engine.raft.sealer``, handed to
  pysyncobj as its ``encryptor``) instead of pysyncobj's Fernet, at a
  fraction of its cost per message; replayed or forged frames drop the
  connection.
- The Raft port faces whoever can reach it (docs/security.md): a frame longer
  than ``max_frame_bytes`` closes its connection as soon as its length is
  read; an incoming connection must name a configured peer within
  ``HANDSHAKE_DEADLINE_S`` (pysyncobj's read-only peers and utility commands
  are refused), and an address may hold only ``PENDING_PER_ADDRESS`` such
  connections at a time. Node-to-node messages are unpickled: without the
  cluster secret anyone reaching the port can run code. What such a
  connection makes the node log is rate-limited (``StrangerWarnings``): a
  flood of them writes a few lines, not one each; and a burst of them waits
  in a long backlog and is accepted in batches (``Server``), so a peer's
  reconnect is not dropped behind it.
- Protocol versions: once a connection has named its peer, each side sends
  ``{"type": "raftq_wire", "versions": [...]}`` (``announce``), the wire
  versions it speaks. Appends and their answers go to a peer in the binary
  form of ``engine.raft.binary_wire`` only once it announced version 2 on
  that connection, as pickles otherwise; a binary frame from a peer that did
  not announce it, or a malformed one, closes the connection like any bad
  frame. A release before this one never announces (it ignores the
  announcement, an unknown message type to pysyncobj), so a cluster mid
  rolling upgrade keeps replicating in pickles between old and new nodes.
  Each connection is announced afresh: a reconnect forgets what its peer
  spoke, which may have been another release. Version 3 (``QUIET_WIRE``)
  says the node honours a quiet heartbeat's promise (``quiet_s``, item 18 of
  ``engine.raft.node``): a leader goes quiet only while every voter said so.
- Groups: a node's Raft groups share its one Raft port. Group 0's
  connections are exactly the wire above, so nodes of a release without
  groups and of this one still talk; a connection to another group starts
  with a preamble, ``b"RAFTQ-GROUP <g>\\n"`` (``group_preamble``), before
  the first frame. Its first four bytes read as a frame length far beyond
  any frame's, so no group 0 connection can start with them. The node's
  supervisor accepts every connection, reads the preamble
  (``read_preamble``: bounded, and timed out with the handshake deadline) and
  hands the socket to that group's engine over a Unix socket; the engine
  takes it as if its own server had accepted it (``HandedOverServer``).
- Proxy dialing: a node's identity is its ``raft_addr``; ``Peer.dial_addr``
  only changes where this node connects to (``DialingTransport``). It lives
  in the transport rather than in a Node subclass because Node objects are
  pickled into the replicated log on membership changes, where one node's
  dial address would leak to the others.
"""

from __future__ import annotations

import errno
import logging
import socket
import struct

from . import binary_wire
from .internals import ConnectionInternals, ServerInternals, monotonic
from . import pysyncobj_pin  # noqa: F401  -- the release these overrides were written for
from pysyncobj import pickle as _pickle
from pysyncobj.dns_resolver import globalDnsResolver
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.transport import TCPTransport

logger = logging.getLogger(__name__)

FRAME = struct.Struct("<I")   # a Raft message on the wire: <length><sealed pickle>
# Until a connection has named a configured peer (sealed with the cluster
# secret), it may take this long, and one address may hold this many such
# connections at once (all addresses together: PENDING_LIMIT); anything
# beyond is closed at once, so garbage or stalled sockets cost nothing.
HANDSHAKE_DEADLINE_S = 2.0
PENDING_PER_ADDRESS = 4
PENDING_LIMIT = 64
# The most one read takes from a peer socket (pysyncobj read up to this much too).
READ_CHUNK = 1 << 20
# pysyncobj's server listened with a backlog of 5 and accepted one connection
# per tick: a burst of strangers filled the backlog, and a peer's reconnect
# then waited for its SYN to be sent again (a second or more). Now a burst
# waits in a longer backlog, and a tick takes up to ACCEPTS_PER_TICK of it.
LISTEN_BACKLOG = 128
ACCEPTS_PER_TICK = 64
# A connection to group g > 0 starts with PREAMBLE_PREFIX, the group's
# number in decimal and a newline; the whole preamble is at most
# PREAMBLE_MAX_BYTES. "RAFT" as a frame length is 1.4 GB: never a frame.
PREAMBLE_PREFIX = b"RAFTQ-GROUP "
PREAMBLE_MAX_BYTES = 24
# How many handed-over sockets one read of the supervisor's Unix socket may carry.
HANDOFF_BATCH = 64
# What a node says it speaks once a connection has named its peer (see "Protocol versions").
ANNOUNCE = "raftq_wire"
PICKLED_WIRE = 1
QUIET_WIRE = 3
WIRE_VERSIONS = (PICKLED_WIRE, binary_wire.BINARY_WIRE, QUIET_WIRE)
# A warning a stranger on the Raft port can cause is logged at most once per
# this interval per kind; the next line says how many were left out.
STRANGER_WARNING_INTERVAL_S = 5.0


class StrangerWarnings:
    """Warnings about connections that are not (yet) peers, rate-limited: a
    kind's first one is logged at once, later ones in the same interval are
    counted, and ``flush`` (each tick) logs the last of them with the count.
    Log volume is the attacker's to choose otherwise: 3 000 hostile
    connections wrote a line each. Tick thread only."""

    def __init__(self, interval: float = STRANGER_WARNING_INTERVAL_S):
        self.interval = interval
        # message format -> [start of its interval, left out since, the last one's args]
        self._kinds: dict[str, list] = {}

    def warn(self, message: str, *args) -> None:
        now = monotonic()
        kind = self._kinds.get(message)
        if kind is None or (not kind[1] and now - kind[0] >= self.interval):
            self._kinds[message] = [now, 0, args]
            logger.warning(message, *args)
            return
        kind[1] += 1
        kind[2] = args

    def flush(self) -> None:
        now = monotonic()
        for message, kind in self._kinds.items():
            if kind[1] and now - kind[0] >= self.interval:
                logger.warning(message + " (and %d more like it in %.0f s)", *kind[2], kind[1], now - kind[0])
                kind[0], kind[1] = now, 0


# One per process: the log it guards is the process's.
stranger_warnings = StrangerWarnings()


def group_preamble(group: int) -> bytes:
    """What a connection to `group` sends first: nothing for group 0 (the wire of old)."""
    return b"" if group == 0 else PREAMBLE_PREFIX + str(group).encode() + b"\n"


class BadPreamble(ValueError):
    pass


def read_preamble(head: bytes) -> tuple[int, int] | None:
    """The group a connection names and the preamble's length in bytes, from
    the first bytes it sent (`head`, at least one): (0, 0) when it starts
    with no preamble (group 0); None while `head` is too short to tell.
    BadPreamble when it starts like a preamble but is not a well-formed one
    within PREAMBLE_MAX_BYTES."""
    prefix = head[:len(PREAMBLE_PREFIX)]
    if not PREAMBLE_PREFIX.startswith(prefix):
        return 0, 0
    end = head.find(b"\n", 0, PREAMBLE_MAX_BYTES)
    if end < 0:
        if len(head) >= PREAMBLE_MAX_BYTES:
            raise BadPreamble("no newline within the preamble's bound")
        return None
    number = head[len(PREAMBLE_PREFIX):end]
    if not number.isdigit() or number.startswith(b"0"):
        raise BadPreamble("not RAFTQ-GROUP <g> with g > 0")
    return int(number), end + 1


def max_frame_bytes(max_entry_bytes: int) -> int:
    """The largest Raft message a peer can legitimately send.

    pysyncobj packs entries up to the batch size (max entry + 64 KiB) and may
    overshoot by one entry; snapshots travel in 1 MiB chunks.  The rest is
    pickle and seal overhead.
    """
    return 2 * (max_entry_bytes + 64 * 1024) + (1 << 20)


class Connection(ConnectionInternals):
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
    turned into hundreds of MiB and a busy engine.

    Reads land in one preallocated buffer per node (``recv_into``; all of a
    node's connections are read in its ticks, and each read is copied
    out at once). pysyncobj's ``recv(recvBufferSize)`` makes CPython
    allocate a fresh 1 MiB object for every read -- an mmap, a page fault,
    a shrinking mremap and an munmap per heartbeat, which with the process's
    other threads is a TLB flush across CPUs -- plus a SO_ERROR query after
    it (a failed socket fails the next read anyway). An idle 3-node cluster used 0.16
    CPU-s per 10 s instead of 0.19 (ab run, both clusters up at once).

    A connection times out only when an append it sent, which a live
    follower always answers, has had no answer for the connection timeout.
    pysyncobj dropped any connection it had read nothing from for that
    long, and checked when it next sent or read: two followers exchange
    nothing between elections, so the first vote request after 30 quiet
    seconds closed their link instead of leaving. The followers that had
    lost their leader then split their votes and waited out the election
    timeout (failovers of 0.35-0.86 s instead of 0.03 s, found by
    bench/node_compare.py).
    """

    max_frame = max_frame_bytes(2 * 1024 * 1024)
    accepted_at = 0.0
    unanswered_since: float | None = None   # the first append sent since the last read
    peer_binary = False     # the peer announced binary_wire.BINARY_WIRE on this connection
    peer_quiet = False      # the peer announced QUIET_WIRE on this connection

    def __init__(self, *args, **kwargs):
        # Built directly (not adopted by a DialingTransport): a buffer and counts of its own.
        super().__init__(*args, **kwargs)
        self.read_chunk = memoryview(bytearray(READ_CHUNK))
        self.appends_sent = new_appends_sent()

    def process_read(self):
        if not self._room_to_read():
            return False
        chunk = self.read_chunk
        try:
            received = self.socket.recv_into(chunk)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not received:
            self.disconnect()
            return False
        self.read_buffer += chunk[:received]
        self.unanswered_since = None
        return True

    def check_timeout(self):
        if self.unanswered_since is not None and monotonic() - self.unanswered_since > self.timeout:
            self.disconnect()

    def disconnect(self):
        self.unanswered_since = None
        self.peer_binary = self.peer_quiet = False
        super().disconnect()

    def _room_to_read(self) -> bool:
        """False once the buffer holds a whole frame (parse it first) or declares too big a one."""
        buffer = self.read_buffer
        if len(buffer) < FRAME.size:
            return True
        declared = FRAME.unpack_from(buffer)[0]
        if declared > self.max_frame:
            stranger_warnings.warn("a Raft connection declared a %d-byte frame (limit %d); closed",
                                   declared, self.max_frame)
            self.disconnect()
            return False
        return len(buffer) < FRAME.size + declared

    def send(self, message):
        # pysyncobj's messages, and a snapshot's chunks (appends too): pickled
        if isinstance(message, dict) and message.get("type") == "append_entries":
            self._append_leaving("pickled")
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        self._send_payload(_pickle.dumps(message))

    def send_append(self, term: int, prev_index: int, prev_term: int, commit_index: int, entries: list,
                    sent_at: float, quiet_s: float | None = None) -> None:
        """An append, from its fields: binary to a peer that announced the binary wire."""
        if not self.peer_binary:
            message = {"type": "append_entries", "term": term, "commit_index": commit_index,
                       "prevLogIdx": prev_index, "prevLogTerm": prev_term, "entries": entries, "sent_at": sent_at}
            if quiet_s is not None:
                message["quiet_s"] = quiet_s
            self.send(message)
            return
        self._append_leaving("binary")
        self._send_payload(binary_wire.encode_append(self.sendRandKey, term, prev_index, prev_term, commit_index,
                                                     entries, sent_at, quiet_s))

    def send_answer(self, term: int, next_index: int, success: bool, reset: bool, sent_at: float | None) -> None:
        """An answer to an append, from its fields: binary to a peer that announced the binary wire."""
        if not self.peer_binary:
            message = {"type": "next_node_idx", "term": term, "next_node_idx": next_index, "reset": reset,
                       "success": success}
            if sent_at is not None:
                message["sent_at"] = sent_at
            self.send(message)
            return
        self._send_payload(binary_wire.encode_answer(self.sendRandKey, term, next_index, success, reset, sent_at))

    def _append_leaving(self, form: str) -> None:
        self.appends_sent[form] += 1
        if self.unanswered_since is None:
            self.unanswered_since = monotonic()

    def _send_payload(self, data: bytes) -> None:
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(monotonic()))
        self.write_buffer += FRAME.pack(len(data)) + data
        self.try_send_buffer()

    def parse_message(self):
        # A peer's announcement is taken here, never handed on: the next message is.
        while True:
            message = self._parse_one()
            if not (isinstance(message, dict) and message.get("type") == ANNOUNCE):
                return message
            versions = message.get("versions")
            versions = versions if isinstance(versions, (list, tuple)) else ()
            self.peer_binary = binary_wire.BINARY_WIRE in versions
            self.peer_quiet = QUIET_WIRE in versions

    def _parse_one(self):
        buffer = self.read_buffer
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
        self.read_buffer = buffer[end:]
        return message

    def _open(self, data: bytes):
        if self.encryptor:
            stamp = self.encryptor.extract_timestamp(data)
            if stamp < self.recvLastTimestamp:
                raise ValueError("the sender's timestamps went backwards")
            data = self.encryptor.decrypt(data)
            self.recvLastTimestamp = stamp
        if data[:1] and data[0] in binary_wire.KINDS:
            if not self.peer_binary:
                raise ValueError("a binary frame from a peer that did not announce the binary wire")
            key, message = binary_wire.decode(data)
            if key != (self.recvRandKey or None):
                raise ValueError("a binary frame sealed for another connection")
            return message
        message = _pickle.loads(data)
        if self.recvRandKey:
            key, message = message
            if key != self.recvRandKey:
                raise ValueError("a message sealed for another connection")
        return message


class Server(ServerInternals):
    """pysyncobj's TCP server, with a longer backlog and every waiting
    connection accepted at once (up to ACCEPTS_PER_TICK), not one per tick."""

    def bind(self):
        super().bind()
        self.socket.listen(LISTEN_BACKLOG)

    def on_new_connection(self, descr, event):
        if event & POLL_EVENT_TYPE.ERROR:
            self.unbind()
            return
        for _ in range(ACCEPTS_PER_TICK):
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in (errno.ECONNABORTED, errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.unbind()
                return
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_size)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.recv_buffer_size)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self.on_new_connection_callback(TcpConnection(
                poller=self.poller, socket=sock, timeout=self.connection_timeout,
                sendBufferSize=self.send_buffer_size, recvBufferSize=self.recv_buffer_size,
                keepalive=self.keepalive))


class HandedOverServer:
    """In place of pysyncobj's TcpServer when the node's supervisor owns the
    Raft port: connections the supervisor accepted for this group arrive as
    file descriptors over a Unix socket (SCM_RIGHTS), read on the tick
    thread's poller and taken on exactly as ``Server`` takes accepted ones."""

    def __init__(self, poller, handoff: socket.socket, on_new_connection, *, send_buffer: int, recv_buffer: int,
                 timeout: float):
        self._poller = poller
        self._handoff = handoff
        self._on_new_connection = on_new_connection
        self._send_buffer = send_buffer
        self._recv_buffer = recv_buffer
        self._timeout = timeout
        self._subscribed = False

    def bind(self):
        self._handoff.setblocking(False)
        self._poller.subscribe(self._handoff.fileno(), self._on_ready, POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.ERROR)
        self._subscribed = True

    def unbind(self):
        if self._subscribed:
            self._poller.unsubscribe(self._handoff.fileno())
            self._subscribed = False

    def _on_ready(self, descr, event):
        # One read may stop at each handed-over descriptor: take up to a batch per tick.
        for _ in range(HANDOFF_BATCH):
            try:
                data, fds, _, _ = socket.recv_fds(self._handoff, HANDOFF_BATCH, HANDOFF_BATCH)
            except (BlockingIOError, InterruptedError):
                return
            if not data and not fds:
                # the supervisor is gone; so is the node (it kills its engines as it dies)
                self.unbind()
                return
            self._take(fds)

    def _take(self, fds: list[int]) -> None:
        for fd in fds:
            sock = socket.socket(fileno=fd)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self._recv_buffer)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setblocking(False)
            self._on_new_connection(TcpConnection(poller=self._poller, socket=sock, timeout=self._timeout,
                                                  sendBufferSize=self._send_buffer,
                                                  recvBufferSize=self._recv_buffer))


class DialingTransport(TCPTransport):
    """TCPTransport that connects to a peer's dial address when one is set,
    over raftq's connections (``Connection``).

    Identity (what is announced and what the acceptor looks up) stays the
    peer's Raft address; only the TCP destination changes.
    """

    def __init__(self, syncObj, selfNode, otherNodes, *, dial_addrs: dict[str, str], max_frame: int,
                 group: int = 0, handoff: socket.socket | None = None):
        self._dial_addrs = dial_addrs
        self._preamble = group_preamble(group)
        # None: this node binds its Raft port itself (a lone Consensus, as in
        # tests and benchmarks); otherwise the supervisor hands connections over
        self._handoff = handoff
        self._max_frame = max_frame
        self._read_chunk = memoryview(bytearray(READ_CHUNK))
        # appends sent to all peers, in each form (status, metrics)
        self.appends_sent = new_appends_sent()
        # what this node announces on each connection (a test plays an older release with fewer)
        self.versions = WIRE_VERSIONS
        super().__init__(syncObj, selfNode, otherNodes)

    def hears_quiet(self, node) -> bool:
        """Whether ``node``'s connection is up and its peer announced ``QUIET_WIRE`` on it."""
        conn = self._connections.get(node)
        return conn is not None and conn.state == CONNECTION_STATE.CONNECTED and getattr(conn, "peer_quiet", False)

    # pysyncobj builds its TcpConnection objects inline, here and in its TCP
    # server; each becomes a Connection (same state, raftq's framing) before
    # it sends or reads a byte.
    def addNode(self, node):
        super().addNode(node)
        if node in self._connections:
            self._adopt(self._connections[node])

    def _adopt(self, conn) -> None:
        conn.__class__ = Connection
        conn.max_frame = self._max_frame
        conn.read_chunk = self._read_chunk
        conn.appends_sent = self.appends_sent
        conn.accepted_at = monotonic()

    def _createServer(self):
        if self._handoff is None:
            super()._createServer()
            self._server.__class__ = Server
            return
        conf = self._syncObj.conf
        self._server = HandedOverServer(self._syncObj._poller, self._handoff, self._onNewIncomingConnection,
                                        send_buffer=conf.sendBufferSize, recv_buffer=conf.recvBufferSize,
                                        timeout=conf.connectionTimeout)

    def _onNewIncomingConnection(self, conn):
        self._adopt(conn)
        address = remote_address(conn)
        pending = [c for c in self._unknownConnections if c.state != CONNECTION_STATE.DISCONNECTED]
        if len(pending) >= PENDING_LIMIT or \
                sum(1 for c in pending if remote_address(c) == address) >= PENDING_PER_ADDRESS:
            stranger_warnings.warn("too many Raft connections from %s that named no peer yet; closed", address)
            conn.disconnect()
            return
        super()._onNewIncomingConnection(conn)

    def _onIncomingMessageReceived(self, conn, message):
        # After the key exchange the first message names the sender. Only a
        # configured peer may connect: pysyncobj would also take 'readonly'
        # (a node that receives every entry) and utility commands (lists).
        if conn.sendRandKey or not self._syncObj.encryptor:
            if not isinstance(message, str) or message not in self._nodeAddrToNode:
                stranger_warnings.warn("a Raft connection from %s did not name a configured peer; closed",
                                       remote_address(conn))
                conn.disconnect()
                self._unknownConnections.discard(conn)
                return
        naming = conn in self._unknownConnections
        super()._onIncomingMessageReceived(conn, message)
        if naming and conn not in self._unknownConnections and conn.state == CONNECTION_STATE.CONNECTED:
            announce(conn, self.versions)      # the peer is named: it is told what this node speaks

    def _sendSelfAddress(self, conn):
        super()._sendSelfAddress(conn)
        if not self._selfIsReadonlyNode:
            announce(conn, self.versions)

    def send_append(self, node, term: int, prev_index: int, prev_term: int, commit_index: int, entries: list,
                    sent_at: float, quiet_s: float | None = None) -> bool:
        """``Connection.send_append`` to ``node``; whether its connection is still up after it (as
        pysyncobj's ``send``)."""
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        conn.send_append(term, prev_index, prev_term, commit_index, entries, sent_at, quiet_s)
        return conn.state == CONNECTION_STATE.CONNECTED

    def send_answer(self, node, term: int, next_index: int, success: bool, reset: bool,
                    sent_at: float | None) -> bool:
        """``Connection.send_answer`` to ``node``; whether its connection is still up after it."""
        conn = self._connections.get(node)
        if conn is None or conn.state != CONNECTION_STATE.CONNECTED:
            return False
        conn.send_answer(term, next_index, success, reset, sent_at)
        return conn.state == CONNECTION_STATE.CONNECTED

    def _onTick(self):
        super()._onTick()
        if self._unknownConnections:
            expired = monotonic() - HANDSHAKE_DEADLINE_S
            for conn in [c for c in self._unknownConnections if c.accepted_at < expired]:
                stranger_warnings.warn("a Raft connection from %s named no peer within %.0f s; closed",
                                       remote_address(conn), HANDSHAKE_DEADLINE_S)
                conn.disconnect()
                self._unknownConnections.discard(conn)
        stranger_warnings.flush()

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
        conn = self._connections[node]
        if dial is None:
            connecting = conn.connect(node.ip, node.port)
        else:
            host, port = dial.rsplit(":", 1)
            connecting = conn.connect(globalDnsResolver().resolve(host), int(port))
        if connecting and self._preamble:
            # connect() emptied the buffer; the preamble leaves before the key exchange
            conn.write_buffer = self._preamble
        return connecting


def new_appends_sent() -> dict[str, int]:
    return {"binary": 0, "pickled": 0}


def announce(conn, versions) -> None:
    """Tell the peer of ``conn`` which wire versions this node speaks (see "Protocol versions")."""
    conn.send({"type": ANNOUNCE, "versions": list(versions)})


def remote_address(conn) -> str:
    try:
        return conn.socket.getpeername()[0]
    except (OSError, AttributeError):
        return "?"
