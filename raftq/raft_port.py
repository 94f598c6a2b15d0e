"""The node's one Raft port, as its supervisor serves it: accept, learn the
group from the connection's first bytes, hand the socket to that group's
engine.

A connection names its group with a preamble (``engine.raft.wire``:
``read_preamble``); one without a preamble is group 0's. The preamble is
only peeked at until it is complete and then consumed, so the engine reads
the connection from its first Raft frame. What a stranger can make the
supervisor hold is bounded as the engine's handshake is: at most
``PENDING_PER_ADDRESS`` undecided connections per address and
``PENDING_LIMIT`` in all, each for at most ``HANDSHAKE_DEADLINE_S``; a
malformed preamble, or one naming a group this node does not hold, closes
the connection at once. Past the preamble, the group's engine applies its
own handshake (the cluster secret, a configured peer): no stranger reaches
Raft itself.
"""

from __future__ import annotations

import asyncio
import errno
import socket

from raftq.engine.raft.wire import (HANDSHAKE_DEADLINE_S, LISTEN_BACKLOG, PENDING_LIMIT, PENDING_PER_ADDRESS,
                              PREAMBLE_MAX_BYTES, STRANGER_WARNING_INTERVAL_S, BadPreamble, read_preamble,
                              stranger_warnings)

# A connection whose first bytes do not yet tell its group is looked at again this often.
UNDECIDED_RECHECK_S = 0.05


def bind_raft(address: str) -> socket.socket:
    """The node's listening Raft socket; OSError if the address is taken."""
    host, _, port = address.rpartition(":")
    sock = socket.create_server((host.strip("[]"), int(port)), backlog=LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


class RaftPort:
    """Accepts on `listener` and hands each connection to `handoffs[group]`
    (the supervisor's end of that group's engine's Unix socket)."""

    def __init__(self, listener: socket.socket, handoffs: dict[int, socket.socket]):
        self._listener = listener
        self._handoffs = handoffs
        self._pending: dict[socket.socket, tuple[str, asyncio.TimerHandle]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for handoff in self._handoffs.values():
            handoff.setblocking(False)
        self._tasks = [asyncio.create_task(self._accept()), asyncio.create_task(self._flush_warnings())]

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for conn in list(self._pending):
            self._drop(conn)
        self._listener.close()

    async def _accept(self) -> None:
        while True:
            try:
                conn, peer = await self._loop.sock_accept(self._listener)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    await asyncio.sleep(0.1)   # out of descriptors or memory: let some close
                continue
            address = peer[0] if isinstance(peer, tuple) else "?"
            if len(self._pending) >= PENDING_LIMIT or \
                    sum(1 for a, _ in self._pending.values() if a == address) >= PENDING_PER_ADDRESS:
                stranger_warnings.warn("too many Raft connections from %s that named no group yet; closed", address)
                conn.close()
                continue
            conn.setblocking(False)
            expiry = self._loop.call_later(HANDSHAKE_DEADLINE_S, self._expire, conn)
            self._pending[conn] = (address, expiry)
            self._loop.add_reader(conn.fileno(), self._look, conn)

    async def _flush_warnings(self) -> None:
        while True:
            await asyncio.sleep(STRANGER_WARNING_INTERVAL_S / 5)
            stranger_warnings.flush()

    def _look(self, conn: socket.socket) -> None:
        """Peek at what the connection sent: hand it over, close it, or look again later."""
        address = self._pending[conn][0]
        try:
            head = conn.recv(PREAMBLE_MAX_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not head:           # closed before a byte: nothing to warn about
            self._drop(conn)
            return
        try:
            named = read_preamble(head)
        except BadPreamble as exc:
            stranger_warnings.warn("a Raft connection from %s sent a malformed group preamble (%s); closed",
                                   address, exc)
            self._drop(conn)
            return
        if named is None:
            # undecided: the reader would fire again at once with the same bytes waiting
            self._loop.remove_reader(conn.fileno())
            self._loop.call_later(UNDECIDED_RECHECK_S, self._look_again, conn)
            return
        group, length = named
        handoff = self._handoffs.get(group)
        if handoff is None:
            stranger_warnings.warn("a Raft connection from %s named group %d, which this node does not hold; closed",
                                   address, group)
            self._drop(conn)
            return
        if length:
            conn.recv(length)      # peeked whole: consumes exactly the preamble
        self._hand_over(conn, group, handoff, address)

    def _look_again(self, conn: socket.socket) -> None:
        if conn in self._pending:
            self._loop.add_reader(conn.fileno(), self._look, conn)

    def _hand_over(self, conn: socket.socket, group: int, handoff: socket.socket, address: str) -> None:
        try:
            socket.send_fds(handoff, [b"c"], [conn.fileno()])
        except OSError as exc:
            # the engine is not reading (stopping, or a burst filled its socket): the peer will dial again
            stranger_warnings.warn("could not hand a Raft connection from %s to group %d's engine (%s); closed",
                                   address, group, exc)
        self._drop(conn)           # the engine holds its own copy of the descriptor

    def _expire(self, conn: socket.socket) -> None:
        if conn in self._pending:
            stranger_warnings.warn("a Raft connection from %s named no group within %.0f s; closed",
                                   self._pending[conn][0], HANDSHAKE_DEADLINE_S)
            self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        _, expiry = self._pending.pop(conn)
        expiry.cancel()
        self._loop.remove_reader(conn.fileno())
        conn.close()
