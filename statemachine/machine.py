"""The replicated state machine: every queue of a raftq cluster.

Theory of operation
-------------------
Raft hands every replica the same log; this module turns that log into the
same queues everywhere.  Its boundary is hashicorp/raft's FSM:

- ``apply(command) -> result`` — one command (a plain dict, see
  ``validation.py`` for every op and its fields).  ``apply_entry(bytes)``
  applies one log entry, a CBOR list of commands packed by group commit,
  and returns one result per command.
- ``snapshot() -> bytes`` / ``restore(bytes)`` — the whole state as
  versioned CBOR, so log compaction and catch-up cost the stored data, not
  the history.  ``state_digest()`` hashes it to compare replicas.
- ``read(name, *args)`` — the read-only queries (``list_queues``,
  ``queue_info``, ``browse``, ...) that never change state, so a node may
  answer them from its local copy.

Every op, command or read, is one row of ``OPS`` at the end of this module:
its validator (``validation.py``), its handler, and whether it is a read.
Adding an op is a handler, a validator and that row (then its HTTP route).
- staged writes (``stage``, ``stage_commit``, ``stage_abort``,
  ``drop_producer``; ``staging.py``): rows parked invisibly, published by one
  commit per (producer, batch), never twice.
- a group's pause and rate limit (``patch_group``, ``group.py``) and its
  position (``seek_group``, and ``add_group``'s ``start``: ``retention.py``).
  What a release adds here is written only once every node runs it
  (``feature_needed``; api/features.py).

Rules that keep replicas identical:

- no clock: each command carries ``now_ms`` stamped by the leader, and the
  machine's clock is ``max(clock, now_ms)`` — log time never goes back, so a
  machine whose wall clock jumps cannot expire a lease early;
- no exceptions: a refusal is a result value (``results.py``); a command that
  is malformed is refused whole, before anything changes;
- timers fire lazily: a command that touches a queue first fires that
  queue's due timers; ``tick`` (sent by the leader while timers are pending)
  fires those of every queue that has one due, which the due index
  (``due.py``), kept as commands change queues, names without visiting the
  others;
- only ordered iteration: dicts keep insertion order, which is the same on
  every replica because it comes from the log;
- no node option: a cap that depends on the state travels in the command
  (``max_queues``, ``add_group``'s ``max_groups``, a stage's ``caps``,
  ``dedup_max_bytes``, ``max_stored_bytes``), filled in by the
  leader, so replicas started with other options still apply alike.

Every command that stores messages (``put``, ``tx``, ``stage_commit``) also
passes ``_room_for_bytes``: the bytes the group's queues store (summed as
they change, ``rows.Tally``) may grow past ``max_stored_bytes`` (the
leader's share of ``--max-stored-bytes``) by no put; past it, a put that
would grow them is refused whole (``insufficient_storage``). Moves inside
the group (dead-lettering, redrive) are never refused by it.

Every command that creates queues (``put``, ``tx``, ``stage_commit``,
``create_queue``) passes one check, ``_room_for_queues``: the cluster's
``max_queues``, and at most MAX_NEW_QUEUES_PER_ENTRY new queues per log
entry, so that applying one entry stays far below the election timeout.

Raft groups (issue 24): a cluster runs ``group_count`` groups, each with its
own machine, which knows its ``group_id``.  Group 0's machine also holds the
catalog, queue name -> group (``catalog.py``: ``assign``, and the reads
``catalog_lookup``, ``list_catalog`` and ``catalog_usage``), the principals
(``principals.py``: ``principal_add``, ``principal_update``, ``principal_remove``, and the
SQS keys of a role, ``sqs_key_add``, ``sqs_key_remove``; the reads ``list_principals``,
``principals_version`` and ``principal_events``) and each other group's members
(``record_members``, ``replica_move``, ``replica_moved``, ``node_leaving``; the read
``group_members``).  With more than one group, every command
whose op may create a queue (the ``creates_queues`` column of ``OPS``; a
queue config may name a dead-letter queue, which a later move creates) must
carry ``raft_group`` equal to the machine's own id, else it is refused
``wrong_group`` whole, on every replica alike: a front that routed by a stale
or wrong view can never create one queue in two groups.

Principals (issue 52): a command of a principal carries its name and quotas
(``quotas.py``): the queue it creates is its own, and the queues it would own
and the bytes its queues would store are held to its quotas (``quota_exceeded``,
nothing changed). What only the state names, a redrive's sources and a stage
commit's stages, is held to the patterns the command carries
(``allowed_queues``): a redrive moves only the dead letters of the sources it
may, a stage commit into a queue it may not put to is refused ``forbidden``.
"""

import gc
import hashlib
import io
from typing import BinaryIO, Callable, NamedTuple

import cbor2

from .bodies import CARRIES_BODIES, BodyFinder, BodyRef
from .catalog import Catalog, Members
from .principals import Principals
from .quotas import Quotas
from .columns import encode_column
from .due import DueIndex
from .queue import Queue
from .rows import Tally
from .redrive import redrive
from .release import NameRelease
from .results import (BAD_REQUEST, CONFLICT, FORBIDDEN, INSUFFICIENT_STORAGE, INTERNAL, LIMIT_REACHED,
                      NOT_FOUND, STALE_RECEIPT, WRONG_GROUP, error)
from .rules import any_pattern_matches
from .staging import DEFAULT_STAGE_TTL_MS, MAX_BATCH_STEP, Staging
from .wall import WallTimes
from . import validation as v
from .validation import full_config

