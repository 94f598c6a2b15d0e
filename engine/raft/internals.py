"""pysyncobj's private state, each piece under a name of raftq's: the one module that names it.

pysyncobj 0.3.17 keeps a Raft node's state in name-mangled attributes
(``SyncObj.__raftCommitIndex`` is ``_SyncObj__raftCommitIndex`` on the
object), a connection's, its server's and the snapshot writer's in
``_TcpConnection__*``, ``_TcpServer__*`` and ``_Serializer__*`` ones. raftq reads and
writes some of them, and replaces some of the private methods pysyncobj
calls on itself (guarantees.md, "What pysyncobj 0.3.17 lacks"). Every such
place is here and nowhere else: ``SyncObjInternals``,
``ConnectionInternals``, ``ServerInternals`` and ``SerializerInternals`` sit
between pysyncobj's classes and raftq's (``engine.raft.node.RaftNode``,
``engine.raft.wire.Connection`` and ``Server``,
``engine.raft.snapshots.ForkedSnapshots``), so the
modules above them use raftq's names only, and a pysyncobj upgrade is
re-read against this file (``pysyncobj_pin``). What pysyncobj offers as public
API (``conf``, ``selfNode``, ``raftCurrentTerm``, ``forceLogCompaction``)
is used as such, not through here.

Four kinds of names:
- *state*: a property over the private attribute, read and written as if
  it were raftq's own;
- *calls*: pysyncobj's private methods that raftq calls;
- *hooks*: the private methods pysyncobj calls on itself, which raftq
  replaces: pysyncobj calls the private name, which calls raftq's, whose
  default here is pysyncobj's own code (so an override may call ``super()``);
- *the clock*: ``monotonic``, pysyncobj's own clock, which raftq reads
  and which pysyncobj's modules are given back read in C (below).
"""

from __future__ import annotations

import functools
import operator
import os
import time

from . import pysyncobj_pin  # noqa: F401  -- the release these names were read from
import pysyncobj.monotonic
import pysyncobj.syncobj
import pysyncobj.tcp_connection
import pysyncobj.transport
from pysyncobj import SyncObj
from pysyncobj.serializer import Serializer
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.tcp_server import TcpServer

# pysyncobj reads CLOCK_MONOTONIC_RAW through a lambda: a Python call each time, about 25 per
# entry on a leader. The same clock through functools.partial is read without one. Where that
# clock is missing pysyncobj's own reader stays (it finds another).
if hasattr(time, "CLOCK_MONOTONIC_RAW"):
    monotonic = functools.partial(time.clock_gettime, time.CLOCK_MONOTONIC_RAW)
    for _module in (pysyncobj.syncobj, pysyncobj.tcp_connection, pysyncobj.transport):
        _module.monotonicTime = monotonic
else:
    monotonic = pysyncobj.monotonic.monotonic


class _PrivateState(property):
    """A property over a name-mangled attribute of pysyncobj's."""


def _state(owner: str, name: str, doc: str) -> _PrivateState:
    mangled = f"_{owner}__{name}"

    def write(self, value):
        setattr(self, mangled, value)

    return _PrivateState(operator.attrgetter(mangled), write, doc=doc)


def _node_state(name: str, doc: str) -> property:
    return _state("SyncObj", name, doc)


