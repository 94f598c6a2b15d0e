"""raftq's consensus: the face of a Raft node that the rest of the engine uses.

Theory of operation
-------------------
pysyncobj (pinned, ``engine/raft/pysyncobj_pin.py``) runs the Raft protocol in
ticks: network I/O, elections, replication, commit, apply. raftq runs them on
the engine's asyncio loop (``start``; ``engine.raft.ticking``), the one thread
that calls this facade: nothing here is shared with another thread. Only
the modules of ``engine/raft/`` read its internals (``engine.storage.journal``
implements its public journal interface), one concern each:

- ``engine.raft.consensus`` (this module): ``Consensus``, the facade below;
- ``engine.raft.node``: ``RaftNode``, pysyncobj's SyncObj with raftq's
  protocol fixes (durable journal hook, follower truncation, grouped fsyncs,
  compaction by entries and bytes, term-checked command queue), and its
  mixins ``engine.raft.follower`` and ``engine.raft.prevote``: the one
  owner of pysyncobj's internals. This facade touches none of them: it
  reads the Raft node (role, leader, term, commit and applied index, the
  other voters and when each was last heard) and steers it (propose, hold
  back, step down, wake, stop) through ``RaftNode``'s own methods;
- ``engine.raft.wire``: framing, sealing, handshake and limits of the Raft
  port, and dialing through proxies;
- ``engine.raft.snapshots``: snapshots written by a forked child;
- ``engine.raft.ticking``: the ticks on the loop;
- ``engine.raft.pysyncobj_pin``: the one release these overrides were written for.
The files they keep are ``engine.storage.journal`` (the log) and
``engine.storage.snapshot_file``, both record files of ``engine.storage.records``.

raftq gives pysyncobj one replicated method, ``_raftq_apply(entry: bytes)``,
which hands the entry to the state machine's ``apply``. Everything above this
module sees ``Consensus``: ``propose(entry, callback, term=...)``, ``status()``,
membership, leadership transfer and snapshots, with raftq's own node ids;
pysyncobj knows nodes only by their Raft addresses, so an id <-> address map
lives here.

A proposed entry is wrapped in a ticket. The ticket's callback runs exactly
once, in a tick: with the apply result when the entry is committed and
applied here, or with an error string -- ``not_leader``, ``no_quorum``,
``too_large``, ``overloaded``, ``insufficient_storage`` (the leader's journal
had no room for the entry) (definitely not applied); ``discarded``,
``leader_changed``, ``unknown_outcome``, ``timeout`` (maybe applied: retry with
the same idempotency id); ``denied`` (membership change refused). A ticket
that outlives ``submit_timeout`` gets ``timeout`` and any later outcome from
pysyncobj is dropped.

What the facade itself adds to pysyncobj 0.3.17 (docs/guarantees.md, "What
pysyncobj 0.3.17 lacks"):
- Never raise. The state machine's ``apply`` is wrapped: an exception is
  logged CRITICAL and becomes the result ``{"error": "internal", ...}``, so
  it cannot re-run forever.
- Snapshots: the state machine's own bytes plus the two last applied entries
  and the membership (``engine.storage.snapshot_file``), written by a forked child
  from a copy-on-write image of the state, so ``write_snapshot`` runs in
  that child and must not take a lock; it encodes the state into the file it
  is given as it goes, so the child never holds it whole. ``journalFile`` and ``fullDumpFile`` are
  always both set. Compaction thresholds (entries, bytes, seconds) are
  jittered per node so the replicas do not all fork at once. A node being closed compacts a long log first, so that its restart
  loads the snapshot and replays a short tail; and reading a snapshot drops
  only the log entries it covers (pysyncobj would clear the whole log when a
  crash came between writing a snapshot and compacting the log).
- Live entries. A stored body is a reference into the log entry that
  carried it (statemachine/bodies.py); ``entry_at`` reads an applied entry
  back, from the journal -- whose compaction keeps, on disk, the entries the
  snapshot names (``live_entries``) -- or from the snapshot, which carries
  those this node holds in no journal (entries it received in a leader's
  snapshot). A follower is sent the snapshot with every live entry carried
  (``snapshot_file.Shipment``). Recently read entries are kept in a
  bounded cache.
- Damaged records (``engine.raft.repair``). Every read of a stored record
  checks it; one that fails (``DamagedRecord``) is never served: an intact
  copy is fetched from a replica, by index and term, and written back
  (``_damage_found``), and a caller that must answer with it meanwhile waits
  for the copy (``intact_entry``). A leader that finds damage in what it
  serves hands its leadership to a replica that can read it, within an
  election timeout, and repairs itself as a follower. ``scrub_after`` is
  the scrubber's walk (``engine.scrubber``).
- Fast failover timing, a quorum check before accepting a write (the
  leader lease) and, when a leader has stepped down for want of a majority
  (CheckQuorum, ``engine.raft.node``), a routing view that says it is cut
  off, so that its fronts refuse at once rather than wait for an election
  it cannot see (``route``); entries above
  ``max_entry_bytes`` refused before they reach pysyncobj (its chunked path
  for big entries is broken), the Raft port bound to the configured host
  rather than 0.0.0.0, and a loud warning when no cluster secret is set
  (node-to-node messages are unpickled: without the secret anyone reaching
  the port can run code; the node process refuses to start without one
  unless told it is a test).
- Commit callbacks drive ``bench/consensus_bench.py``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import pickle
import socket
import time
import zlib
from pathlib import Path
from typing import BinaryIO, Callable

from pysyncobj import SyncObjConf

from ..config import Peer
from ..storage import snapshot_file
from ..storage.damage import DamagedRecord
from ..storage.journal import DurableJournal, encode_record
from ..storage.records import DamagedFile
from .internals import monotonic
from .node import ENTRY_BYTES, FOLLOWER, LEADER, MEMBERSHIP_COMMAND, PLAIN_BYTE, ROLE_NAMES, AddressNode, RaftNode, Ticket
from .repair import Repairs
from .sealer import Sealer
from .wire import max_frame_bytes

logger = logging.getLogger(__name__)

JOURNAL_DIR = "journal"
SNAPSHOT_FILE = "snapshot.bin"
# A node being closed compacts once its log holds this fraction of the
# compaction threshold: replaying 8 MiB of entries at restart costs about as
# much as a snapshot of a small state, far less than one of a large state.
SHUTDOWN_COMPACTION_DIVISOR = 4
# Log entries read back for their bodies, kept for the next reads: a receive
# takes consecutive messages, which mostly lie in the same few entries.
ENTRY_CACHE_ENTRIES = 64
ENTRY_CACHE_BYTES = 32 * 1024 * 1024


class Consensus:
    """A Raft node for raftq; see the module docstring for the contract."""

    def __init__(self, *, self_peer: Peer, peers: list[Peer], data_dir: str | Path,
                 apply: Callable[[bytes], object], write_snapshot: Callable[[BinaryIO], None],
                 restore: Callable[[bytes], None], secret: str | None, fsync: bool = True,
                 live_entries: Callable[[], list[int]] = list,   # ascending
                 after_snapshot: Callable[[int, list[int]], None] | None = None,
                 on_role_change: Callable[[], None] | None = None,
                 election_timeout: tuple[float, float] = (0.3, 0.6),
                 leader_lease: float = 0.2,
                 heartbeat: float = 0.09,
                 connection_retry: float = 0.2,
                 submit_timeout: float = 10.0,
                 max_entry_bytes: int = 2 * 1024 * 1024,
                 compaction_min_entries: int = 10_000,
                 compaction_min_seconds: float = 600.0,
                 compaction_min_bytes: int = 32 * 1024 * 1024,
                 segment_bytes: int = 64 * 1024 * 1024,
                 bind_addr: str | None = None, group: int = 0, handoff: socket.socket | None = None):
        # group: which of the node's Raft groups this is (it names itself
        # when it dials: engine.raft.wire.group_preamble). handoff: the Unix
        # socket the node's supervisor passes this group's accepted Raft
        # connections over; without one it binds bind_addr (or its own
        # address) itself.
        if secret is None:
            logger.warning("NO CLUSTER SECRET: Raft traffic on %s is unauthenticated and unpickled -- anyone who "
                           "can reach this port can run code on this node. Set a secret and firewall the port.",
                           self_peer.raft_addr)
        self.self_peer = self_peer
        self._apply = apply
        self._write_state = write_snapshot
        self._restore = restore
        self._live_entries = live_entries
        # called in the snapshot writer's child once the snapshot is written, with its last index and
        # the live entries it names (engine/relocation.py plans what to copy out of those it keeps)
        self._after_snapshot = after_snapshot
        # The live entries of the snapshot loaded or written last, and the
        # entries read back lately.
        self._snapshot_entries = snapshot_file.LiveEntries()
        self._entry_cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._entry_cache_bytes = 0
        self._on_role_change = on_role_change
        self._submit_timeout = submit_timeout
        self._max_entry_bytes = max_entry_bytes
        self._election_timeout = election_timeout[1]
        # How recently a leader must have heard from a majority to take
        # writes and reads and to say it is ready: a leader cut off from the
        # others stops taking work (503 no_quorum) rather than letting it
        # wait for the submit timeout. Safety does not rest on it: writes
        # commit on a majority, and leader reads are confirmed by one
        # (confirm_read).
        if not heartbeat < leader_lease <= election_timeout[0]:
            raise ValueError("need heartbeat < leader_lease <= the shortest election timeout")
        self._leader_lease = leader_lease
        self._fsync_policy = "fsync-per-append" if fsync else "no-fsync"

        self._ids = {p.raft_addr: p.id for p in [self_peer, *peers]}
        self._dial_addrs = {p.raft_addr: p.dial_addr for p in peers if p.dial_addr}
        self._tickets: collections.deque[Ticket] = collections.deque()
        self._tasks: collections.deque[Callable[[], None]] = collections.deque()
        # Proposals held back while this leader hands its leadership over (transfer_leadership),
        # None when it is not handing over.
        self._held: list[tuple[bytes, Ticket]] | None = None
        self._closed = False
        self._retired = False
        self._last_role: tuple | None = None
        self._last_quorum: tuple | None = None
        self._snapshot_info = {"index": None, "bytes": None, "seconds": None, "count": 0}

        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self._snapshot_path = data_dir / SNAPSHOT_FILE
        snapshot_file.check_format(self._snapshot_path)
        self._journal = DurableJournal(data_dir / JOURNAL_DIR, fsync=fsync,
                                       segment_bytes=segment_bytes, snapshot_path=self._snapshot_path,
                                       noted_kind=MEMBERSHIP_COMMAND)
        self._journal.on_damage = lambda damage, serving: self._damage_found(damage, serving=serving)
        self._repairs = Repairs(ask=lambda index, term: self._node.ask_for_entry(index, term),
                                write_back=self._write_back, committed=self._committed_here,
                                held=self._holds)
        # A hand-over of a leader that found damage in what it serves, while it runs; and the
        # inode of a snapshot file whose header or state a shipment found damaged (no follower is
        # sent it: the next snapshot, written from memory, replaces it).
        self._damage_hand_over: asyncio.Task | None = None
        self._unshippable: int | None = None
        # Replicas apply the same entries, so equal thresholds would make them
        # all fork a snapshot writer at the same moment; spread them per node.
        jitter = 1 + (zlib.crc32(self_peer.raft_addr.encode()) % 1000) / 2000
        conf = SyncObjConf(
            password=None,   # encryption is the Sealer's (given to RaftNode), not Fernet
            autoTick=False,   # ticked on the engine's loop (start)
            raftMinTimeout=election_timeout[0],
            raftMaxTimeout=election_timeout[1],
            appendEntriesPeriod=heartbeat,
            # Idle peer links must not be dropped on the first vote request
            # (that forces a second election round); dead links are found by
            # the election timeout and TCP keepalive instead.
            connectionTimeout=max(30.0, election_timeout[1]),
            connectionRetryTime=connection_retry,
            # CheckQuorum is raftq's (engine.raft.node, item 12): it reads the
            # answers waiting behind a late tick, and says why it stepped down.
            leaderFallbackTimeout=float("inf"),
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
            self._node = RaftNode(self._make_node(self_peer.raft_addr),
                                  [self._make_node(p.raft_addr) for p in peers],
                                  conf, self._journal, self._dial_addrs,
                                  apply_entry=self._apply_entry, snapshot_written=self._snapshot_written,
                                  ship_snapshot=self._ship_snapshot,
                                  snapshot_damaged=lambda damage: self._damage_found(damage, serving=False),
                                  copy_for_peer=self._copy_for_peer, copy_arrived=self._copy_arrived,
                                  sealer=Sealer(secret) if secret is not None else None,
                                  max_frame=max_frame_bytes(max_entry_bytes),
                                  # 32 MiB of batched 100-byte puts replay in about 2 s at
                                  # restart; a snapshot of 1 M messages costs about 3 s
                                  compaction_min_bytes=int(compaction_min_bytes * jitter),
                                  heard_within=leader_lease, group=group, handoff=handoff)
        except BaseException:
            self._journal._destroy()
            raise
        self._node.addOnTickCallback(self._on_tick)

    # -- public interface --------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tick on `loop` (the engine's) from now on: load the snapshot,
        replay the log, then take part in the group."""
        self._node.run_on(loop)

    def propose(self, entry: bytes, callback: Callable[[object | None, str | None], None], *, term: int) -> None:
        """Propose ``entry``, prepared for ``term``, to the Raft log: it enters the log only while
        this node leads that term; ``callback(result, error)`` runs once, in a tick."""
        ticket = self._ticket(callback, term)
        if ticket is None:
            return
        if len(entry) > self._max_entry_bytes:
            self._later(ticket, "too_large")
            return
        if self._held is not None and self._refusal() is None:
            self._held.append((entry, ticket))
            return
        self._enter(entry, ticket)

    def _enter(self, entry: bytes, ticket: Ticket) -> None:
        refusal = self._refusal()
        if refusal:
            self._later(ticket, refusal)
            return
        self._node.propose(entry, ticket.on_pysyncobj_result)

    def confirm_read(self, callback: Callable[[object | None, str | None], None]) -> None:
        """Call back ``(None, None)`` once a read arriving now may be answered
        from this leader's applied state: a majority answered appends sent
        after now, and this node applied what it had committed by now
        (``engine.raft.read_index``). Otherwise an error, as ``propose``'s."""
        ticket = self._admitted(callback)
        if ticket is not None:
            asked_at = monotonic()
            self._run_on_tick(lambda: self._node.confirm_read(ticket, asked_at))

    def status(self) -> dict:
        node = self._node
        now = monotonic()
        state = node.role()
        leader = node.leader()
        match, nxt = node.replication()
        heard = dict(node.last_heard)
        peers = {}
        for other in node.others():
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
            "role": ROLE_NAMES[state],
            "leader_id": None if leader is None else self._id_of(leader),
            "term": node.raftCurrentTerm,
            "commit_index": node.raftCommitIndex,
            "applied_index": node.raftLastApplied,
            "last_log_index": self._journal.last_index() or node.raftLastApplied,   # empty: mid-install
            "quorum_ok": self._quorum_ok(now),
            "cut_off": self._cut_off(),
            "quorum_step_downs": node.quorum_step_downs,
            "ticks": node.ticks,
            "leader_ticks": node.leader_ticks,
            "appends_sent": node.appends_sent(),
            "plain_entries": node.plain_entries,      # engine.raft.node, item 19: proposals logged without pickle
            "pre_votes": {"asked": node.pre_votes_asked, "won": node.pre_votes_won},
            "peers": peers,
            # a quiet group (engine.raft.quiet): heartbeats and their answers this much further apart,
            # which whoever judges a peer by its last_contact_ms allows for
            "quiet": node.is_quiet(),
            "contact_slack_ms": round(node.contact_slack() * 1000),
            "fsync_policy": self._fsync_policy,
            "log_entries": journal["entries"],
            "log_size": journal["bytes"],
            "log_segments": journal["segments"],
            "log_kept_bytes": journal["kept_bytes"],
            "journal_syncs": journal["data_syncs"],
            "snapshot": dict(self._snapshot_info),
        }

    @property
    def election_timeout(self) -> float:
        """The longest election timeout, in seconds: a follower not heard from for longer may be gone."""
        return self._election_timeout

    def applied_index(self) -> int:
        return self._node.raftLastApplied

    def applying_index(self) -> int:
        """Inside ``apply``: the log index of the entry being applied (pysyncobj
        counts an entry applied only once apply has returned)."""
        return self._node.applying_index()

    def entry_at(self, index: int) -> bytes:
        """The applied log entry at `index`, as the state machine applied it. DamagedRecord if its
        record fails its checks: an intact copy is then fetched from a replica (``intact_entry``
        waits for it) and written back."""
        entry = self._entry_cache.get(index)
        if entry is not None:
            self._entry_cache.move_to_end(index)
            return entry
        entry = self._stored_entry(index)
        self._cache_entry(index, entry)
        return entry

    def _cache_entry(self, index: int, entry: bytes) -> None:
        self._entry_cache[index] = entry
        self._entry_cache_bytes += len(entry)
        while len(self._entry_cache) > ENTRY_CACHE_ENTRIES or self._entry_cache_bytes > ENTRY_CACHE_BYTES:
            self._entry_cache_bytes -= len(self._entry_cache.popitem(last=False)[1])

    async def intact_entry(self, index: int, timeout: float) -> bytes | None:
        """``entry_at(index)``, or if its record is damaged, the intact copy of a replica once it
        comes (it is written back meanwhile); None if none came within `timeout`."""
        try:
            return self.entry_at(index)
        except DamagedRecord:
            pass
        command = await self._repairs.copy(index, timeout)
        if command is None:
            return None
        entry = self._entry_of(command)
        self._cache_entry(index, entry)
        return entry

    def stored_entry(self, index: int) -> bytes:
        """The entry at `index` from the journal, else from the snapshot, past the cache (a reader
        of many entries once, engine/relocation.py, would evict the ones receives read again);
        LookupError if neither holds it."""
        return self._stored_entry(index)

    def stored_bytes(self, index: int) -> int | None:
        """How many bytes of this node's files the entry at `index` takes (its record, in the
        journal or carried by the snapshot), reading none of them; None if neither holds it."""
        size = self._journal.stored_bytes(index)
        return self._snapshot_entries.stored_bytes(index) if size is None else size

    def snapshot_index(self) -> int | None:
        """The last log index the latest snapshot covers (None before the first): the entries up
        to it that are still live are those compaction keeps."""
        return self._snapshot_info["index"]

    def _stored_entry(self, index: int) -> bytes:
        """The entry at `index` from the journal, else from the snapshot; LookupError if neither holds it."""
        entry = self._journal_entry(index)
        if entry is None:
            try:
                entry = self._snapshot_entries.get(index)
            except DamagedRecord as damage:
                self._damage_found(damage)
                raise
        if entry is None:
            raise LookupError(f"log entry {index} is neither in the journal nor in the snapshot")
        return entry

    def _journal_entry(self, index: int) -> bytes | None:
        command = self._journal.command(index)
        return None if command is None else self._entry_of(command)

    @staticmethod
    def _entry_of(command: bytes) -> bytes:
        # engine.raft.node, item 19: the plain type byte and the entry, or a regular command's
        # type byte and a pickle of (the id of _raftq_apply, (entry,))
        if command[:1] == PLAIN_BYTE:
            return command[1:]
        return pickle.loads(command[1:])[1][0]

    def _carried_entry(self, index: int) -> bytes:
        """A live entry the journal does not hold, from the snapshot (in the snapshot writer's child):
        checked as it is read, so a damaged one stops the writer (``engine.raft.snapshots``)."""
        entry = self._snapshot_entries.get(index)
        if entry is None:
            raise LookupError(f"log entry {index} is neither in the journal nor in the snapshot")
        return entry

    def _ship_snapshot(self, path: str) -> snapshot_file.Shipment:
        def entry_at(index: int) -> bytes:
            entry = self._journal_entry(index)
            if entry is None:
                raise LookupError(f"log entry {index}, which the snapshot names, is not in the journal")
            return entry
        if self._unshippable is not None and Path(path).stat().st_ino == self._unshippable:
            raise DamagedFile(f"{path} is damaged; a new snapshot is being written")
        return snapshot_file.Shipment(path, entry_at, on_damage=self._shipment_damaged)

    def _shipment_damaged(self, damage: DamagedFile) -> None:
        if isinstance(damage, DamagedRecord):
            self._damage_found(damage)
            return
        # its header or state: nothing to fetch (the replicas' snapshots differ), but this node's
        # state is intact in memory -- a new snapshot replaces the file, and counts as its repair
        unshippable = self._snapshot_path.stat().st_ino
        if unshippable != self._unshippable:
            logger.error("%s; writing a new snapshot", damage)
            self._unshippable = unshippable
            self._repairs.damaged += 1
        self._run_on_tick(self._node.replace_snapshot)

    # -- repairs (engine.raft.repair) ---------------------------------------

    def _damage_found(self, damage: DamagedRecord, *, serving: bool = True) -> None:
        """A read found `damage`: fetch an intact copy. A leader that found it in what it serves
        (a body, an entry to apply or to send, a shipment) hands its leadership to a replica that
        can read it, within an election timeout, and repairs itself as a follower; damage found in
        the background (the scrubber, a replica's ask, the snapshot writer) is only repaired."""
        self._repairs.want(damage)
        self._node.wake()
        if serving and self._node.is_leader() and self._node.others() and self._damage_hand_over is None:
            self._damage_hand_over = asyncio.get_running_loop().create_task(self._hand_over_for_damage(damage))

    async def _hand_over_for_damage(self, damage: DamagedRecord) -> None:
        try:
            moved = await self.transfer_leadership(self._election_timeout, step_down=False)
            logger.warning("%s: leadership %s", damage, "handed over to a replica that can read it" if moved
                           else "kept, no replica took it within the election timeout")
        finally:
            self._damage_hand_over = None

    def _copy_for_peer(self, index: int, term: int | None) -> tuple[int | None, bytes] | None:
        """This node's copy of entry `index` for a replica that asked (in a tick), if it may give it
        (``engine.raft.repair``): (its term, None if not known; its command)."""
        committed = self._committed_here(index)
        try:
            held = self._journal.copy(index)
            if held is not None:
                held_term, command = held[0] or None, held[1]
            else:
                entry = self._snapshot_entries.get(index)
                if entry is None:
                    return None
                held_term, command = None, self._node.command_of(entry)
        except DamagedRecord as damage:
            self._damage_found(damage, serving=False)
            return None
        if (term is not None and held_term == term) or committed:
            return held_term, command
        return None

    def _copy_arrived(self, index: int, term: int | None, command: bytes, node) -> None:
        self._repairs.arrived(index, term, command, self._id_of(node))

    def _write_back(self, index: int, term: int | None, command: bytes) -> bool:
        if command[:1] not in ENTRY_BYTES:
            written = self._journal.holds(index) and self._journal.repair(index, term, command)
        elif self._journal.holds(index):
            written = self._journal.repair(index, term, self._in_the_form_held(index, command))
        else:
            written = self._snapshot_entries.repair(index, self._entry_of(command))
        if written:
            self._node.wake()      # applies held back by the damage go on
        return written

    def _in_the_form_held(self, index: int, command: bytes) -> bytes:
        """The copy of an entry in the form of the record it repairs here: a replica that held
        only the entry rebuilt the command in the form it proposes in (engine.raft.node, item 19),
        and a log written before every node applied plain entries holds pickled calls."""
        if self._journal.stored_bytes(index) == len(encode_record(command, index, 1)):
            return command
        return self._node.command_of(self._entry_of(command), plain=command[:1] != PLAIN_BYTE)

    def _committed_here(self, index: int) -> bool:
        return index <= self._node.raftCommitIndex

    def _holds(self, index: int) -> bool:
        return self._journal.holds(index) or self._snapshot_entries.carries(index)

    def scrub_after(self, index: int) -> tuple[int, int] | None:
        """Check the first live entry at or after `index` (the log, the kept entries, the entries the
        snapshot carries), its record read back from disk: (its index, its record's length), None
        past the last. A damaged one is repaired (not a reason to hand over: nobody asked for it)."""
        in_journal, carried = self._journal.next_held(index), self._snapshot_entries.next_carried(index)
        found = min((i for i in (in_journal, carried) if i is not None), default=None)
        if found is None:
            return None
        try:
            length = self._journal.check(found) if found == in_journal else self._snapshot_entries.check(found)
        except DamagedRecord as damage:
            self._damage_found(damage, serving=False)
            return found, 0
        return found, length or 0

    def scrub_bytes(self) -> int:
        """About how many bytes a scrub pass reads: the journal's and the carried entries'."""
        return self._journal.stats()["bytes"] + self._snapshot_entries.carried_bytes()

    def late_ticks(self) -> tuple[int, float]:
        """(ticks that ran late, seconds late in all) since this node started (engine.raft.ticking)."""
        late = self._node.late_ticks()
        return late.count, late.seconds

    def damage_counts(self) -> tuple[int, int]:
        """(damaged records found, records repaired) since this node started."""
        return self._repairs.damaged, self._repairs.repaired

    def _use_snapshot_entries(self, entries: snapshot_file.LiveEntries) -> None:
        self._snapshot_entries, old = entries, self._snapshot_entries
        old.close()

    def route(self) -> tuple[str, str | None, int, bool, bool]:
        """Role, leader id, term, whether a majority is heard and whether this
        node is cut off (``_cut_off``): what routing a request needs, without
        the rest of status()."""
        node = self._node
        leader = node.leader()
        return (ROLE_NAMES[node.role()], None if leader is None else self._id_of(leader),
                node.raftCurrentTerm, self._quorum_ok(monotonic()), self._cut_off())

    def term(self) -> int:
        """The current term, cheaply (status() builds the whole picture)."""
        return self._node.raftCurrentTerm

    def snapshot_bytes(self) -> int:
        """The size of this node's current snapshot (0: none yet), cheaply."""
        return self._snapshot_info["bytes"] or 0

    def is_leader(self) -> bool:
        return self._node.is_leader()

    def leader_id(self) -> str | None:
        leader = self._node.leader()
        return None if leader is None else self._id_of(leader)

    def allow_plain_entries(self, allowed: bool) -> None:
        """Whether every node runs a release that applies an entry logged without pickle
        (engine.raft.node, item 19; api/features.py asks them): while it does, proposals are."""
        self._node.allow_plain_entries(allowed)

    def learn_ids(self, ids: dict[str, str]) -> None:
        """Raft address -> node id of voters this node may know only by address: one another
        leader added, which reaches this node's configuration through the log (addresses only)."""
        for raft_addr, node_id in ids.items():
            self._ids.setdefault(raft_addr, node_id)

    def add_node(self, peer: Peer, callback) -> None:
        node = AddressNode(peer.raft_addr, raftq_id=peer.id)    # an address it cannot take raises here, before any change
        ticket = self._admitted(callback)
        if ticket is None:
            return
        self._ids[peer.raft_addr] = peer.id
        if peer.dial_addr:
            self._dial_addrs[peer.raft_addr] = peer.dial_addr
        self._node.addNodeToCluster(node, callback=ticket.on_pysyncobj_result)

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

    async def transfer_leadership(self, timeout: float, to: str | None = None, *, step_down: bool = True) -> bool:
        """Hand leadership to a caught-up follower (``to``, or the most caught-up
        one); True once another node leads.

        Retries until ``timeout`` (a follower may need to catch up first); if
        no other node took over by then, the result is False and, with
        `step_down` (a node shutting down), this node steps down and holds
        back from campaigning for a while; without it (leader balancing), it
        keeps leading.

        For up to an election timeout, new proposals are held back rather
        than appended (Raft thesis 3.10): a log that grew after pysyncobj
        sent TimeoutNow would have the target stand with a shorter log, be
        refused, and leave the group to elections nobody asked for. Held
        proposals never reached the log: if the lead moved they are refused
        (``not_leader``, so a front serves them again at the new leader),
        otherwise they are proposed when the hold ends.
        """
        addr = next((a for a, i in self._ids.items() if i == to), None) if to else None
        target = self._make_node(addr) if addr else None
        deadline = time.monotonic() + timeout
        holding = self._held is None        # one hold at a time: a second caller rides on the first's
        if holding:
            self._held = []
        hold_until = time.monotonic() + min(timeout, self._election_timeout)
        try:
            while time.monotonic() < deadline:
                leader = self.leader_id()
                if leader is not None and leader != self.self_peer.id:
                    return True
                if holding and time.monotonic() >= hold_until:
                    holding = False
                    self._release_held()
                if self._node.is_leader():
                    self._run_on_tick(lambda: self._node.transferLeadership(target))
                await asyncio.sleep(0.02)
            if step_down and self._node.is_leader():
                self._run_on_tick(self._step_down)
            return False
        finally:
            if holding:
                self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held or [], None
        for entry, ticket in held:
            self._enter(entry, ticket)

    def retire(self) -> None:
        """Never stand for election again (a node shutting down): without
        this, a node that just handed leadership over can win the next
        election during its own shutdown and stall writes once more."""
        self._retired = True
        self._run_on_tick(self._hold_back)
        self._run_on_tick(self._node.decline_leadership)

    def _hold_back(self) -> None:
        self._node.hold_back(10 * self._election_timeout)
        self._step_down()

    async def force_snapshot(self, timeout: float = 60.0) -> bool:
        """Compact the log now; True if a new snapshot was written."""
        return await self._compact(timeout)

    async def _compact(self, timeout: float, over_bytes: int = -1) -> bool:
        """Snapshot and drop the log prefix it covers, if more than ``over_bytes``
        of applied entries would go; True once a new snapshot was written and
        the log compacted."""
        outcome = asyncio.get_running_loop().create_future()
        before = self._snapshot_info["count"]

        def arm():
            if self._node.compactable_bytes() <= over_bytes:
                outcome.done() or outcome.set_result(False)
                return
            self._node.forceLogCompaction()
            self._tasks.append(check)

        def check():
            # pysyncobj clears the flag in the tick that serializes (within
            # that tick) and drops the log prefix in the next one, when the
            # serializer's pid is back to 0.
            node = self._node
            if node.compaction_pending() or node.snapshots.busy():
                self._tasks.append(check)
                return
            outcome.done() or outcome.set_result(self._snapshot_info["count"] > before)

        self._run_on_tick(arm)
        try:
            return await asyncio.wait_for(outcome, timeout)
        except asyncio.TimeoutError:
            return False

    async def close(self) -> None:
        """Stop this node, after compacting its log if that makes its restart
        faster: a restart replays every entry after the snapshot, and the
        leader, which defers compaction, holds the longest log."""
        if self._closed:
            return
        await self._compact(timeout=60.0, over_bytes=self._node.compaction_min_bytes // SHUTDOWN_COMPACTION_DIVISOR)
        if self._closed:
            return
        self._closed = True
        self._node.stop()
        self._repairs.close()
        self._use_snapshot_entries(snapshot_file.LiveEntries())
        while self._tasks:
            self._tasks.popleft()()
        while self._tickets:
            self._tickets.popleft().resolve(None, "unknown_outcome")

    # -- in a tick ---------------------------------------------------------

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
        self._repairs.ask_due(now)
        tickets = self._tickets
        while tickets and (tickets[0].done or tickets[0].deadline <= now):
            tickets.popleft().resolve(None, "timeout")
        node = self._node
        role = (node.role(), node.leader(), node.raftCurrentTerm)
        # The fronts route on whether a majority is heard, too: a change of it
        # is reported like a change of role, from here rather than by polling.
        quorum = (self._quorum_ok(monotonic()), self._cut_off())
        if role != self._last_role or quorum != self._last_quorum:
            if role != self._last_role and self._last_role is not None and self._last_role[0] == LEADER:
                # Deposed (or re-elected in a new term): pysyncobj answers the
                # old term's commands only once an entry at their index is
                # applied, which may take until submit_timeout while callers
                # (group commit's in-flight window) wait. Their outcome is
                # unknown now; say so at once. Those held back for a hand-off
                # never reached the log.
                if self._held:
                    for _, ticket in self._held:
                        ticket.resolve(None, "not_leader")
                    self._held.clear()
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
        self._node.step_down(hold_back_s=10 * self._election_timeout)

    # -- snapshots (in a tick) ---------------------------------------------

    def _write_snapshot(self, filename: str, data) -> None:
        # in the snapshot writer's child process (engine.raft.snapshots): it names the live entries
        # the journal holds (compaction keeps them there) and carries the others
        last, prev, cluster = data
        live = self._live_entries()
        in_journal = [index for index in live if self._journal.holds(index)]
        held = set(in_journal)
        snapshot_file.write(filename, last=last, prev=prev, state=self._write_state,
                            cluster=[[n.id, self._id_of(n)] for n in cluster],
                            carried=[index for index in live if index not in held],
                            entry_at=self._carried_entry, in_journal=in_journal)
        if self._after_snapshot is not None:
            self._after_snapshot(last[1], live)

    def _snapshot_written(self, last_index: int, seconds: float) -> None:
        # before pysyncobj drops the entries the snapshot covers from the journal, which keeps
        # those the snapshot names
        if self._unshippable is not None:
            self._unshippable = None
            self._repairs.repaired += 1
            logger.warning("the damaged snapshot is replaced by one written from the state in memory")
        entries = snapshot_file.LiveEntries(self._snapshot_path)
        self._journal.retain(entries.in_journal)
        self._use_snapshot_entries(entries)
        self._snapshot_info = {"index": last_index, "bytes": self._snapshot_path.stat().st_size,
                               "seconds": round(seconds, 4), "count": self._snapshot_info["count"] + 1}

    def _read_snapshot(self, filename: str):
        try:
            header, state, entries = snapshot_file.read(filename)
        except ValueError:
            logger.error("snapshot %s is damaged; not loaded", filename)
            raise
        try:
            self._restore(state)
        except Exception:
            logger.critical("state machine restore raised; this node's state is unusable", exc_info=True)
            raise
        self._journal.retain(entries.in_journal)
        self._use_snapshot_entries(entries)
        nodes = []
        for addr, node_id in header["cluster"]:
            self._ids.setdefault(addr, node_id)
            nodes.append(self._make_node(addr))
        last, prev = tuple(header["last"]), tuple(header["prev"])
        self._drop_entries_before(prev)
        self._snapshot_info = dict(self._snapshot_info, index=last[1], bytes=Path(filename).stat().st_size)
        return last, prev, nodes

    def _drop_entries_before(self, prev: tuple) -> None:
        """A crash between writing a snapshot and compacting the log leaves the
        entries the snapshot covers in front of it. pysyncobj, finding a log
        that does not start with the snapshot's last two entries, clears all
        of it -- with the entries after the snapshot, which this node may have
        acknowledged. Drop only the ones before."""
        log = self._journal
        if len(log) and log[0][1] < prev[1] <= log[-1][1] and log[prev[1] - log[0][1]] == prev:
            log.deleteEntriesTo(prev[1] - log[0][1])

    # -- helpers -----------------------------------------------------------

    def _make_node(self, addr: str) -> AddressNode:
        return AddressNode(addr, raftq_id=self._ids.get(addr, addr))

    def _id_of(self, node) -> str:
        return self._ids.get(node.id) or getattr(node, "raftq_id", None) or node.id

    def _quorum_ok(self, now: float) -> bool:
        node = self._node
        state = node.role()
        if state == LEADER:
            others = node.others()
            lease = self._leader_lease + node.contact_slack()      # a quiet group's answers come further apart
            recent = sum(1 for n in others if now - node.last_heard.get(n.id, 0.0) < lease)
            return recent + 1 > (len(others) + 1) / 2
        leader = node.leader()
        if state == FOLLOWER and leader is not None:
            # A leader whose connection dropped (killed, restarted) is gone for
            # routing at once: requests are held for the election rather than
            # sent to an address that refuses them until the timeout.
            return (now - node.leader_contact < self._election_timeout + node.contact_slack()
                    and node.isNodeConnected(leader))
        return False

    def _cut_off(self) -> bool:
        """Stepped down for want of a majority (CheckQuorum) and heard from no
        majority since: no election this node could win or learn of is under
        way, so a request need not wait for one."""
        node = self._node
        lost_at = node.quorum_lost_at
        if lost_at is None:
            return False
        others = node.others()
        heard = sum(1 for n in others if node.last_heard.get(n.id, 0.0) > lost_at)
        return heard + 1 <= (len(others) + 1) / 2

    def _refusal(self) -> str | None:
        if not self._node.is_leader():
            return "not_leader"
        if not self._quorum_ok(monotonic()):
            return "no_quorum"
        return None

    def _ticket(self, callback, term: int) -> Ticket | None:
        ticket = Ticket(callback, time.monotonic() + self._submit_timeout, term)
        if not self._closed:
            self._tickets.append(ticket)
            return ticket
        ticket.resolve(None, "not_leader")
        return None

    def _admitted(self, callback) -> Ticket | None:
        """A ticket for a call this node can take as leader now; None once the
        callback has been given its refusal."""
        ticket = self._ticket(callback, self.term())
        if ticket is None:
            return None
        refusal = self._refusal()
        if refusal:
            self._later(ticket, refusal)
            return None
        return ticket

    def _later(self, ticket: Ticket, error: str) -> None:
        self._run_on_tick(lambda: ticket.resolve(None, error))

    def _run_on_tick(self, task: Callable[[], None]) -> None:
        self._tasks.append(task)
        self._node.wake()