SNAPSHOT_FORMAT = "raftq-statemachine"
SNAPSHOT_VERSION = 18
# Version 17 is version 18 with the SQS keys group 0 keeps as they were before principals
# (``credentials``: each restores as the principal of its role that sqs_key_add makes now),
# and without the queues' owners and the quotas commands carried (quotas.py): none owned.
# Version 16 is version 17 without messages' priorities, retained messages, and groups'
# pauses and rate limits (issue 51): it restores with every message of priority 0, none
# retained, no group paused or limited.
# Version 15 is version 16 without the wall time of log time (wall.py): it restores with none
# recorded, each moment shown as its log time until a leader's tick records one.
# Version 14 is version 15 without the SQS keys group 0 keeps (credentials.py): it restores
# with none.
# Version 13 is version 14 without the catalog's last release of each group
# taken in turn (catalog.py): written before any was, it restores with none.
# Version 12 is version 13 without each group's names leaving the catalog
# (release.py) and the catalog's count of releases: it restores with none
# deleted, retiring, fenced or released.
# Version 11 is version 12 whose staged messages all hold their bodies: a
# staged body is a reference into its stage entry from 12 on (staging.py).
# Version 10 is version 11 without the members recorded for each group
# (catalog.py's Members): it restores with none recorded.
# Version 9 is version 10 without body references: every stored body is in
# the snapshot (statemachine/rows.py, bodies.py).
# Version 8 is version 9 with each queue's messages as one list per field, not
# their columns (statemachine/rows.py), and without the group's id, the group
# count and the catalog: a snapshot of a cluster of one group, which restores
# as group 0 of 1. Version 7 is version 8 with each queue's dedup window as
# its ids, not their
# hashes (statemachine/dedup.py); version 6 is version 7 without the time of
# each message's first delivery and without ordering keys,
# version 5 also without staged writes, version 4 also without redrive:
# a node upgraded in place restores any of them.
READABLE_SNAPSHOT_VERSIONS = (4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18)
# Making a queue costs more than a put into one (its default group holds
# three sorted containers): 10 000 in one entry held the apply past the
# election timeout (issue 21). 500 cost about as much as the widest put of
# 10 000 messages (bench/widest_entry.py).
MAX_NEW_QUEUES_PER_ENTRY = 500


def encode_entry(commands: list) -> bytes:
    """One log entry: a CBOR list of commands."""
    return cbor2.dumps(commands)


def decode_entry(entry: bytes) -> list:
    return cbor2.loads(entry)