class SyncObjInternals(SyncObj):
    """pysyncobj's ``SyncObj``, its private state and methods under raftq's names."""

    # -- state ------------------------------------------------------------------
    raft_state = _node_state("raftState", "LEADER, CANDIDATE or FOLLOWER (pysyncobj's _RAFT_STATE)")
    raft_leader = _node_state("raftLeader", "the node this one takes for the leader, or None")
    commit_index = _node_state("raftCommitIndex", "the highest index known committed")
    leader_commit_index = _node_state("leaderCommitIndex", "the commit index the leader last sent")
    last_applied = _node_state("raftLastApplied", "the highest index applied")
    next_indexes = _node_state("raftNextIndex", "a leader's next index to send, per follower")
    match_indexes = _node_state("raftMatchIndex", "a leader's highest index each follower holds")
    election_deadline = _node_state("raftElectionDeadline", "when a follower stands (monotonic)")
    next_heartbeat_at = _node_state("newAppendEntriesTime", "when a leader sends its next appends (monotonic)")
    last_answered_at = _node_state("lastResponseTime", "when each follower last answered this leader")
    other_nodes = _node_state("otherNodes", "the other voters (the set itself; the public property copies it)")
    readonly_nodes = _node_state("readonlyNodes", "the read-only nodes (the set itself)")
    connected_nodes = _node_state("connectedNodes", "the nodes with a connection up")
    transport = _node_state("transport", "the transport (engine.raft.wire.DialingTransport)")
    snapshot_serializer = _node_state("serializer", "what writes, loads and ships snapshots")
    commands_queue = _node_state("commandsQueue", "proposals waiting for the next tick")
    waiting_commit = _node_state("commandsWaitingCommit", "index -> [(term, callback)] of proposals")
    compaction_forced = _node_state("forceLogCompaction", "a snapshot is written at the next tick")
    last_serialized_entry = _node_state("lastSerializedEntry", "the entry the last snapshot ends at")
    transfer_in_progress = _node_state("transferInProgress", "a leadership transfer to this node runs")
    snapshot_to_load = _node_state("needLoadDumpFile", "a snapshot file waits to be loaded")

    def __dir__(self):
        # SyncObj's constructor finds its replicated methods by reading every name dir()
        # lists, before the state these properties read exists
        cls = type(self)
        return [name for name in super().__dir__() if not isinstance(getattr(cls, name, None), _PrivateState)]

    def replace_pipe_notifier(self, notifier) -> None:
        """Wake the node through ``notifier.notify()`` instead of pysyncobj's pipe, which is
        closed: on the engine's loop a wake-up is a tick scheduled, not a byte in a pipe."""
        pipe = self._SyncObj__pipeNotifier
        self._poller.unsubscribe(pipe._PipeNotifier__pipeR)
        os.close(pipe._PipeNotifier__pipeR)
        os.close(pipe._PipeNotifier__pipeW)
        self._SyncObj__pipeNotifier = notifier

    # -- calls ------------------------------------------------------------------
    def set_state(self, state) -> None:
        self._SyncObj__setState(state)

    def set_current_term(self, term: int, voted_for) -> None:
        self._SyncObj__setCurrentTerm(term, voted_for)

    def on_leader_changed(self) -> None:
        self._SyncObj__onLeaderChanged()

    def election_timeout(self) -> float:
        """A random election timeout, between the configured bounds."""
        return self._SyncObj__generateRaftTimeout()

    def parse_change_cluster_request(self, command: bytes):
        return self._SyncObj__parseChangeClusterRequest(command)

    def do_change_cluster(self, request, reverse: bool = False) -> bool:
        return self._SyncObj__doChangeCluster(request, reverse)

    # -- hooks ------------------------------------------------------------------
    def _SyncObj__onMessageReceived(self, node, message):
        self.on_message_received(node, message)

    def on_message_received(self, node, message):
        SyncObj._SyncObj__onMessageReceived(self, node, message)

    def _SyncObj__onNodeDisconnected(self, node):
        self.on_node_disconnected(node)

    def on_node_disconnected(self, node):
        SyncObj._SyncObj__onNodeDisconnected(self, node)

    def _SyncObj__onBecomeLeader(self):
        self.on_become_leader()

    def on_become_leader(self):
        SyncObj._SyncObj__onBecomeLeader(self)

    def _SyncObj__sendAppendEntries(self):
        self.send_append_entries()

    def send_append_entries(self):
        SyncObj._SyncObj__sendAppendEntries(self)

    def _SyncObj__applyLogEntries(self):
        self.apply_log_entries()

    def apply_log_entries(self):
        SyncObj._SyncObj__applyLogEntries(self)

    def _SyncObj__doApplyCommand(self, command):
        return self.do_apply_command(command)

    def do_apply_command(self, command):
        return SyncObj._SyncObj__doApplyCommand(self, command)

    def _SyncObj__tryLogCompaction(self):
        self.try_log_compaction()

    def try_log_compaction(self):
        SyncObj._SyncObj__tryLogCompaction(self)

    def _SyncObj__loadDumpFile(self, clearJournal):
        self.load_dump_file(clearJournal)

    def load_dump_file(self, clear_journal: bool):
        SyncObj._SyncObj__loadDumpFile(self, clear_journal)

    # the log, which raftq's journal holds (engine.storage.journal)
    def _SyncObj__getCurrentLogIndex(self):
        return self.last_log_index()

    def last_log_index(self) -> int:
        return SyncObj._SyncObj__getCurrentLogIndex(self)

    def _SyncObj__getCurrentLogTerm(self):
        return self.last_log_term()

    def last_log_term(self) -> int:
        return SyncObj._SyncObj__getCurrentLogTerm(self)

    def _SyncObj__getPrevLogIndexTerm(self, nextNodeIndex):
        return self.prev_log_index_term(nextNodeIndex)

    def prev_log_index_term(self, next_index: int) -> tuple[int, int]:
        return SyncObj._SyncObj__getPrevLogIndexTerm(self, next_index)

    def _SyncObj__getEntries(self, fromIDx, count=None, maxSizeBytes=None):
        return self.get_entries(fromIDx, count, maxSizeBytes)

    def get_entries(self, from_index: int, count=None, max_size_bytes=None) -> list:
        return SyncObj._SyncObj__getEntries(self, from_index, count, max_size_bytes)

    def _SyncObj__deleteEntriesFrom(self, fromIDx):
        self.delete_entries_from(fromIDx)

    def delete_entries_from(self, from_index: int) -> None:
        SyncObj._SyncObj__deleteEntriesFrom(self, from_index)

    def _SyncObj__deleteEntriesTo(self, toIDx):
        self.delete_entries_to(toIDx)

    def delete_entries_to(self, to_index: int) -> None:
        SyncObj._SyncObj__deleteEntriesTo(self, to_index)


