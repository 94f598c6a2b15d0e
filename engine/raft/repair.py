"""Repair from peers: an entry whose record a read found damaged is fetched, by index and term,
from a replica whose copy verifies, and written back.

A read of a stored record checks it (``engine.storage.damage``); one that
fails raises ``DamagedRecord``, which the facade (``engine.raft.consensus``)
hands to ``Repairs.want``. Every replica holds the same bytes for an entry,
so the intact copy of one replica is the damaged record of another as it was
written: ``Repairs`` asks the other voters for it over the Raft port, takes
the first copy it may trust and writes it back in place (the journal's
``repair``, or the snapshot's ``LiveEntries.repair``), synced before it
counts. Callers that must serve the entry meanwhile (a receive's bodies)
wait for the copy itself (``Repairs.copy``).

Which copy may be given and taken, so that a repair never writes another
entry than the one that was damaged: entries of the same index and term are
the same entry (Raft's Log Matching), and an entry at or below a replica's
commit index is committed, the same on every replica (a follower's commit
index only covers entries it verified against its leader). So a replica
gives its copy if it holds it in the term asked, or -- asked without a term,
by a node that does not know it (an entry a snapshot carries, a kept entry
of a ``kept.rec`` from before terms were kept) -- if the entry is committed
here; and it says the copy's term when it knows it. The asker takes a copy
of the term it knows, or of a term it does not know only for an entry it
knows committed.

Why the Raft port, as PreVote (``engine.raft.prevote``) added its own
messages, rather than a route between the nodes' HTTP fronts: the engines
of a group's replicas are already connected there, each message sealed and
authenticated by the cluster secret (``engine.raft.sealer``) and bounded
like an append of the largest entry (``engine.raft.wire``), and the group
preamble brings it to this group's engine. A route would need the admin
token on every node, a forwarding path from a front into the right engine,
and a door that clients could knock at; a repair needs none of them.

Messages (an older node ignores them; the asker then keeps asking the others):
- ``raftq_fetch_entry`` ``{"index", "term"}``: ``term`` None when the asker does not know it;
- ``raftq_entry_copy`` ``{"index", "term", "command"}``: the entry's command as the journal holds
  it, ``term`` None when unknown; ``command`` None when this replica has no copy it may give.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

from . import pysyncobj_pin  # noqa: F401  -- the release these overrides were written for
from ..storage.damage import DamagedRecord

logger = logging.getLogger(__name__)

FETCH_ENTRY = "raftq_fetch_entry"
ENTRY_COPY = "raftq_entry_copy"
# A repair that no copy answered is asked again after this long, then twice as long each time
# up to ASK_AT_MOST_S: a replica may have been away, or may have had to repair its own copy.
ASK_AGAIN_S = 0.25
ASK_AT_MOST_S = 30.0


class EntryRepair:
    """The Raft port's side of repairs, mixed into ``engine.raft.node.RaftNode``: asks the other
    voters for an entry, and answers their asks with the node's ``_copy_for_peer(index, term)``
    -- (term or None, command) or None -- and hands a copy that came to its
    ``_copy_arrived(index, term, command, node)``. Like it, it reaches pysyncobj's state by
    the names ``engine.raft.internals`` gives it."""

    _copy_for_peer: Callable
    _copy_arrived: Callable

    def ask_for_entry(self, index: int, term: int | None) -> int:
        """Ask every connected voter for its copy of entry `index`; how many were asked."""
        message = {"type": FETCH_ENTRY, "index": index, "term": term}
        asked = 0
        for node in self.other_nodes:
            if self.isNodeConnected(node):
                self.transport.send(node, message)
                asked += 1
        return asked

    def _on_fetch_entry(self, node, message) -> None:
        index, term = message.get("index"), message.get("term")
        if not isinstance(index, int) or not (term is None or isinstance(term, int)):
            return
        copy = self._copy_for_peer(index, term)
        copy_term, command = copy if copy is not None else (None, None)
        self.transport.send(node, {"type": ENTRY_COPY, "index": index, "term": copy_term,
                                             "command": command})

    def _on_entry_copy(self, node, message) -> None:
        index, term, command = message.get("index"), message.get("term"), message.get("command")
        if isinstance(index, int) and (term is None or isinstance(term, int)) and isinstance(command, bytes):
            self._copy_arrived(index, term, command, node)


@dataclass(eq=False)
class _Wanted:
    term: int | None                         # the damaged entry's, when the reader knew it
    asked_at: float = 0.0
    wait: float = ASK_AGAIN_S                # until the next ask, once one went out
    waiters: list[asyncio.Future] = field(default_factory=list)


class Repairs:
    """The damaged entries this node wants an intact copy of, and what came of them.

    ``ask(index, term)`` sends the asks (``EntryRepair.ask_for_entry``; how many went out),
    ``write_back(index, term, command)`` writes a copy back (True once synced and read back
    intact), ``committed(index)`` says whether entry `index` is committed here, ``held(index)``
    whether this node still holds it at all. ``damaged`` and ``repaired`` count records for
    /metrics. Used on the engine's loop only."""

    def __init__(self, *, ask: Callable[[int, int | None], int], write_back: Callable[[int, int, bytes], bool],
                 committed: Callable[[int], bool], held: Callable[[int], bool]):
        self._ask = ask
        self._write_back = write_back
        self._committed = committed
        self._held = held
        self._wanted: dict[int, _Wanted] = {}
        self.damaged = 0
        self.repaired = 0

    def want(self, damage: DamagedRecord) -> bool:
        """Note a damaged record a read found; True if it is news (then counted)."""
        wanted = self._wanted.get(damage.index)
        if wanted is not None:
            wanted.term = wanted.term or damage.term
            return False
        self._wanted[damage.index] = _Wanted(damage.term)
        self.damaged += 1
        logger.error("%s; asking the other replicas for an intact copy", damage)
        return True

    def wanted(self, index: int) -> bool:
        return index in self._wanted

    def ask_due(self, now: float) -> None:
        """Ask for every wanted entry not asked for lately (in a tick); forget those this node no
        longer holds (compacted away, or cut from its log)."""
        if not self._wanted:
            return
        for index, wanted in list(self._wanted.items()):
            if not self._held(index):
                del self._wanted[index]
                self._answer(wanted, None)
            elif now - wanted.asked_at >= wanted.wait:
                if wanted.asked_at:
                    wanted.wait = min(2 * wanted.wait, ASK_AT_MOST_S)
                wanted.asked_at = now
                if not self._ask(index, wanted.term):
                    wanted.asked_at = now - wanted.wait + ASK_AGAIN_S   # nobody connected: soon again

    def arrived(self, index: int, term: int | None, command: bytes, source: str) -> None:
        """A replica's copy of entry `index` came (in a tick): if it may be trusted for the damaged
        record, write it back and hand it to whoever waits for it."""
        wanted = self._wanted.get(index)
        if wanted is None:
            return
        if term != wanted.term and not (None in (term, wanted.term) and self._committed(index)):
            return
        del self._wanted[index]
        try:
            written = self._write_back(index, wanted.term or term, command)
        except OSError:
            logger.exception("writing back the intact copy of log entry %d failed", index)
            written = False
        if written:
            self.repaired += 1
            logger.warning("log entry %d repaired from %s's copy", index, source)
        else:
            logger.error("log entry %d: %s's copy is intact, but it could not be written back here; "
                         "served from the copy", index, source)
        self._answer(wanted, command)

    async def copy(self, index: int, timeout: float) -> bytes | None:
        """The command of the intact copy of wanted entry `index` once it comes; None after
        `timeout`, or if it is not wanted (any more)."""
        wanted = self._wanted.get(index)
        if wanted is None:
            return None
        waiter = asyncio.get_running_loop().create_future()
        wanted.waiters.append(waiter)
        try:
            return await asyncio.wait_for(waiter, timeout)
        except asyncio.TimeoutError:
            return None
        finally:
            if waiter in wanted.waiters:
                wanted.waiters.remove(waiter)

    @staticmethod
    def _answer(wanted: _Wanted, command: bytes | None) -> None:
        for waiter in wanted.waiters:
            if not waiter.done():
                waiter.set_result(command)

    def close(self) -> None:
        for wanted in self._wanted.values():
            self._answer(wanted, None)
        self._wanted.clear()