class StateMachine:
    def __init__(self, group_id: int = 0, group_count: int = 1):
        if not 0 <= group_id < group_count:
            raise ValueError(f"group {group_id} is not one of {group_count} groups")
        self.group_id = group_id
        self.group_count = group_count
        self.catalog = Catalog(group_count)   # only group 0's is ever filled
        self.recorded_members = Members(group_count)   # group 0's alone, like the catalog
        self.principals = Principals()        # group 0's alone, like the catalog
        self.quotas = Quotas()                # who owns each queue (and catalog name), quotas carried
        self.release = NameRelease(group_id)  # the names of queues deleted here leaving the catalog
        self.clock = 0
        self.wall = WallTimes()               # the wall time of log time, for what is shown (wall.py)
        self.incarnations = 0                 # queues ever created: names each one's receipts
        self.queues: dict[str, Queue] = {}
        self.due = DueIndex()                 # derived from the queues: not in snapshots
        self.stored = Tally()                 # the bytes the queues store (derived, like due)
        self.members: dict[str, dict] = {}   # node id -> {"raft_addr", "http_addr"}
        self.staging = Staging()
        self.queues_left_in_entry = MAX_NEW_QUEUES_PER_ENTRY   # (not state: reset by each entry)
        self.entry_index: int | None = None   # the log index of the entry being applied, when known
        self.acting: str | None = None        # the principal of the command being applied (not state)

    # ---- applying the log -----------------------------------------------------
    def apply_entry(self, entry: bytes, index: int | None = None) -> list:
        """Apply the log entry at `index`. With the index, the bodies its puts store are kept as
        references into the entry (bodies.py), which results then carry in place of bodies; without
        it, as the bodies themselves."""
        try:
            commands = decode_entry(entry)
        except Exception as exc:   # a corrupt entry is refused the same way everywhere
            return [error(BAD_REQUEST, f"log entry is not CBOR: {exc}")]
        if not isinstance(commands, list):
            return [error(BAD_REQUEST, "log entry is not a list of commands")]
        self.queues_left_in_entry = MAX_NEW_QUEUES_PER_ENTRY
        self.entry_index = index
        finder = None if index is None else BodyFinder(entry, index)
        return [self._apply_one(cmd, finder) for cmd in commands]

    def apply(self, cmd, index: int | None = None) -> dict:
        """One command, as if it were the entry at `index` on its own (its bodies kept as they are)."""
        self.queues_left_in_entry = MAX_NEW_QUEUES_PER_ENTRY
        self.entry_index = index
        return self._apply_one(cmd, None)

    def _apply_one(self, cmd, finder) -> dict:
        problem = check_command(cmd)
        if problem:
            return problem
        problem = self._check_owner(cmd)
        if problem:
            return problem
        if finder is not None and cmd["op"] in CARRIES_BODIES:
            finder.refer(cmd)
        if cmd["now_ms"] > self.clock:
            self.clock = cmd["now_ms"]
        self.acting = cmd.get("principal")
        try:
            result = OPS[cmd["op"]].handler(self, cmd)
        except Exception as exc:  # a bug: same state + same command fail alike on every replica
            return error(INTERNAL, f"{type(exc).__name__}: {exc}")
        if "error" not in result:
            self.quotas.note(cmd)
        return result

    def _check_owner(self, cmd):
        """None unless the command may create a queue and is not stamped for this group."""
        if self.group_count > 1 and OPS[cmd["op"]].creates_queues and cmd.get("raft_group") != self.group_id:
            return error(WRONG_GROUP, f"this is group {self.group_id}; the command was routed for group "
                                      f"{cmd.get('raft_group')}: ask the catalog again (GET /v1/cluster/routing)",
                         group=self.group_id)
        return None

    def _touch(self, name: str):
        """The queue with its due timers fired, or None."""
        queue = self.queues.get(name)
        if queue is not None:
            self._advance(queue)
            self._dead_letter(queue)
        return queue

    def _advance(self, queue: Queue) -> None:
        """Fire the queue's due timers. A command changes a queue only after this (or
        creates it), so here the due index learns which queues to ask again."""
        queue.advance(self.clock)
        self.due.note(queue)

    def _new_queue(self, name: str, config: dict, owner: str | None = None) -> Queue:
        """A new queue of `owner` (by default the command's principal)."""
        self.quotas.queues.own(name, owner or self.acting)
        self.release.note_created(name)
        self.incarnations += 1
        self.queues_left_in_entry -= 1
        queue = self.queues[name] = Queue(name, config, self.incarnations, self.stored)
        self.due.note(queue)
        return queue

    def _missing(self, name: str) -> dict:
        """not_found; with several groups, with this group's fence, so that a router whose view
        of the catalog is older asks again instead (the queue may have been made elsewhere)."""
        if self.group_count == 1:
            return error(NOT_FOUND, f"queue {name!r} does not exist")
        return error(NOT_FOUND, f"queue {name!r} does not exist", queue=name, fence=self.release.fence)

    def _room_for_queues(self, names, cmd):
        """None when the command may create those of `names` that are missing; else limit_reached."""
        new = [name for name in dict.fromkeys(names) if name not in self.queues]
        if not new:
            return None
        problem = self._fenced(new, cmd)
        if problem:
            return problem
        if len(new) > self.queues_left_in_entry:
            return error(LIMIT_REACHED, f"this would create {len(new)} queues in one log entry, which creates "
                                        f"at most {MAX_NEW_QUEUES_PER_ENTRY}: create them in smaller requests")
        if self.group_count == 1:   # with several, group 0's catalog counts a principal's names (_assign)
            problem = self.quotas.room_for_queues(self.quotas.queues, len(new), cmd)
            if problem:
                return problem
        cap = cmd.get("max_queues")
        if cap is not None and len(self.queues) + len(new) > cap:
            holder = "this cluster" if self.group_count == 1 else f"Raft group {self.group_id}"
            return error(LIMIT_REACHED, f"{holder} holds {len(self.queues)} queues and this would create "
                                        f"{len(new)} more (limit {cap}, the node option --max-queues)")
        return None

    def _fenced(self, names, cmd):
        """None unless the command, routed by a view of the catalog older than a release of one
        of `names` (queues it would make here), must be routed again (release.py)."""
        if self.group_count == 1 or cmd["op"] == "stage_commit":   # its stages, fenced when staged, keep
            return None                                                 # their queues' names from retiring
        for name in names:
            problem = self.release.refusal(name, cmd.get("catalog_index", 0))
            if problem:
                return problem
        return None

    # ---- queues -----------------------------------------------------------------
    def _check_dead_letter(self, name: str, config: dict, cmd):
        """A queue's dead-letter queue is not the queue, and one this group would make later
        is named by a view of the catalog that may place it here."""
        dead_letter = config.get("dead_letter")
        if dead_letter == name:
            return error(BAD_REQUEST, "a queue cannot be its own dead-letter queue")
        if dead_letter is not None and dead_letter not in self.queues \
                and dead_letter == (cmd.get("config") or {}).get("dead_letter"):
            return self._fenced([dead_letter], cmd)
        return None

    def _create_queue(self, cmd):
        name, config = cmd["queue"], full_config(cmd.get("config") or {})
        problem = self._check_dead_letter(name, config, cmd)
        if problem:
            return problem
        existing = self.queues.get(name)
        if existing is not None:
            if existing.config == config:
                return {"created": False, "config": existing.config}
            return error(CONFLICT, f"queue {name!r} exists with another config; use PATCH to change it",
                         config=existing.config)
        problem = self._room_for_queues([name], cmd)
        if problem:
            return problem
        self._new_queue(name, config)
        return {"created": True, "config": config}

    def _patch_queue(self, cmd):
        name = cmd["queue"]
        queue = self._touch(name)
        if queue is None:
            return self._missing(name)
        config = full_config({**queue.config, **cmd["config"]})
        problem = self._check_dead_letter(name, config, cmd)
        if problem:
            return problem
        queue.config = config
        return {"config": config}

    def _delete_queue(self, cmd):
        queue = self.queues.pop(cmd["queue"], None)
        if queue is None:
            return self._missing(cmd["queue"])
        self.stored.bytes -= queue.rows.bytes + queue.rows.retained_bytes
        self.quotas.queues.forget(cmd["queue"])
        self.due.forget(cmd["queue"])
        if self.group_count > 1:
            self.release.note_deleted(cmd["queue"])
        return {"deleted": True}

    def _queue_for_put(self, name: str, auto_create: bool):
        queue = self._touch(name)
        if queue is None and auto_create:
            queue = self._new_queue(name, full_config({}))
        return queue

    # ---- messages -------------------------------------------------------------
    def _put(self, cmd):
        name = cmd["queue"]
        auto_create = cmd.get("auto_create", True)
        if name not in self.queues and not auto_create:
            return self._missing(name)
        queue = self._touch(name)
        problem = self._check_room({name: cmd["messages"]}, auto_create, cmd)
        if problem:
            return problem
        queue = queue or self._new_queue(name, full_config({}))
        result = {"messages": queue.put(cmd["messages"], self.clock)}
        queue.forget_ids_beyond(cmd.get("dedup_max_bytes"))
        return result

    def _receive(self, cmd):
        queue = self._touch(cmd["queue"])
        if queue is None:
            return self._missing(cmd["queue"])
        result = queue.receive(cmd["group"], cmd["max"], cmd.get("lease_ms"), self.clock)
        self._dead_letter(queue)
        return result

    def _settle(self, cmd):
        queue = self._touch(cmd["queue"])
        if queue is None:
            return self._missing(cmd["queue"])
        duration = cmd.get("delay_ms") if cmd["op"] == "nack" else cmd.get("lease_ms")
        result = queue.settle(cmd["op"], cmd["receipts"], self.clock, duration)
        self._dead_letter(queue)
        if len(result["stale"]) == len(set(cmd["receipts"])):
            return error(STALE_RECEIPT, "no receipt names a lease that still holds", stale=result["stale"])
        return result

    def _add_group(self, cmd):
        queue = self._touch(cmd["queue"])
        if queue is None:
            return self._missing(cmd["queue"])
        return queue.add_group(cmd["group"], cmd.get("start", "earliest"), self.clock, cmd.get("max_groups"))

    def _delete_group(self, cmd):
        queue = self._touch(cmd["queue"])
        if queue is None:
            return self._missing(cmd["queue"])
        return queue.delete_group(cmd["group"])

    def _commit(self, cmd):
        queue = self._touch(cmd["queue"])
        if queue is None:
            return self._missing(cmd["queue"])
        return queue.commit(cmd["group"], cmd["seq"])

    def _seek_group(self, cmd):
        queue = self._touch(cmd["queue"])
        if queue is None:
            return self._missing(cmd["queue"])
        return queue.seek(cmd["group"], cmd["to"], self.clock)

    def _patch_group(self, cmd):
        queue = self._touch(cmd["queue"])
        if queue is None:
            return self._missing(cmd["queue"])
        return queue.patch_group(cmd["group"], cmd, self.clock)

    def _tx(self, cmd):
        """Acks and puts across queues, all or nothing: every check before any change."""
        auto_create = cmd.get("auto_create", True)
        # Every queue's timers fire before the first check: firing one queue's
        # may move a dead letter into another and drop (drop_oldest) a message
        # whose lease was already checked.
        for name in dict.fromkeys(part["queue"] for part in cmd.get("ack", []) + cmd.get("put", [])):
            self._touch(name)
        leases = {}   # (queue, group, seq) -> (Queue, Group, seq), in receipt order
        stale = []
        for part in cmd.get("ack", []):
            queue = self.queues.get(part["queue"])
            for receipt in part["receipts"]:
                live = queue.live_lease(receipt) if queue is not None else None
                if live is None:
                    stale.append(receipt)
                else:
                    group, seq = live
                    leases[(queue.name, group.name, seq)] = (queue, group, seq)
        if stale:
            return error(STALE_RECEIPT, "the transaction names leases that no longer hold", stale=stale)
        batches: dict[str, list] = {}
        for part in cmd.get("put", []):
            batches.setdefault(part["queue"], []).extend(part["messages"])
        problem = self._check_room(batches, auto_create, cmd)
        if problem:
            return problem
        for queue, group, seq in leases.values():
            queue.finish(group, seq)
            queue.counters["acked_total"] += 1
        puts = [{"queue": name,
                 "messages": self._queue_for_put(name, True).put(messages, self.clock)}
                for name, messages in batches.items()]
        for name in batches:
            self.queues[name].forget_ids_beyond(cmd.get("dedup_max_bytes"))
        return {"acked": len(leases), "put": puts}

    def _check_room(self, batches: dict, auto_create: bool, cmd):
        """Refuse (changing nothing) puts into queues (their timers fired) unless every one takes its
        batch whole, and the queues they would create and the bytes they would add fit the caps."""
        if auto_create:
            problem = self._room_for_queues(batches, cmd)
            if problem:
                return problem
        for name, messages in batches.items():
            queue = self.queues.get(name)
            if queue is None:
                if not auto_create:
                    return self._missing(name)
                continue   # a new queue has the default config: no limits
            problem = queue.check_capacity(messages)
            if problem:
                return problem
        return self._room_for_bytes(batches, cmd) or self.quotas.room_for_bytes(self, batches, cmd)

    def _room_for_bytes(self, batches: dict, cmd):
        """None unless the puts would grow the bytes this group's queues store past the cap the
        leader put in the command (its share of --max-stored-bytes). Puts that grow nothing
        (retried ids, replacements) are taken even past it."""
        cap = cmd.get("max_stored_bytes")
        if cap is None:
            return None
        growth = sum((self.queues.get(name) or Queue(name, full_config({}), 0)).growth(messages)
                     for name, messages in batches.items())
        if growth <= 0 or self.stored.bytes + growth <= cap:
            return None
        holder, limit = (("this cluster", "the node option --max-stored-bytes") if self.group_count == 1 else
                         (f"Raft group {self.group_id}", f"its share of the node option --max-stored-bytes"))
        return error(INSUFFICIENT_STORAGE, f"{holder} stores {self.stored.bytes} bytes of messages and this would "
                                           f"add {growth} (limit {cap}, {limit}): nothing was stored; retry once "
                                           "consumers have taken some", stored_bytes=self.stored.bytes, limit=cap)

    # ---- staged writes (staging.py) ---------------------------------------------------
    def _stage(self, cmd):
        self.staging.advance(self.clock)
        name = cmd["queue"]
        if name not in self.queues:
            if not cmd.get("auto_create", True):
                return self._missing(name)
            problem = self._fenced([name], cmd)   # its commit makes the queue here
            if problem:
                return problem
        return self.staging.stage(cmd["producer"], cmd["token"], cmd["chunk"], name, cmd["messages"],
                                  cmd.get("ttl_ms") or DEFAULT_STAGE_TTL_MS, self.clock, cmd.get("caps"))

    def _stage_commit(self, cmd):
        """Publish the named stages in this one entry, once per (producer, batch)."""
        self.staging.advance(self.clock)
        producer, batch, parts = cmd["producer"], cmd["batch"], cmd["parts"]
        done = self.staging.committed_batch(producer)
        if done is not None and batch <= done:
            self.staging.drop_stages(producer, [p["token"] for p in parts])
            return {"committed": False, "duplicate": True, "committed_batch": done, "put": 0}
        if batch > (-1 if done is None else done) + MAX_BATCH_STEP:
            return error(CONFLICT, f"batch {batch} is more than {MAX_BATCH_STEP} past producer {producer!r}'s "
                                   f"committed batch ({done}): refused, so that no later batch of it "
                                   "is taken for a duplicate")
        if not parts:   # nothing to publish: the mark stays, so only a producer's own rows move it
            return {"committed": False, "duplicate": False, "committed_batch": done, "put": 0,
                    "duplicate_ids": 0}
        batches, problem = self.staging.check_commit(producer, parts)
        if problem:
            return problem
        allowed = cmd.get("allowed_queues")
        for name in batches if allowed is not None else ():
            if not any_pattern_matches(allowed, name):
                return error(FORBIDDEN, f"principal {self.acting!r} may not put to queue {name!r}, which a stage "
                                        "of this commit writes to: nothing was published", action="put", queue=name)
        for name in batches:
            self._touch(name)
        problem = self._check_room(batches, cmd.get("auto_create", True), cmd)
        if problem:
            return problem
        cap = cmd.get("max_producers")
        if done is None and cap is not None and len(self.staging.producers) >= cap:
            return error(LIMIT_REACHED, f"the cluster keeps the committed batch of {len(self.staging.producers)} "
                                        f"producers (limit {cap}, the node option --max-producers); delete "
                                        "producers that are done")
        stored = duplicates = 0
        for name, messages in batches.items():
            for result in self._queue_for_put(name, True).put(messages, self.clock):
                if result["duplicate"]:
                    duplicates += 1
                else:
                    stored += 1
        retain_ms = cmd.get("retain_ms")
        self.staging.record_commit(producer, batch, parts, self.clock + retain_ms if retain_ms else None)
        return {"committed": True, "duplicate": False, "committed_batch": batch, "put": stored,
                "duplicate_ids": duplicates}

    def _stage_abort(self, cmd):
        self.staging.advance(self.clock)
        return {"dropped": self.staging.drop_stages(cmd["producer"], cmd["tokens"])}

    def _drop_producer(self, cmd):
        self.staging.advance(self.clock)
        return self.staging.drop_producer(cmd["producer"])

    # ---- timers and dead letters -------------------------------------------------
    def _tick(self, cmd):
        if cmd.get("wall_ms") is not None:
            self.wall.record(cmd["now_ms"], cmd["wall_ms"])
        # In creation order (incarnations count up as queues are created), as
        # if every queue were visited: a queue with nothing due is left as it is.
        due = sorted((self.queues[name] for name in self.due.due(self.clock)), key=lambda q: q.incarnation)
        for queue in due:
            self._advance(queue)
            self._dead_letter(queue)
        self.staging.advance(self.clock)
        return {"clock": self.clock}

    def _dead_letter(self, queue: Queue) -> None:
        """Move the queue's spent messages to its dead-letter queue (or drop them).

        A full dead-letter queue that refuses puts keeps them parked in their
        group; they are tried again on later commands and ticks, in order.
        """
        while queue.outbox:
            group_name, seq = queue.outbox[0]
            group = queue.groups.get(group_name)
            if group is None or seq not in group.parked:
                queue.outbox.popleft()
                continue
            rows = queue.rows
            target_name = queue.config["dead_letter"]
            if target_name is not None:
                target = self.queues.get(target_name)
                if target is None:
                    target = self._new_queue(target_name, full_config({}),
                                             owner=self.quotas.queues.owners.get(queue.name))
                self._advance(target)
                headers = {**dict(rows.headers.get(seq, ())),
                           "x-raftq-from-queue": queue.name,
                           "x-raftq-from-group": group_name,
                           "x-raftq-deliveries": str(group.deliveries.get(seq, 0)),
                           "x-raftq-reason": group.parked[seq]}
                # A move is a put into the dead-letter queue, keyed replacement
                # included: otherwise two unreceived versions of one key could be
                # stored there, and a restored replica (whose key index is rebuilt
                # from the messages) would replace a different one than the leader.
                moved = [{"body": rows.body(seq), "key": rows.keys.get(seq), "headers": headers,
                          "ordering_key": queue.ordering.get(seq), "priority": rows.priority_of(seq)}]
                if target.config["overflow"] == "reject" and target.check_capacity(moved):
                    return
                target.put(moved, self.clock)
            queue.outbox.popleft()
            queue.finish(group, seq)
            queue.counters["dead_lettered_total"] += 1

    def _redrive(self, cmd):
        return redrive(self, cmd)

    # ---- live bodies copied forward (docs/architecture.md, "Where a stored body lives") -------
    def _relocate(self, cmd):
        """Point each named message whose body is still exactly the reference the move names at
        the body's copy in this entry, which the leader read from that reference's entry: the old
        entry then serves fewer messages, and once none, compaction drops it. A message acked,
        moved, replaced or pointed elsewhere since the leader read it keeps what it holds
        (``stale``). No timer fires: only where bodies lie changes, never what a message is.
        A body not found in the entry (applied without it, ``apply``; or beyond the finder's
        window) has nowhere to go: it stays where it was."""
        moved = stale = moved_bytes = 0
        for name, moves in cmd.get("queues", ()):
            queue = self.queues.get(name)
            for seq, index, offset, length, kind, new in moves:
                if queue is not None and isinstance(new, BodyRef) \
                        and queue.rows.relocate(seq, BodyRef(index, offset, length, kind), new):
                    moved, moved_bytes = moved + 1, moved_bytes + length
                else:
                    stale += 1
        for token, chunk, at, index, offset, length, kind, new in cmd.get("stages", ()):
            old = BodyRef(index, offset, length, kind)
            if isinstance(new, BodyRef) and self.staging.relocate(token, chunk, at, old, new):
                moved, moved_bytes = moved + 1, moved_bytes + length
            else:
                stale += 1
        return {"moved": moved, "stale": stale, "bytes": moved_bytes}

    # ---- the catalog (catalog.py), group 0's alone --------------------------------------------
    def _assign(self, cmd):
        """Place the names; those new to the catalog are the principal's, held to its queues quota."""
        refusal = self._in_catalog()
        if refusal:
            return refusal
        new = [name for name in dict.fromkeys(cmd["queues"]) if name not in self.catalog.assigned]
        problem = self.quotas.room_for_queues(self.quotas.names, len(new), cmd)
        if problem:
            return problem
        result = self.catalog.assign(cmd["queues"], cmd.get("max_names"))
        if "error" not in result:
            for name in new:
                self.quotas.names.own(name, self.acting)
        return result

    def _record_members(self, cmd):
        return self._in_catalog() or self.recorded_members.record(cmd["groups"])

    def _replica_move(self, cmd):
        return self._in_catalog() or self.recorded_members.start_move(cmd["group"], cmd["source"], cmd["target"])

    def _replica_moved(self, cmd):
        return self._in_catalog() or self.recorded_members.end_move(cmd["group"], cmd["source"], cmd["target"],
                                                                 cmd["moved"])

    def _node_leaving(self, cmd):
        return self._in_catalog() or self.recorded_members.start_leaving(cmd["id"])

    def _release_names(self, cmd):
        refusal = self._in_catalog()
        if refusal:
            return refusal
        if "fence" in cmd and self.entry_index is None:
            return error(BAD_REQUEST, "a release taken in turn is applied from the log, at its index")
        result = self.catalog.release(cmd["group"], cmd["names"], cmd.get("fence"), self.entry_index)
        for name in result.get("released", ()):
            self.quotas.names.forget(name)
        return result

    # ---- names leaving the catalog (release.py), in every group -------------------------------
    def _retire_names(self, cmd):
        """The deleted queues' names of the command that may leave the catalog now: none this
        group holds, or names as a dead-letter queue or as a stage's queue."""
        return {"retiring": self.release.retire(cmd["names"], self._names_held()), "fence": self.release.fence}

    def _names_held(self) -> set:
        held = set(self.queues)
        held.update(q.config.get("dead_letter") for q in self.queues.values())
        held.update(stage["queue"] for stage in self.staging.stages.values())
        return held

    def _names_released(self, cmd):
        finished = self.release.released(cmd["names"], cmd["index"], cmd.get("in_turn", False))
        return {"fence": self.release.fence, "finished": finished}

    def names_deleted(self, limit: int) -> dict:
        """What the name releaser does next here: up to `limit` deleted names that may retire now
        (a name still named as a dead-letter queue, or by a stage, waits), the names retiring
        (a releaser that stopped between steps left them), and the fence they were read at."""
        held = self._names_held() if self.release.deleted else ()
        return {"names": self.release.waiting(limit, held), "retiring": sorted(self.release.retiring),
                "fence": self.release.fence}

    def names_retiring(self, names: list) -> dict:
        """Those of `names` retiring here, and the fence in the same state: what group 0's leader
        checks a release it is asked for against, so that only names this group retired leave
        the catalog (any replica's state will do: ``Catalog.release`` takes releases in turn)."""
        return {"names": [name for name in names if name in self.release.retiring], "fence": self.release.fence}

    def names_absent(self, names: list) -> dict:
        """Those of `names` this group neither holds nor names (as a dead-letter queue or a
        stage's queue): placed here by the catalog, they could leave it."""
        held = self._names_held()
        return {"names": [name for name in names if name not in held]}

    # ---- principals (principals.py), group 0's alone -------------------------------------------
    def _principal_add(self, cmd):
        return self._in_catalog() or self.principals.add(cmd)

    def _principal_update(self, cmd):
        return self._in_catalog() or self.principals.update(cmd)

    def _principal_remove(self, cmd):
        return self._in_catalog() or self.principals.remove(cmd)

    def _sqs_key_add(self, cmd):
        return self._in_catalog() or self.principals.add_sqs_key(cmd)

    def _sqs_key_remove(self, cmd):
        return self._in_catalog() or self.principals.remove_sqs_key(cmd)

    def list_principals(self) -> dict:
        return self.principals.listing()

    def principals_version(self) -> int:
        return self.principals.version

    def principal_events(self, limit: int) -> dict:
        return self.principals.events(limit)

    def _in_catalog(self) -> dict | None:
        if self.group_id != 0:
            return error(WRONG_GROUP, f"the catalog lives in group 0, not {self.group_id}", group=self.group_id)
        return None

    def group_members(self) -> dict:
        return self.recorded_members.as_dict()

    def catalog_lookup(self, names: list) -> dict:
        return {"groups": self.catalog.groups_of(names)}

    def list_catalog(self) -> dict:
        return {"group_count": self.group_count, "groups": dict(self.catalog.assigned)}

    def catalog_names_in(self, group: int) -> dict:
        """The names the catalog places in `group`."""
        return {"names": [name for name, held in self.catalog.assigned.items() if held == group]}

    def catalog_usage(self) -> dict:
        """How many names the catalog holds (the names of deleted queues too), in all and per group."""
        return {"names": len(self.catalog.assigned), "by_group": list(self.catalog.counts)}

    # ---- cluster directory and checkpoints ------------------------------------------
    def _set_member(self, cmd):
        self.members[cmd["id"]] = {"raft_addr": cmd["raft_addr"], "http_addr": cmd["http_addr"]}
        return {"members": self.members}

    def _remove_member(self, cmd):
        self.recorded_members.left(cmd["id"])
        if self.members.pop(cmd["id"], None) is None:
            return error(NOT_FOUND, f"node {cmd['id']!r} is not a member")
        return {"members": self.members}

    def _checkpoint(self, cmd):
        """A digest taken at the same log position on every replica (`cluster verify`)."""
        return {"checkpoint": cmd["token"], "digest": self.state_digest(), "clock": self.clock}

    # ---- read-only queries --------------------------------------------------------------
    def read(self, name: str, *args):
        """Answer the read `name` of the op table; any other name is a ValueError."""
        op = OPS.get(name) if isinstance(name, str) else None
        if op is None or not op.read:
            raise ValueError(f"{name!r} is not a read of the state machine")
        return op.handler(self, *args)

    def list_queues(self) -> dict:
        return {"queues": [{"name": q.name, "depth": len(q.rows),
                            "in_flight": sum(len(g.leases) for g in q.groups.values()),
                            "groups": list(q.groups)} for q in self.queues.values()]}

    def all_queue_stats(self, after: str = "", limit: int = 500) -> list:
        """(name, stats) of the first `limit` queues whose names sort after
        `after`: one page of every queue's figures (metrics). Paged so that no
        single read holds the node for long when there are many queues."""
        names = sorted(name for name in self.queues if name > after)[:limit]
        return [(name, self.queues[name].stats()) for name in names]

    def queue_info(self, name: str):
        queue = self.queues.get(name)
        if queue is None:
            return self._missing(name)
        return {"name": name, "config": queue.config, "stats": queue.stats()}

    def list_groups(self, name: str):
        queue = self.queues.get(name)
        if queue is None:
            return self._missing(name)
        return {"groups": [queue.group_stats(g) for g in queue.groups.values()]}

    def group_info(self, name: str, group: str):
        queue = self.queues.get(name)
        if queue is None:
            return self._missing(name)
        if group not in queue.groups:
            return error(NOT_FOUND, f"group {group!r} does not exist in queue {name!r}")
        return queue.group_stats(queue.groups[group])

    def browse(self, name: str, group: str, from_seq: int, limit: int, from_time_ms: int | None = None):
        queue = self.queues.get(name)
        if queue is None:
            return self._missing(name)
        return queue.browse(group, from_seq, limit, from_time_ms)

    def wall_times(self, log_times: list) -> list:
        """The wall time of each moment of `log_times` (wall.py)."""
        return [self.wall.wall_ms(t) for t in log_times]

    def producer_info(self, producer: str) -> dict:
        return self.staging.producer_info(producer)

    def list_producers(self) -> dict:
        return self.staging.list_producers()

    def staging_usage(self) -> dict:
        return self.staging.usage()

    def stored_usage(self) -> dict:
        """The bytes this group's queues store (what --max-stored-bytes counts)."""
        return {"bytes": self.stored.bytes}

    def has_ready(self, name: str, group: str) -> bool:
        return self.ready_count(name, group) > 0

    def ready_count(self, name: str, group: str) -> int:
        """What a receive could hand out now (waiting long polls are woken by it)."""
        queue = self.queues.get(name)
        return queue.deliverable(queue.groups[group], self.clock) if queue and group in queue.groups else 0

    def next_timer(self):
        """The earliest log time at which a tick would change something, or None. (It brings
        the due index up to date: derived, not state.)"""
        times = [t for t in (self.due.earliest(self.clock), self.staging.next_timer()) if t is not None]
        return min(times, default=None)

    # ---- snapshots -------------------------------------------------------------------------
    def snapshot(self) -> bytes:
        out = io.BytesIO()
        self.write_snapshot(out)
        return out.getvalue()

    def write_snapshot(self, out: BinaryIO) -> None:
        """Encode the state into the binary file `out` as it goes: at ten million messages the
        bytes of one column are 40 MB, written from the column itself (columns.py), not copied."""
        cbor2.dump({
            "format": SNAPSHOT_FORMAT,
            "version": SNAPSHOT_VERSION,
            "group_id": self.group_id,
            "group_count": self.group_count,
            "catalog": self.catalog.to_state(),
            "catalog_releases": self.catalog.releases,
            "catalog_last_release": self.catalog.last_release_state(),
            "group_members": self.recorded_members.to_state(),
            "principals": self.principals.to_state(),
            "quotas": self.quotas.to_state(),
            "name_release": self.release.to_state(),
            "clock": self.clock,
            "wall_times": self.wall.to_state(),
            "incarnations": self.incarnations,
            "members": self.members,
            "queues": [q.to_state() for q in self.queues.values()],
            "staging": self.staging.to_state(),
        }, out, default=encode_column)

    def restore(self, data: bytes) -> None:
        state = cbor2.loads(data)
        if state.get("format") != SNAPSHOT_FORMAT or state.get("version") not in READABLE_SNAPSHOT_VERSIONS:
            raise ValueError(f"not a raftq state machine snapshot of version {READABLE_SNAPSHOT_VERSIONS}")
        self.group_id = state.get("group_id", 0)
        self.group_count = state.get("group_count", 1)
        self.catalog = Catalog.from_state(self.group_count, state.get("catalog", []))
        self.catalog.releases = state.get("catalog_releases", 0)
        self.catalog.restore_last_release(state.get("catalog_last_release", []))
        self.recorded_members = Members.from_state(self.group_count, state.get("group_members"))
        self.principals = Principals.from_state(state.get("principals"), state.get("credentials"))
        self.quotas = Quotas.from_state(state.get("quotas"))
        self.release = NameRelease.from_state(self.group_id, state.get("name_release"))
        self.clock = state["clock"]
        self.wall = WallTimes.from_state(state.get("wall_times"))
        self.incarnations = state["incarnations"]
        self.members = state["members"]
        self.staging = Staging.from_state(state["staging"]) if "staging" in state else Staging()
        # Building a million messages would trigger one full garbage collection
        # after another, each scanning every message built so far and freeing
        # nothing (the state holds no cycles): three quarters of the restore
        # time. Collection is paused while the queues are rebuilt; no result
        # depends on it.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.queues = {q[0]: Queue.from_state(q, state["version"]) for q in state["queues"]}
        finally:
            if collecting:
                gc.enable()
        self.due.rebuild(self.queues.values())
        self.stored = Tally()
        for queue in self.queues.values():
            queue.rows.count_into(self.stored)

    def live_entry_indexes(self) -> list:
        """The log indexes of the entries the stored bodies' references name, in order:
        what compaction must keep (statemachine/bodies.py)."""
        indexes = self.staging.log_indexes()
        for queue in self.queues.values():
            indexes |= queue.rows.log_indexes()
        indexes.discard(0)
        return sorted(indexes)

    def state_digest(self) -> str:
        return hashlib.sha256(self.snapshot()).hexdigest()