def _connection_state(name: str, doc: str) -> property:
    return _state("TcpConnection", name, doc)


class ConnectionInternals(TcpConnection):
    """pysyncobj's ``TcpConnection``, its private state and methods under raftq's names."""

    socket = _connection_state("socket", "the connection's socket")
    read_buffer = _connection_state("readBuffer", "bytes read and not yet parsed")
    write_buffer = _connection_state("writeBuffer", "bytes queued and not yet sent")
    timeout = _connection_state("timeout", "pysyncobj's connection timeout (s)")

    def try_send_buffer(self) -> None:
        self._TcpConnection__trySendBuffer()

    def _TcpConnection__processRead(self):
        return self.process_read()

    def process_read(self) -> bool:
        return TcpConnection._TcpConnection__processRead(self)

    def _TcpConnection__processParseMessage(self):
        return self.parse_message()

    def parse_message(self):
        return TcpConnection._TcpConnection__processParseMessage(self)

    def _TcpConnection__processConnectionTimeout(self):
        self.check_timeout()

    def check_timeout(self) -> None:
        TcpConnection._TcpConnection__processConnectionTimeout(self)


def _server_state(name: str, doc: str) -> property:
    return _state("TcpServer", name, doc)


class ServerInternals(TcpServer):
    """pysyncobj's ``TcpServer``, its private state and its accept hook under raftq's names."""

    socket = _server_state("socket", "the listening socket")
    poller = _server_state("poller", "the poller accepted connections are registered with")
    send_buffer_size = _server_state("sendBufferSize", "SO_SNDBUF of each accepted connection")
    recv_buffer_size = _server_state("recvBufferSize", "SO_RCVBUF of each accepted connection")
    connection_timeout = _server_state("connectionTimeout", "each accepted connection's timeout (s)")
    keepalive = _server_state("keepalive", "each accepted connection's keep-alive settings")
    on_new_connection_callback = _server_state("onNewConnectionCallback", "the transport's taker of a connection")

    def _TcpServer__onNewConnection(self, descr, event):
        self.on_new_connection(descr, event)

    def on_new_connection(self, descr, event) -> None:
        TcpServer._TcpServer__onNewConnection(self, descr, event)


def _serializer_state(name: str, doc: str) -> property:
    return _state("Serializer", name, doc)


class SerializerInternals(Serializer):
    """pysyncobj's snapshot ``Serializer``, its private state under raftq's names."""

    fork_pid = _serializer_state("pid", "the forked writer's pid, 0 while none runs")
    current_id = _serializer_state("currentID", "the snapshot being written: (last index, term, ...)")
    transmissions = _serializer_state("transmissions", "node -> the snapshot transfer to it")
    file_name = _serializer_state("fileName", "the snapshot file's path")
