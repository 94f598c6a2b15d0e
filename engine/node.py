"""A raftq node's engine: the state machine, replicated, and what the fronts need of it.

It runs in the node's engine process (docs/architecture.md), which serves
it to the front processes through ``engine.link.service``.  One thread:
pysyncobj's ticks run on the engine's asyncio loop (``engine.raft.ticking``),
beside this object's coroutines, so the state machine is mutated (in a
tick's apply) and read (by a coroutine) in turns, and a read never sees half
an entry.  A snapshot is encoded by a child the tick forks, from its copy of
the state between two applies (``engine.raft.snapshots``).  A commit's result
reaches the caller's future at the loop's next turn, after the tick that
applied it.  Receives that wait for a message (long polls) are
``Node.long_polls`` (``engine.long_poll``).

Log time: the leader stamps every command with ``now_ms`` from
``LogClock``, which continues from the last applied log time with this
machine's monotonic clock.  A wall clock that jumps (NTP, a VM resumed, a
faulty node) therefore never makes a lease expire early, and an election
only ever extends leases, never cuts them.  A new leader stamps nothing
but its barrier until the barrier is applied: commands submitted earlier
wait for it (see ``Node.submit``).
"""

import asyncio
import logging
import math
import socket
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path

import cbor2

from raftq.statemachine import StateMachine
from raftq.statemachine.bodies import BodyRef, read_body

from .committer import GroupCommitter
from .config import ClusterConfig, NodeSpec, Peer
from .long_poll import LongPolls, ride_queue
from .outcome import Committed, CommitError
from .raft.consensus import Consensus
from .relocation import PLAN_FILE, Relocator
from .scrubber import Scrubber
from .storage.damage import DamagedRecord

logger = logging.getLogger(__name__)

TICK_INTERVAL_S = 0.02
CHECKPOINTS_KEPT = 64
# A leader refuses a command before the log when no majority answered it
# within the leader lease (0.2 s).  Under load that is often a stall, not a
# partition: the followers' answers wait behind an fsync or a busy core and
# are read a few milliseconds later.  Nothing of the command was written, so
# it is proposed again once the lease holds, for as long as the fronts hold a
# request in an election (api/leader.py ELECTION_HOLD_S); a leader cut off
# for real still refuses, after the hold.
LEASE_HOLD_S = 0.8
LEASE_RECHECK_S = 0.01
# How long an answer waits for a replica's intact copy of a body whose record is damaged here:
# one round trip normally, a few asks if a replica was away (engine.raft.repair); past it the
# command is answered `damaged` (503, retry: the leader hands its lead to a replica that can read it).
REPAIR_WAIT_S = 2.0