class Op(NamedTuple):
    handler: Callable            # StateMachine method: (cmd) for a command, (*args) for a read
    check: Callable | None       # a command's validator (validation.py); None for a read
    read: bool = False
    creates_queues: bool = False  # may create a queue, now or (a dead-letter queue) later: needs raft_group


def _read(handler) -> Op:
    return Op(handler, None, read=True)


OPS: dict[str, Op] = {
    # queues
    "create_queue": Op(StateMachine._create_queue, v.check_configure_queue, creates_queues=True),
    "patch_queue": Op(StateMachine._patch_queue, v.check_configure_queue, creates_queues=True),
    "delete_queue": Op(StateMachine._delete_queue, v.check_delete_queue),
    # messages
    "put": Op(StateMachine._put, v.check_put, creates_queues=True),
    "receive": Op(StateMachine._receive, v.check_receive),
    "ack": Op(StateMachine._settle, v.check_ack),
    "nack": Op(StateMachine._settle, v.check_nack),
    "extend": Op(StateMachine._settle, v.check_extend),
    "tx": Op(StateMachine._tx, v.check_tx, creates_queues=True),
    "redrive": Op(StateMachine._redrive, v.check_redrive),
    "relocate": Op(StateMachine._relocate, v.check_relocate),
    # groups
    "add_group": Op(StateMachine._add_group, v.check_add_group),
    "delete_group": Op(StateMachine._delete_group, v.check_group),
    "commit": Op(StateMachine._commit, v.check_commit),
    "seek_group": Op(StateMachine._seek_group, v.check_seek_group),
    "patch_group": Op(StateMachine._patch_group, v.check_patch_group),
    # staged writes
    "stage": Op(StateMachine._stage, v.check_stage, creates_queues=True),
    "stage_commit": Op(StateMachine._stage_commit, v.check_stage_commit, creates_queues=True),
    "stage_abort": Op(StateMachine._stage_abort, v.check_stage_abort),
    "drop_producer": Op(StateMachine._drop_producer, v.check_drop_producer),
    # the catalog (group 0)
    "assign": Op(StateMachine._assign, v.check_assign),
    "record_members": Op(StateMachine._record_members, v.check_record_members),
    "replica_move": Op(StateMachine._replica_move, v.check_replica_move),
    "replica_moved": Op(StateMachine._replica_moved, v.check_replica_moved),
    "node_leaving": Op(StateMachine._node_leaving, v.check_node_leaving),
    "release_names": Op(StateMachine._release_names, v.check_release_names),
    # principals (group 0)
    "principal_add": Op(StateMachine._principal_add, v.check_principal_add),
    "principal_update": Op(StateMachine._principal_update, v.check_principal_update),
    "principal_remove": Op(StateMachine._principal_remove, v.check_principal_remove),
    "sqs_key_add": Op(StateMachine._sqs_key_add, v.check_sqs_key_add),
    "sqs_key_remove": Op(StateMachine._sqs_key_remove, v.check_sqs_key_remove),
    # names leaving the catalog, in every group
    "retire_names": Op(StateMachine._retire_names, v.check_names),
    "names_released": Op(StateMachine._names_released, v.check_names_released),
    # timers, the cluster directory, checkpoints
    "tick": Op(StateMachine._tick, v.check_tick),
    "set_member": Op(StateMachine._set_member, v.check_set_member),
    "remove_member": Op(StateMachine._remove_member, v.check_remove_member),
    "checkpoint": Op(StateMachine._checkpoint, v.check_checkpoint),
    # reads
    "list_queues": _read(StateMachine.list_queues),
    "queue_info": _read(StateMachine.queue_info),
    "all_queue_stats": _read(StateMachine.all_queue_stats),
    "list_groups": _read(StateMachine.list_groups),
    "group_info": _read(StateMachine.group_info),
    "browse": _read(StateMachine.browse),
    "has_ready": _read(StateMachine.has_ready),
    "ready_count": _read(StateMachine.ready_count),
    "next_timer": _read(StateMachine.next_timer),
    "wall_times": _read(StateMachine.wall_times),
    "producer_info": _read(StateMachine.producer_info),
    "list_producers": _read(StateMachine.list_producers),
    "staging_usage": _read(StateMachine.staging_usage),
    "stored_usage": _read(StateMachine.stored_usage),
    "catalog_lookup": _read(StateMachine.catalog_lookup),
    "list_catalog": _read(StateMachine.list_catalog),
    "catalog_usage": _read(StateMachine.catalog_usage),
    "group_members": _read(StateMachine.group_members),
    "names_deleted": _read(StateMachine.names_deleted),
    "names_retiring": _read(StateMachine.names_retiring),
    "names_absent": _read(StateMachine.names_absent),
    "catalog_names_in": _read(StateMachine.catalog_names_in),
    "list_principals": _read(StateMachine.list_principals),
    "principals_version": _read(StateMachine.principals_version),
    "principal_events": _read(StateMachine.principal_events),
}


def queues_it_may_make(cmd) -> list:
    """The queues a valid command that ``creates_queues`` may make in its group, now or (a
    dead-letter queue) later: the names whose view of the catalog its ``catalog_index`` gives
    the age of. A stage commit's are its stages', which were fenced when staged."""
    op = cmd["op"]
    if op in ("put", "stage"):
        return [cmd["queue"]]
    if op in ("create_queue", "patch_queue"):
        dead_letter = (cmd.get("config") or {}).get("dead_letter")
        return [cmd["queue"]] + ([dead_letter] if dead_letter is not None else [])
    if op == "tx":
        return [part["queue"] for part in cmd.get("put", [])]
    return []


# What issue 51 adds to the state machine (api/features.py): a release before it refuses these.
PRIORITY_BACKOFF_PAUSE_REPLAY = "priority_backoff_pause_replay"
ISSUE_51_CONFIG = ("backoff", "retention_ms", "retention_bytes")


def feature_needed(cmd) -> str | None:
    """The feature of the state machine every replica must know to apply the valid command `cmd`
    alike, or None when any release since snapshot version 14 applies it."""
    op = cmd["op"]
    if op in ("seek_group", "patch_group"):
        return PRIORITY_BACKOFF_PAUSE_REPLAY
    if op == "add_group" and cmd.get("start", "earliest") not in v.GROUP_STARTS:
        return PRIORITY_BACKOFF_PAUSE_REPLAY
    if op in ("create_queue", "patch_queue") and any(field in (cmd.get("config") or {}) for field in ISSUE_51_CONFIG):
        return PRIORITY_BACKOFF_PAUSE_REPLAY
    if op in ("put", "stage", "tx"):
        messages = cmd["messages"] if op != "tx" else [m for part in cmd.get("put", ()) for m in part["messages"]]
        if any("priority" in message for message in messages):
            return PRIORITY_BACKOFF_PAUSE_REPLAY
    return None


def check_command(cmd):
    """None when `cmd` is a well-formed command, else a bad_request result."""
    op = OPS.get(cmd.get("op")) if isinstance(cmd, dict) and isinstance(cmd.get("op"), str) else None
    if op is None or op.read:
        return error(BAD_REQUEST, "unknown command")
    return (v.check_now(cmd) or v.check_raft_group(cmd) or v.check_catalog_index(cmd) or v.check_acting_principal(cmd)
            or op.check(cmd))


__all__ = ["StateMachine", "OPS", "check_command", "queues_it_may_make", "feature_needed", "encode_entry",
           "decode_entry"]