def _messages(result) -> list[dict]:
    """The messages a result carries (a receive's, a browse's), none for any other."""
    messages = result.get("messages") if isinstance(result, dict) else None
    return [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []


class LogClock:
    """The leader's source of `now_ms`: log time, continued with a monotonic clock.

    The clock is settled for one term at a time, once the new leader's
    barrier entry is applied: only then is the applied log time known to be
    the cluster's latest, and the clock continues from 1 ms after it.  Before that the
    leader stamps nothing but the barrier itself, with the applied log time
    (time stands still).  Keying on the term at every stamp means a node
    deposed and re-elected in between never reuses an old base.  The wall
    clock is read once in a cluster's life: when the first barrier of a
    brand-new cluster (nothing with a time was ever applied) is applied, so
    no lease, TTL, delay or dedup window is ever computed from log time 0.
    """

    def __init__(self, machine: StateMachine):
        self._machine = machine
        self._term = None
        self._base = 0
        self._mono = 0.0

    def settle(self, term: int) -> None:
        applied = self._machine.clock
        # One millisecond on from the applied log time, so that every moment of the new term comes
        # after every moment of the last: the wall time of log time (statemachine/wall.py) changes
        # with the term, and a moment shown must belong to one term. The election took longer.
        self._base = applied + 1 if applied > 0 else wall_ms()
        self._mono = time.monotonic()
        self._term = term

    def settled_for(self, term: int) -> bool:
        return self._term == term

    def barrier_ms(self) -> int:
        """The stamp of a barrier: the applied log time, which it cannot move."""
        return self._machine.clock

    def now_ms(self) -> int:
        """Log time now; only for the term the clock is settled for."""
        return max(self._machine.clock, self._base + int((time.monotonic() - self._mono) * 1000))


def wall_ms() -> int:
    """This machine's wall clock, for the wall time of log time only (statemachine/wall.py)."""
    return int(time.time() * 1000)


NOW_MS_KEY = cbor2.dumps("now_ms")


def stamped(encoded: bytes, now_ms: int) -> bytes:
    """The encoded command (a CBOR map without now_ms) with now_ms added.

    A command of up to 22 fields carries its field count in its first byte,
    so the stamp is spliced in without decoding what a front encoded.
    """
    head = encoded[0]
    if 0xa0 <= head <= 0xb6:
        return bytes((head + 1,)) + NOW_MS_KEY + cbor2.dumps(now_ms) + encoded[1:]
    command = cbor2.loads(encoded)
    command["now_ms"] = now_ms
    return cbor2.dumps(command)


def group_data_dir(data_dir: str | Path, group: int) -> Path:
    """Where a node keeps `group`'s Raft log and snapshot: group 0 where a node
    without groups kept its one group (so such a node restarts unchanged),
    group g > 0 in group-<g>/."""
    return Path(data_dir) if group == 0 else Path(data_dir) / f"group-{group}"


class Node:
    def __init__(self, cluster: ClusterConfig, node_id: str, data_dir: str | Path, *,
                 auto_create: bool = True, group: int = 0, members: tuple[str, ...] | None = None,
                 handoff: socket.socket | None = None, scrub_pass_hours: float = 0.0):
        """One Raft group's engine on this node: `group`'s state in
        `group_data_dir(data_dir, group)`, its voters `members` (None: every
        node of the config), its accepted Raft connections handed over on
        `handoff` by the node's supervisor (None: it binds its Raft address);
        every live entry read back and checked once per `scrub_pass_hours`
        (``engine.scrubber``; 0: never)."""
        self.cluster = cluster
        self.spec: NodeSpec = cluster.node(node_id)
        self.id = node_id
        self.group = group
        self.data_dir = group_data_dir(data_dir, group)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.auto_create = auto_create
        self.machine = StateMachine(group, cluster.groups)
        self.clock = LogClock(self.machine)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.long_polls = LongPolls(self.machine, self.submit)
        self._checkpoints: dict[str, str] = {}
        self._was_leader = False
        self.times_became_leader = 0
        self.entries_applied = 0
        self.committer = GroupCommitter(self._propose, before_packing=self._let_receives_ride)
        self.relocator = Relocator(self, self.data_dir / "raft" / PLAN_FILE)
        self._wall_ticks_allowed = False     # until the first front finds every node knows them
        self.consensus = Consensus(
            self_peer=self.spec.peer(),
            peers=[peer for peer in cluster.peers_for(node_id) if members is None or peer.id in members],
            data_dir=self.data_dir / "raft", group=group, handoff=handoff,
            apply=self._apply_entry, write_snapshot=self.machine.write_snapshot, restore=self._restore,
            live_entries=self.machine.live_entry_indexes, after_snapshot=self.relocator.plan,
            secret=cluster.secret,
            on_role_change=self._on_role_change, max_entry_bytes=self.committer.max_entry_bytes)
        self.scrubber = Scrubber(self.consensus, scrub_pass_hours) if scrub_pass_hours > 0 else None
        self._ticker: asyncio.Task | None = None
        self._ticker_wake = asyncio.Event()
        # The log time of the timer the tick loop sleeps until (inf: none), None while it does
        # not sleep: a command wakes it only for a timer sooner than that (_wake_for_timer).
        self._tick_sleep_until_ms: float | None = None
        # Commands that arrived before the clock settled for the term they
        # were submitted in: future -> that term.
        self._settle_waiters: dict[asyncio.Future, int] = {}
        self._view_watchers: list = []
        self._principals_version_seen = 0

    # ---- life cycle ---------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.long_polls.start(self._loop)
        self.consensus.start(self._loop)
        self._ticker = asyncio.create_task(self._tick_loop())
        if self.scrubber is not None:
            self.scrubber.start()
        self.relocator.start()

    async def hand_over(self) -> None:
        """Before shutting down: let another node lead, so clients move on at once."""
        if self._ticker:
            self._ticker.cancel()
        if self.scrubber is not None:
            self.scrubber.stop()
        self.relocator.stop()
        if self.is_leader():
            moved = await self.transfer_leadership(2.0)
            logger.info("leadership %s before shutdown", "handed over" if moved else "given up")
        self.consensus.retire()
        self.committer.fail_pending("shutting_down")
        self._release_settle_waiters(None)

    async def close(self) -> None:
        if self.scrubber is not None:
            self.scrubber.stop()
        await self.consensus.close()

    # ---- the replicated state machine (in a tick) -------------------------------------
    def _apply_entry(self, entry: bytes) -> tuple[int, list]:
        index = self.consensus.applying_index()
        results = self.machine.apply_entry(entry, index)
        self.entries_applied += 1
        for result in results:
            if isinstance(result, dict) and "checkpoint" in result:
                self._checkpoints[result["checkpoint"]] = result["digest"]
                while len(self._checkpoints) > CHECKPOINTS_KEPT:
                    del self._checkpoints[next(iter(self._checkpoints))]
            elif isinstance(result, dict) and result.get("released"):
                # the fronts drop the placements they cached now, not at the view's next recheck
                self._loop.call_soon(self._view_changed)
        if self.group == 0 and self.machine.principals_version() != self._principals_version_seen:
            # the fronts read the principals again now (a revocation), not at the view's next recheck
            self._principals_version_seen = self.machine.principals_version()
            self._loop.call_soon(self._view_changed)
        self.long_polls.entry_applied()
        self._wake_for_timer()
        return index, results

    def _wake_for_timer(self) -> None:
        """Once an entry is applied: wake a leader's tick loop if the entry set a timer sooner
        than the one it sleeps until. Waking it after every command of its own cost a leader a
        round of the loop per put (a tenth of a lone put's CPU in its engine), to find most
        often that nothing was due; and every entry is applied here, whoever queued its commands."""
        until = self._tick_sleep_until_ms
        if until is None:
            return    # a follower's, or not asleep: its next round reads the timers afresh
        due = self.read("next_timer")
        if due is not None and due < until:
            self._ticker_wake.set()

    def _restore(self, data: bytes) -> None:
        self.machine.restore(data)

    def _on_role_change(self) -> None:
        self._loop.call_soon(self._role_changed)   # once the tick is over

    def _view_changed(self) -> None:
        for watcher in self._view_watchers:
            watcher()

    def _role_changed(self) -> None:
        self._view_changed()
        leader = self.is_leader()
        if leader and not self._was_leader:
            self.times_became_leader += 1
            logger.info("became leader at term %s", self.consensus.term())
            self._ticker_wake.set()   # the barrier goes out now, not at the next tick
        elif not leader and self._was_leader:
            logger.info("stepped down; leader is now %s", self.consensus.leader_id())
            self.committer.fail_pending("not_leader")   # none of it was proposed
            self._release_settle_waiters(None)
        self._was_leader = leader

    # ---- writes -------------------------------------------------------------------------
    def _propose(self, entry: bytes, term: int, callback) -> None:
        def answer(applied, err) -> None:
            # Bodies are read where a result is answered, in the tick that applied it: by the
            # node that proposed it, whatever its role by now. A leader deposed in that very
            # tick (paused, then back) still answers its term's entries, and read as a leader's
            # results alone, a receive it answered then carried a body reference, not the body.
            if err is None and isinstance(applied, tuple):
                results = applied[1]
                for slot, result in enumerate(results):
                    results[slot] = self._answer(result)
            callback(applied, err)
        self.consensus.propose(entry, answer, term=term)

    def _answer(self, result):
        """What answers a command: its result with its bodies read; if a body's record is damaged,
        a task that reads it from a replica's copy; if reading raised otherwise, the error. Never
        an exception out of the tick: the command's proposer (group commit's slot in flight with
        it) would never be answered."""
        try:
            return self._with_bodies(result)
        except DamagedRecord:
            return self._loop.create_task(self._with_repaired_bodies(result))
        except Exception:
            logger.exception("reading the bodies of a command's result failed")
            return CommitError("internal")

    async def submit(self, command: dict) -> Committed:
        """Stamp one command with log time and apply it through the log (group
        commit, Raft): its result and its entry's index, or CommitError."""
        return await self.submit_encoded(cbor2.dumps(command), ride_queue(command))

    async def submit_encoded(self, encoded: bytes, ride: str | None = None) -> Committed:
        """``submit`` of a command a front encoded (CBOR, without ``now_ms``); `ride`: the
        queue whose waiting receives it takes along in its entry (``ride_queue``).

        A leader whose clock is not settled for its term (its barrier is not
        applied yet) holds the command until it is: stamped earlier it could
        only carry the last applied log time, which lags real time by the
        election, and is 0 in a brand-new cluster.
        """
        term = self.consensus.term()
        await self._settled(term)
        return await self._committed(self._queue(encoded, ride, term), encoded, term)

    def submit_queued(self, encoded: bytes, ride: str | None = None) -> Awaitable[Committed]:
        """``submit_encoded``, the command queued for the next entry now when this leader's clock
        is settled for its term (not in the first step of whoever awaits it, a loop turn later,
        behind the entry that would otherwise leave without it)."""
        term = self.consensus.term()
        if not self.clock.settled_for(term):
            return self.submit_encoded(encoded, ride)
        return self._committed(self._queue(encoded, ride, term), encoded, term)

    def _queue(self, encoded: bytes, ride: str | None, term: int) -> asyncio.Future:
        queued = self.committer.enqueue(stamped(encoded, self.clock.now_ms()), term)
        if ride is not None and self.long_polls.waits_on(ride):
            self.long_polls.put_queued(ride, term)
        return queued

    async def _committed(self, queued: asyncio.Future, encoded: bytes, term: int) -> Committed:
        """The queued command's outcome; queued once more if it was refused while this leader's
        lease lapsed and the lease came back for the same term."""
        try:
            return await queued
        except CommitError as exc:
            if exc.code != "no_quorum" or not await self._lease_regained(term):
                raise
            return await self.committer.enqueue(stamped(encoded, self.clock.now_ms()), term)

    def _let_receives_ride(self) -> None:
        """Before group commit packs an entry: the receives waiting on the queues of the
        puts queued since (``LongPolls.ride``), queued behind them for the puts' term, so
        that they lease their messages in the same Raft round."""
        self.long_polls.ride(self._queue_receive, self.consensus.term())

    def allow_wall_ticks(self, allowed: bool) -> None:
        """Whether every node runs a release that applies a tick's ``wall_ms`` (api/features.py
        asks them): an older one ignores it, and its replica would lack the wall time of log time
        the others keep. Once allowed, a leader records the wall time of its log time at once."""
        opened = allowed and not self._wall_ticks_allowed
        self._wall_ticks_allowed = allowed
        term = self.consensus.term()
        if opened and self.is_leader() and self.clock.settled_for(term):
            self._queue_wall_tick(term)

    def _ticks_carry_wall(self) -> bool:
        # A wall time recorded means a tick with one was committed: by a cluster every node of
        # which ran this release then, or by a brand-new one. From then on every tick carries
        # one, also at once after a restart of every node, before the gate has asked the others
        # (a node of an older release joining after that is a downgrade: docs/operations.md).
        return self._wall_ticks_allowed or bool(self.machine.wall.starts)

    def _queue_wall_tick(self, term: int) -> None:
        """A tick with this leader's wall clock, read with its log time (statemachine/wall.py)."""
        queued = self.committer.enqueue(stamped(cbor2.dumps({"op": "tick", "wall_ms": wall_ms()}),
                                                self.clock.now_ms()), term)
        queued.add_done_callback(lambda done: done.exception())    # a lost lead fails the term's commands too

    def _queue_receive(self, receive: dict, term: int) -> asyncio.Future:
        return self.committer.enqueue(stamped(cbor2.dumps(receive), self.clock.now_ms()), term)

    async def _lease_regained(self, term: int) -> bool:
        """Whether this node, still leading `term`, hears from a majority again
        within LEASE_HOLD_S (see there)."""
        deadline = time.monotonic() + LEASE_HOLD_S
        while time.monotonic() < deadline:
            role, _, now_term, quorum_ok, cut_off = self.consensus.route()
            if role != "leader" or now_term != term or cut_off:
                return False
            if quorum_ok:
                return True
            await asyncio.sleep(LEASE_RECHECK_S)
        return False

    async def settled(self) -> None:
        """Return once this leader has applied the barrier of its current term.

        Only from then on does its state hold every write that an earlier
        leader acknowledged (committed entries of older terms are applied
        before the barrier), so leader reads wait for it as writes do.
        CommitError when this node does not lead.
        """
        await self._settled(self.consensus.term())

    async def confirm_read(self) -> None:
        """Return once a leader read arriving now may be answered from this
        node's state: it still led when the read arrived, and has applied
        every write acknowledged before (``Consensus.confirm_read``).
        CommitError otherwise."""
        await self._through_consensus(self.consensus.confirm_read)

    async def _settled(self, term: int) -> None:
        if self.clock.settled_for(term):
            return
        if not self.is_leader():
            raise CommitError("not_leader")
        waiter = self._loop.create_future()
        self._settle_waiters[waiter] = term
        waiter.add_done_callback(lambda f: self._settle_waiters.pop(f, None))
        self._ticker_wake.set()
        await waiter

    def _release_settle_waiters(self, settled_term: int | None) -> None:
        """Let the commands held for `settled_term` go; the others lost their leader."""
        for waiter, term in list(self._settle_waiters.items()):
            if waiter.done():
                continue
            if term == settled_term:
                waiter.set_result(None)
            else:
                waiter.set_exception(CommitError("not_leader"))   # held before the log

    async def checkpoint(self) -> tuple[str, str]:
        token = uuid.uuid4().hex
        committed = await self.submit({"op": "checkpoint", "token": token})
        return token, committed.result["digest"]

    def checkpoint_digest(self, token: str) -> str | None:
        return self._checkpoints.get(token)

    async def _tick_loop(self) -> None:
        """While leading: settle the log clock for the term, then fire due timers
        through the log so that every replica sees them.

        It sleeps until something can be due — a follower until it leads, a
        leader until its next timer or until a command of its own set a sooner
        one (``_wake_for_timer``) — so an idle cluster wakes for heartbeats
        only; and however busy, it makes at most one round per TICK_INTERVAL_S.
        """
        while True:
            await self._sleep_until_due()
            self._ticker_wake.clear()
            if not self.is_leader():
                continue
            term = self.consensus.term()
            try:
                if not self.clock.settled_for(term):
                    # The barrier: once applied, the applied log time is the latest.
                    await self.committer.enqueue(cbor2.dumps({"op": "tick", "now_ms": self.clock.barrier_ms()}), term)
                    if self.is_leader() and self.consensus.term() == term:
                        brand_new = self.machine.clock == 0
                        self.clock.settle(term)
                        if brand_new or self._ticks_carry_wall():
                            # ahead of every command of the term: the wall time of its log time
                            self._queue_wall_tick(term)
                        self._release_settle_waiters(term)
                    continue
                due = self.read("next_timer")
                if due is not None and due <= self.clock.now_ms():
                    await self.submit({"op": "tick", "wall_ms": wall_ms()} if self._ticks_carry_wall() else {"op": "tick"})
            except CommitError:
                pass   # lost leadership or quorum; the next leader ticks
            except Exception:
                # Without this loop a leader never settles its clock and every
                # write waits for a barrier that is never sent: log, go on.
                logger.exception("tick loop round failed")
            await asyncio.sleep(TICK_INTERVAL_S)

    async def _sleep_until_due(self) -> None:
        timeout, until = None, math.inf
        if self.is_leader():
            if not self.clock.settled_for(self.consensus.term()):
                return
            due = self.read("next_timer")
            if due is not None:
                until = due
                timeout = max(0.0, (due - self.clock.now_ms()) / 1000)
        self._tick_sleep_until_ms = until if self.is_leader() else None
        try:
            await asyncio.wait_for(self._ticker_wake.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._tick_sleep_until_ms = None

    # ---- reads ----------------------------------------------------------------------------
    def read(self, query: str, *args):
        return self._with_bodies(self.machine.read(query, *args))

    async def applied_read(self, query: str, *args) -> tuple[object, int]:
        """A read and the log index it reflects."""
        result, index = self.machine.read(query, *args), self.consensus.applied_index()
        try:
            return self._with_bodies(result), index
        except DamagedRecord:
            return await self._with_repaired_bodies(result), index

    def _with_bodies(self, result):
        """`result`, each body reference among its messages replaced by the body, read from the log
        entry it names (the state machine keeps references, statemachine/bodies.py); DamagedRecord
        if an entry's record fails its checks (those before it are read)."""
        for message in _messages(result):
            body = message.get("body")
            if isinstance(body, BodyRef):
                message["body"] = read_body(body, self.consensus.entry_at(body.index))
        return result

    async def _with_repaired_bodies(self, result):
        """``_with_bodies``, the bodies of damaged records read from a replica's intact copy (which is
        written back meanwhile), every entry asked for at once; CommitError ``damaged`` if a copy
        does not come within REPAIR_WAIT_S."""
        refs = [(message, message["body"]) for message in _messages(result) if isinstance(message.get("body"), BodyRef)]
        indexes = sorted({ref.index for _, ref in refs})
        entries = dict(zip(indexes, await asyncio.gather(
            *(self.consensus.intact_entry(index, REPAIR_WAIT_S) for index in indexes))))
        missing = [index for index, entry in entries.items() if entry is None]
        if missing:
            logger.error("log entries %s: no replica's intact copy came in %.1f s; the command is answered "
                         "'damaged'", missing, REPAIR_WAIT_S)
            raise CommitError("damaged")
        for message, ref in refs:
            message["body"] = read_body(ref, entries[ref.index])
        return result

    # ---- cluster ------------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.consensus.route()[0] == "leader"

    def view(self) -> dict:
        """What a front needs to route a request: role, leader, term, quorum,
        whether this node is cut off from a majority, every member's HTTP
        address, and (group 0's, with several groups) each other group's
        recorded members (``engine.members``) and how many times the
        catalog released names (a front's cached placements may be stale);
        group 0's, the version of the principals it keeps (``api.principals``);
        and the size of this node's snapshot of the group, which its disk
        alarm's watermark counts (``api.disk``)."""
        role, leader, term, quorum_ok, cut_off = self.consensus.route()
        addresses = {spec.id: spec.http for spec in self.cluster.nodes}
        addresses.update({node_id: m["http_addr"] for node_id, m in self.machine.members.items()})
        view = {"id": self.id, "role": role, "leader_id": leader, "term": term, "quorum_ok": quorum_ok,
                "cut_off": cut_off, "http": addresses, "snapshot_bytes": self.consensus.snapshot_bytes()}
        if self.group == 0:
            view["principals_version"] = self.machine.principals_version()
        if self.group == 0 and self.cluster.groups > 1:
            view["group_members"] = self.machine.group_members()
            view["catalog_releases"] = self.machine.catalog.releases
        return view

    def watch_view(self, changed) -> None:
        """Call `changed()` on the loop whenever the role, leader or term changes."""
        self._view_watchers.append(changed)

    def stats(self) -> dict:
        damaged, repaired = self.consensus.damage_counts()
        late_ticks, late_seconds = self.consensus.late_ticks()
        scrubber = self.scrubber
        return {"times_became_leader": self.times_became_leader, "entries_applied": self.entries_applied,
                "damaged_records": damaged, "repaired_records": repaired,
                "late_ticks": late_ticks, "late_ticks_seconds": late_seconds,
                "scrub_passes": scrubber.passes if scrubber else 0,
                "scrubbed_bytes": scrubber.checked_bytes if scrubber else 0,
                "long_polls_waiting": self.long_polls.waiting(),
                "receives_with_a_put": self.long_polls.receives_with_a_put,
                "relocations": self.relocator.commands, "relocated_bodies": self.relocator.bodies,
                "relocated_bytes": self.relocator.bytes,
                "packing": self.committer.packing.as_dict()}

    def status(self) -> dict:
        self._learn_ids()
        return self.consensus.status()

    def _learn_ids(self) -> None:
        """Name the voters added by the group's earlier leaders (``set_member`` records their
        addresses in this group's log too), so that status and removals use their ids."""
        ids = {member["raft_addr"]: node_id for node_id, member in self.machine.members.items()}
        self.consensus.learn_ids(ids)

    def http_addr(self, node_id: str | None) -> str | None:
        if node_id is None:
            return None
        member = self.machine.members.get(node_id)
        if member:
            return member["http_addr"]
        for spec in self.cluster.nodes:
            if spec.id == node_id:
                return spec.http
        return None

    def members(self) -> list[dict]:
        """The voters as Raft knows them now, with their HTTP addresses."""
        ids = [self.id, *self.status()["peers"]]
        out = []
        for node_id in ids:
            member = self.machine.members.get(node_id)
            spec = next((n for n in self.cluster.nodes if n.id == node_id), None)
            raft = member["raft_addr"] if member else spec.raft if spec else node_id
            out.append({"id": node_id, "raft_addr": raft, "http_addr": self.http_addr(node_id)})
        return out

    async def replicated_everywhere(self, index: int, timeout: float) -> list[str]:
        """Wait until every connected voter's log holds `index` (durability=all);
        the voters still without it after `timeout` (none: all reached)."""
        deadline = time.monotonic() + timeout
        while True:
            peers = self.consensus.status()["peers"]
            lagging = sorted(i for i, p in peers.items() if p["connected"] and p["match_index"] < index)
            if not lagging or time.monotonic() >= deadline:
                return lagging
            await asyncio.sleep(0.002)

    async def transfer_leadership(self, timeout: float, to: str | None = None, *, step_down: bool = True) -> bool:
        """Hand the lead to `to` (or the most caught-up follower); True once
        another node leads. If none does in time, step down too, unless told
        not to (``Consensus.transfer_leadership``)."""
        return await self.consensus.transfer_leadership(timeout, to, step_down=step_down)

    async def _through_consensus(self, call, *args) -> None:
        """Call ``consensus.call(*args, callback)`` and wait for its callback."""
        future = self._loop.create_future()

        def done(result, err):
            if future.done():
                return
            if err:
                future.set_exception(CommitError(err))
            else:
                future.set_result(result)
        call(*args, done)
        await future

    async def add_node(self, node_id: str, raft_addr: str, http_addr: str) -> None:
        await self.submit({"op": "set_member", "id": node_id, "raft_addr": raft_addr,
                           "http_addr": http_addr})
        await self._through_consensus(self.consensus.add_node, Peer(id=node_id, raft_addr=raft_addr))

    async def remove_node(self, node_id: str) -> None:
        self._learn_ids()
        await self._through_consensus(self.consensus.remove_node, node_id)
        result = (await self.submit({"op": "remove_member", "id": node_id})).result
        if "error" in result and result["error"] != "not_found":
            raise CommitError(result["error"])
