"""One queue: its stored messages, its indexes, its timers and its groups.

Messages are rows of columns indexed by seq (``rows.py``), in seq order
because seqs are only ever handed out growing.  Three indexes hang off them:
``keys`` (key -> newest seq, for keyed replacement), ``dedup`` (idempotency
id -> seq within the window, kept hashed: ``dedup.py``) and ``expiries`` (TTL
order).  Each consumer group (``group.py``) keeps its own ready/leased/delayed
sets of seqs; a message carries ``pending``, the number of groups not done
with it, and is removed when that reaches zero, when it expires, or when
overflow drops it.

Nothing here reads a clock: every method takes the log time ``clock`` from
the state machine, and timers (delays, leases, retries, TTLs, dedup windows,
the ends of pauses, retention) fire in ``advance`` when log time passes them.
A delivery that ends without an ack once ``max_deliveries`` is reached parks
the message in its group and lands in ``outbox``; the state machine moves it
to the dead-letter queue, which lives outside this queue.  One that ends
without its own delay waits as the queue's ``backoff`` policy says
(``backoff.py``).

A receive hands out the highest priority first, in seq order within a
priority (``ready.py``); a message with an ordering key never goes before an
earlier one of its key, whatever their priorities (``_keyed_picks``).  A
queue with retention keeps what every group is done with, and a group can be
moved to any stored seq and replay from there (``retention.py``).
"""

import re
from collections import deque
from heapq import heappop, heappush
from itertools import chain, islice

import cbor2
from sortedcontainers import SortedList

from raftq.wire_format import is_name

from . import retention
from .backoff import redelivery_delay
from .dedup import DedupWindow
from .group import Group
from .retention import MAX_EARLIEST_GROUP_MESSAGES
from .results import CONFLICT, LIMIT_REACHED, NOT_FOUND, QUEUE_FULL, error
from .bodies import BodyRef
from .rows import Rows, Tally
from .validation import full_config

COUNTERS = ("put_total", "acked_total", "redelivered_total", "dead_lettered_total",
            "expired_total", "dropped_total", "replaced_total", "redriven_total")
PARKED_RETRY_MS = 1_000
# A receive steps over at most this many ready messages whose ordering key
# waits (a few ms on the apply thread): messages of other keys further back
# are handed out once the keys ahead move (docs/api.md).
MAX_STEPPED_OVER = 10_000


# Stored headers are a tuple of (name, value) pairs: about half a small
# dict's bytes, and, holding only strings, never tracked by the garbage
# collector -- a full collection must not visit the stored messages one by
# one (as objects of a class, a million made each full collection a pause
# of 0.3-1 s on the thread that applies entries and sends heartbeats).
def stored_headers(headers: dict | None) -> tuple | None:
    return None if headers is None else tuple(headers.items())


def given_headers(stored: tuple | None) -> dict | None:
    return None if stored is None else dict(stored)


def body_size(body) -> int:
    """Bytes a body counts toward max_bytes: raw length, or its CBOR length (a reference's length is that)."""
    if isinstance(body, BodyRef):
        return body.length
    if isinstance(body, bytes):
        return len(body)
    if isinstance(body, str):
        return len(body.encode())
    return len(cbor2.dumps(body))


def message_size(message: dict) -> int:
    """Bytes a message counts toward max_bytes (and a node's --max-message-bytes):
    its body, plus its key, id, ordering key, header names and values in UTF-8 -- else
    megabytes of headers would fit in a queue of max_bytes=100."""
    size = body_size(message["body"])
    for field in ("key", "id", "ordering_key"):
        if message.get(field) is not None:
            size += len(message[field].encode())
    for name, value in (message.get("headers") or {}).items():
        size += len(name.encode()) + len(value.encode())
    return size


# A receipt is `incarnation:group:seq:token` (a group name holds no ":").
def receipt_prefix(incarnation: int, group: str) -> str:
    """What every receipt of one group of one queue incarnation starts with."""
    return f"{incarnation}:{group}:"


# Only what receive writes: ASCII digits (str.isdigit would take "²", which
# int() refuses) around a group name.
RECEIPT_RE = re.compile(r"(\d+):([^:]*):(\d+):(\d+)", re.ASCII)


def parse_receipt(receipt: str):
    """(incarnation, group, seq, token), or None for anything raftq did not issue."""
    parsed = RECEIPT_RE.fullmatch(receipt)
    if parsed is None:
        return None
    incarnation, group, seq, token = parsed.groups()
    return int(incarnation), group, int(seq), int(token)


def could_be_receipt(receipt) -> bool:
    """Whether raftq could have issued it, whatever lease it names now: what tells a
    malformed receipt (refused at the API's edge) from a stale one."""
    parsed = parse_receipt(receipt) if isinstance(receipt, str) else None
    return parsed is not None and is_name(parsed[1])


class Queue:
    def __init__(self, name: str, config: dict, incarnation: int, tally: Tally | None = None):
        """`tally`: where the stored bytes count with the other queues' of the machine."""
        self.name = name
        self.config = config
        # Lease tokens count per queue, so a receipt also names the queue it
        # came from: without it, another queue's receipt (or one from a queue
        # deleted and created again under this name) could end a lease here.
        self.incarnation = incarnation
        self.next_seq = 1
        self.next_lease = 1
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.rows = Rows(tally=tally)       # the stored messages, in seq order
        self.ordering = {}                  # seq -> ordering key of a message put with one
        self.keys = {}                      # key -> seq of its newest stored version
        self.dedup = DedupWindow()          # id -> seq, for dedup_window_ms after the put
        # Redrives out of this (dead-letter) queue by request id, for the same
        # window as put ids: a retried redrive answers the first one's result.
        self.redrives = {}                  # id -> (result, at)
        self.redrive_order = deque()        # (at, id), oldest first
        self.expiries = SortedList()        # (expires_at, seq)
        self.groups = {"default": Group("default")}
        self.outbox = deque()               # (group, seq) parked for the dead-letter queue

    # ---- timers -------------------------------------------------------
    def advance(self, clock: int) -> None:
        """Fire every timer due at log time `clock`."""
        priority_of = self.rows.priority_of
        for group in self.groups.values():
            group.advance(clock)
            while group.delayed_times and group.delayed_times[0][0] <= clock:
                _, seq = group.delayed_times.pop(0)
                del group.delayed[seq]
                group.ready.add(seq, priority_of(seq))
            for seq in group.expired_leases(clock):
                ended_at = group.end_lease(seq)
                self._end_delivery(group, seq, None, ended_at, clock)
        while self.expiries and self.expiries[0][0] <= clock:
            self._remove(self.expiries[0][1])
            self.counters["expired_total"] += 1
        window = self.config["dedup_window_ms"]
        self.dedup.expire(clock, window)
        while self.redrive_order and self.redrive_order[0][0] + window <= clock:
            del self.redrives[self.redrive_order.popleft()[1]]
        if self.rows.retained:
            retention.trim(self, clock)

    def next_timer(self):
        """The earliest log time at which `advance` has work, or None."""
        times = [t for t in map(Group.next_timer, self.groups.values()) if t is not None]
        if self.expiries:
            times.append(self.expiries[0][0])
        if self.dedup:
            times.append(self.dedup.oldest_put + self.config["dedup_window_ms"])
        if self.redrive_order:
            times.append(self.redrive_order[0][0] + self.config["dedup_window_ms"])
        if self.rows.retained:
            retained = retention.due(self)
            if retained is not None:
                times.append(retained)
        return min(times, default=None)

    # ---- put ------------------------------------------------------------
    def check_capacity(self, messages: list):
        """Refuse (without changing anything) a batch this queue cannot take whole."""
        limit_count, limit_bytes = self.config["max_length"], self.config["max_bytes"]
        if limit_count is None and limit_bytes is None:
            return None
        rows = self.rows
        count, size, batch_count, batch_size = self._after(messages)
        if self.config["overflow"] == "drop_oldest":
            over_count = limit_count is not None and batch_count > limit_count   # older messages make room
            over_bytes = limit_bytes is not None and batch_size > limit_bytes
        else:
            # A batch that does not grow the queue (retried duplicates, a same-size
            # replacement) is taken even when a PATCH left the queue over its limits.
            over_count = limit_count is not None and count > limit_count and count > len(rows)
            over_bytes = limit_bytes is not None and size > limit_bytes and size > rows.bytes
        if over_count or over_bytes:
            return error(QUEUE_FULL, f"queue {self.name!r} is full "
                         f"(max_length={limit_count}, max_bytes={limit_bytes})")
        return None

    def growth(self, messages: list) -> int:
        """At most how many bytes the queue grows by taking the batch (negative: it shrinks): what
        its put adds to the machine's stored bytes. Exact, but for a drop_oldest queue, whose
        overflow may then drop older messages: bounded by its max_bytes."""
        size = self._after(messages)[1]
        limit_bytes = self.config["max_bytes"]
        if self.config["overflow"] == "drop_oldest" and limit_bytes is not None:
            size = min(size, limit_bytes)
        return size - self.rows.bytes

    def _after(self, messages: list) -> tuple[int, int, int, int]:
        """The queue's messages and bytes once it took the batch, before any overflow, and the
        batch's own that it would store (neither duplicates nor replaced by a later one of it)."""
        rows = self.rows
        count, size = len(rows), rows.bytes
        batch_count = batch_size = 0
        ids, batch_keys = set(), {}          # key -> size of the batch's newest version
        for m in messages:
            mid, key = m.get("id"), m.get("key")
            if mid is not None:
                if mid in self.dedup or mid in ids:
                    continue
                ids.add(mid)
            nbytes = message_size(m)
            count, size = count + 1, size + nbytes
            batch_count, batch_size = batch_count + 1, batch_size + nbytes
            if key is not None:
                if key in batch_keys:
                    count, size = count - 1, size - batch_keys[key]
                    batch_count, batch_size = batch_count - 1, batch_size - batch_keys[key]
                else:
                    old = self.keys.get(key)
                    if old is not None and not rows.was_received(old):
                        count, size = count - 1, size - rows.size(old)
                batch_keys[key] = nbytes
        return count, size, batch_count, batch_size

    def put(self, messages: list, clock: int) -> list:
        """Store a batch that `check_capacity` accepted; one result per message."""
        results = []
        ttl = self.config["ttl_ms"]
        expires_at = clock + ttl if ttl else None    # one int object for the batch, not one per message
        for m in messages:
            mid = m.get("id")
            # remembered before the message is stored, which takes the next seq
            original = None if mid is None else self.dedup.remember(mid, self.next_seq, clock)
            if original is not None:
                results.append({"seq": original, "duplicate": True, "replaced_seq": None})
                continue
            replaced = None
            key = m.get("key")
            if key is not None and key in self.keys:
                old_seq = self.keys[key]
                if not self.rows.was_received(old_seq):
                    replaced = old_seq
                    self._remove(old_seq)
                    self.counters["replaced_total"] += 1
            ttl = m.get("ttl_ms")
            seq = self.insert(m["body"], key, m.get("headers"), clock,
                              clock + ttl if ttl else expires_at, m.get("delay_ms") or 0, message_size(m),
                              m.get("ordering_key"), m.get("priority", 0))
            results.append({"seq": seq, "duplicate": False, "replaced_seq": replaced})
        self.drop_overflow()
        return results

    def forget_ids_beyond(self, max_bytes) -> None:
        """Keep idempotency ids of at most `max_bytes` UTF-8 bytes in all (None:
        no limit): the oldest are forgotten before their dedup window ends."""
        if max_bytes is not None:
            self.dedup.forget_beyond(max_bytes)

    def insert(self, body, key, headers, clock: int, expires_at, delay_ms: int, size: int,
               ordering_key=None, priority: int = 0) -> int:
        """Append one message of `size` bytes (message_size) at the tail, visible to every current group."""
        seq = self.next_seq
        self.next_seq = seq + 1
        if ordering_key is not None:
            self.ordering[seq] = ordering_key
        self.rows.append(seq, body, key, stored_headers(headers), clock, expires_at, size, len(self.groups),
                         priority)
        if key is not None:
            self.keys[key] = seq
        if expires_at is not None:
            self.expiries.add((expires_at, seq))
        # A delay is kept per group, like a nack delay, so that each group can
        # finish the message on its own (a commit past it) before it shows.
        if delay_ms:
            visible_at = self.rows.shows_at[seq] = clock + delay_ms
            for group in self.groups.values():
                group.delay(seq, visible_at)
        else:
            for group in self.groups.values():
                group.ready.add(seq, priority)
        self.counters["put_total"] += 1
        return seq

    def drop_overflow(self) -> None:
        """Make the queue fit its limits after a put: retained messages (which count toward them
        too) go first, oldest first; then drop_oldest evicts from the head (reject never evicts
        what a group holds)."""
        limit_count, limit_bytes = self.config["max_length"], self.config["max_bytes"]
        if limit_count is None and limit_bytes is None:
            return
        rows = self.rows
        while rows.retained and (
                (limit_count is not None and len(rows) + rows.retained > limit_count)
                or (limit_bytes is not None and rows.bytes + rows.retained_bytes > limit_bytes)):
            self._unstore(rows.oldest_retained())
        if self.config["overflow"] != "drop_oldest":
            return
        while rows and (
                (limit_count is not None and len(rows) > limit_count)
                or (limit_bytes is not None and rows.bytes > limit_bytes)):
            self._remove(rows.first_seq())
            self.counters["dropped_total"] += 1

    # ---- delivery -----------------------------------------------------------
    def receive(self, group_name: str, count: int, lease_ms, clock: int):
        group = self.groups.get(group_name)
        if group is None:
            return error(NOT_FOUND, f"group {group_name!r} does not exist in queue {self.name!r}")
        allowance = group.allowance(clock)
        if allowance is not None:            # paused (0), or a rate limit
            if not allowance:
                return {"messages": []}
            count = min(count, allowance)
        deadline = clock + (lease_ms or self.config["lease_ms"])
        limit = self.config["max_deliveries"]
        out = []
        ready = group.ready
        prefix = receipt_prefix(self.incarnation, group_name)
        waiting = self._ordering_waits(group) if self.ordering else None
        # With ordering keys and several priorities, priority chooses among the messages free to go
        picks = self._keyed_picks(group, waiting) if self.ordering and ready.levels is not None else None
        rows = self.rows
        stepped = 0     # ready messages stepped over: an earlier one of their ordering key is not ready
        seq = 0
        while ready and len(out) < count:
            if picks is not None:
                seq = next(picks, None)
                if seq is None:
                    break
                ready.remove(seq)
            elif waiting:
                seq, steps = self._next_not_waiting(ready, seq, waiting, MAX_STEPPED_OVER - stepped)
                stepped += steps
                if seq is None:
                    break
                ready.remove(seq)
            else:
                seq = ready.pop_next()
            if limit is not None and group.deliveries.get(seq, 0) >= limit:
                # max_deliveries was lowered below what this message has had
                self._park(group, seq)
                continue
            token = self.next_lease
            self.next_lease = token + 1
            deliveries = group.lease(seq, token, deadline, clock)
            if deliveries > 1:
                self.counters["redelivered_total"] += 1
            body, key, headers, put_at, priority = rows.deliver(seq)
            out.append({"seq": seq, "receipt": f"{prefix}{seq}:{token}",
                        "body": body, "key": key, "headers": given_headers(headers),
                        "deliveries": deliveries, "put_at_ms": put_at,
                        "first_received_at_ms": group.first_leased.get(seq),
                        "ordering_key": self.ordering.get(seq) if self.ordering else None,
                        "priority": priority})
        if out and group.pace is not None:
            group.pace.spend(len(out), clock)
        return {"messages": out}

    def deliverable(self, group: Group, clock: int, limit: int = 1_000) -> int:
        """How many ready messages a receive could hand out now (up to `limit`
        when ordering keys wait): a message whose key waits is not one, nor is
        any while the group is paused or spent its rate, or a long poll would
        be woken to receive nothing, again and again."""
        allowance = group.allowance(clock)
        if allowance == 0:
            return 0
        waiting = self._ordering_waits(group) if self.ordering else None
        if not waiting:
            found = len(group.ready)
        else:
            found, seq, budget = 0, 0, MAX_STEPPED_OVER
            while found < limit:
                seq, steps = self._next_not_waiting(group.ready, seq, waiting, budget)
                budget -= steps
                if seq is None:
                    break
                found += 1
        return found if allowance is None else min(found, allowance)

    def _keyed_picks(self, group: Group, waiting: dict):
        """The ready seqs a receive hands out, in turn, where ordering keys meet priorities: the
        highest priority first, then the lowest seq, among the messages free to go -- those
        without a key, and each key's lowest ready one unless an earlier one of its key waits
        (in flight, delayed, parked). Once a key's message is taken, its next ready one is free.
        It looks at the ready seqs in seq order only as far as it must: until the best message
        found has the highest priority ready (none further on can go first), and at most
        MAX_STEPPED_OVER of them. The caller removes each seq it is given from the ready set."""
        ready, ordering, priority_of = group.ready, self.ordering, self.rows.priority_of
        free = []                # heap of (-priority, seq, key): the messages free to go
        behind = {}              # key (free to go) -> its later ready seqs, in order
        keyed_free = set()       # the keys with a message in `free`
        looked, budget, exhausted = 0, MAX_STEPPED_OVER, False
        while True:
            if not exhausted and not (free and -free[0][0] >= ready.top()):
                for seq in ready.irange(minimum=looked + 1):
                    looked = seq
                    budget -= 1
                    key = ordering.get(seq)
                    if key is None:
                        heappush(free, (-priority_of(seq), seq, None))
                    elif key in keyed_free:
                        behind[key].append(seq)
                    elif seq <= waiting.get(key, seq):
                        behind[key] = deque()
                        keyed_free.add(key)
                        heappush(free, (-priority_of(seq), seq, key))
                    if (free and -free[0][0] >= ready.top()) or not budget:
                        break
                else:
                    exhausted = True
                exhausted = exhausted or not budget
            if not free:
                return
            _, seq, key = heappop(free)
            yield seq
            if key is not None:
                keyed_free.discard(key)
                later = behind.pop(key)
                if later and later[0] <= waiting.get(key, later[0]):
                    after = later.popleft()
                    behind[key] = later
                    keyed_free.add(key)
                    heappush(free, (-priority_of(after), after, key))

    def _next_not_waiting(self, ready, after: int, waiting: dict, budget: int):
        """(the first ready seq above `after` whose ordering key does not wait,
        or None; how many were stepped over), stepping over at most `budget`."""
        ordering, steps = self.ordering, 0
        for seq in ready.irange(minimum=after + 1):
            if seq <= waiting.get(ordering.get(seq), seq):
                return seq, steps
            steps += 1
            if steps >= budget:
                break
        return None, steps

    def _ordering_waits(self, group: Group) -> dict:
        """Ordering key -> the lowest seq of that key the group holds but cannot
        hand out (in flight, delayed or parked): later messages of the key wait
        for it. Costs what the group holds in those states, and only queues
        with ordering keys pay it."""
        ordering, waits = self.ordering, {}
        for seq in chain(group.leases, group.delayed, group.parked):
            key = ordering.get(seq)
            if key is not None and seq < waits.get(key, seq + 1):
                waits[key] = seq
        return waits

    def live_lease(self, receipt: str):
        """(group, seq) when the receipt names a lease that still holds."""
        parsed = parse_receipt(receipt)
        if parsed is None:
            return None
        incarnation, group_name, seq, token = parsed
        if incarnation != self.incarnation:
            return None
        group = self.groups.get(group_name)
        lease = group.leases.get(seq) if group is not None else None
        if lease is None or lease[0] != token:
            return None
        return group, seq

    def settle(self, op: str, receipts: list, clock: int, duration) -> dict:
        """ack, nack or extend; receipts that name no live lease are reported stale."""
        done, stale = 0, []
        for receipt in dict.fromkeys(receipts):
            live = self.live_lease(receipt)
            if live is None:
                stale.append(receipt)
                continue
            group, seq = live
            done += 1
            if op == "ack":
                self.finish(group, seq)
                self.counters["acked_total"] += 1
            elif op == "nack":
                group.end_lease(seq)
                self._end_delivery(group, seq, duration, clock, clock)
            else:
                group.extend_lease(seq, clock + (duration or self.config["lease_ms"]))
        past = {"ack": "acked", "nack": "nacked", "extend": "extended"}[op]
        return {past: done, "stale": stale}

    def _end_delivery(self, group: Group, seq: int, delay_ms, ended_at: int, clock: int) -> None:
        """A delivery that ended at log time `ended_at` without an ack: requeue it after `delay_ms`
        (None: as the queue's back-off policy says), or dead-letter it when spent."""
        limit = self.config["max_deliveries"]
        deliveries = group.deliveries.get(seq, 0)
        if limit is not None and deliveries >= limit:
            self._park(group, seq)
            return
        if delay_ms is None:
            delay_ms = redelivery_delay(self.config["backoff"], self.name, group.name, seq, deliveries)
        ready_at = ended_at + delay_ms
        if ready_at > clock:
            group.delay(seq, ready_at)
        else:
            group.ready.add(seq, self.rows.priority_of(seq))

    def _park(self, group: Group, seq: int) -> None:
        group.parked[seq] = "max_deliveries"
        self.outbox.append((group.name, seq))

    def finish(self, group: Group, seq: int, received: bool = True) -> None:
        """The group is done with the message; it goes when every group is.

        Deleting a group passes received=False: dropping a group is not
        receiving, so a keyed put may still replace what no group received.
        """
        if not group.forget(seq):
            return
        if not self.rows.release(seq, received):   # pending counts the groups holding it: none is left
            if retention.keeps(self.config):
                retention.keep(self, seq)
            else:
                self._unstore(seq)

    def commit(self, group_name: str, upto: int):
        group = self.groups.get(group_name)
        if group is None:
            return error(NOT_FOUND, f"group {group_name!r} does not exist in queue {self.name!r}")
        held = group.held(maximum=upto)
        for seq in held:
            self.finish(group, seq)
        acked = len(held)
        self.counters["acked_total"] += acked
        return {"acked": acked, "cursor": self.cursor(group)}

    def _remove(self, seq: int) -> None:
        """Take the message out of the queue and every group (expiry, overflow, replacement, redrive)."""
        self._unstore(seq)
        for group in self.groups.values():
            group.forget(seq)

    def _unstore(self, seq: int) -> None:
        """Remove the stored message (held by no group, or retained) from the rows and the indexes."""
        key, expires_at = self.rows.remove(seq)
        if key is not None and self.keys.get(key) == seq:
            del self.keys[key]
        if expires_at is not None:
            self.expiries.remove((expires_at, seq))
        if self.ordering:
            self.ordering.pop(seq, None)

    # ---- groups -------------------------------------------------------------
    def add_group(self, name: str, start: str, clock: int, max_groups: int | None = None):
        """`max_groups`: how many groups (``default`` counted) the queue may have; None: no cap,
        as in entries older than the cap."""
        if name in self.groups:
            return {"created": False, **self.group_stats(self.groups[name])}
        if max_groups is not None and len(self.groups) >= max_groups:
            return error(LIMIT_REACHED, f"queue {self.name!r} has {len(self.groups)} groups "
                                        f"(limit {max_groups}, the node option --max-groups-per-queue)")
        first = retention.first_seq_at(self, start)
        joining = 0 if first is None else self.rows.stored_count_from(first)
        if joining > MAX_EARLIEST_GROUP_MESSAGES:
            return error(CONFLICT, f"queue {self.name!r} holds {joining} messages from where the group would "
                                   f"start; a group can start at a stored message while at most "
                                   f"{MAX_EARLIEST_GROUP_MESSAGES} follow it: start it at the latest, or add it "
                                   "once consumers have caught up")
        group = Group(name)
        if first is not None:
            retention.join(self, group, self.rows.stored_from(first), clock)
        self.groups[name] = group
        return {"created": True, **self.group_stats(group)}

    def seek(self, name: str, to, clock: int):
        """Move group `name` to the position `to`: it finishes (acks) what it holds before it, and
        holds every stored message from it on, retained ones too, ready as if new."""
        group = self.groups.get(name)
        if group is None:
            return error(NOT_FOUND, f"group {name!r} does not exist in queue {self.name!r}")
        return retention.seek(self, group, to, clock)

    def patch_group(self, name: str, cmd: dict, clock: int):
        """Pause or resume group `name`, or set its rate limit."""
        group = self.groups.get(name)
        if group is None:
            return error(NOT_FOUND, f"group {name!r} does not exist in queue {self.name!r}")
        if "paused" in cmd:
            if cmd["paused"]:
                until = cmd.get("until_ms")
                if "for_ms" in cmd:
                    until = clock + cmd["for_ms"]
                group.pause(until, clock)
            else:
                group.resume()
        if "rate_limit" in cmd:
            group.limit_rate(cmd["rate_limit"], clock)
        return self.group_stats(group)

    def delete_group(self, name: str):
        group = self.groups.get(name)
        if group is None:
            return error(NOT_FOUND, f"group {name!r} does not exist in queue {self.name!r}")
        if len(self.groups) == 1:
            return error(CONFLICT, "a queue keeps at least one group; delete the queue instead")
        for seq in group.held():
            self.finish(group, seq, received=False)
        self.outbox = deque((g, s) for g, s in self.outbox if g != name)
        del self.groups[name]
        return {"deleted": True}

    # ---- read-only views ----------------------------------------------------
    def cursor(self, group: Group) -> int:
        """The lowest seq the group has not acked (the next one, if none)."""
        lowest = group.lowest_held()
        return self.next_seq if lowest is None else lowest

    def group_stats(self, group: Group) -> dict:
        return {"name": group.name, "depth": len(group.ready), "in_flight": len(group.leases),
                "cursor": self.cursor(group), **group.settings()}

    def stats(self) -> dict:
        groups = self.groups.values()
        return {
            "depth": len(self.rows),
            "bytes": self.rows.bytes,
            "retained": self.rows.retained,
            "retained_bytes": self.rows.retained_bytes,
            "in_flight": sum(len(g.leases) for g in groups),
            "delayed": sum(len(g.delayed) for g in groups),
            "first_seq": self.rows.first_seq(),
            "last_seq": self.next_seq - 1 if self.next_seq > 1 else None,
            **self.counters,
            "groups": {g.name: {k: v for k, v in self.group_stats(g).items() if k != "name"}
                       for g in groups},
        }

    def browse(self, group_name: str, from_seq: int, limit: int, from_time_ms=None):
        """The group's messages from `from_seq` on, and (`from_time_ms`) put at or after that log time."""
        group = self.groups.get(group_name)
        if group is None:
            return error(NOT_FOUND, f"group {group_name!r} does not exist in queue {self.name!r}")
        if from_time_ms is not None:
            first = self.rows.first_put_at_or_after(from_time_ms)
            from_seq = max(from_seq, self.next_seq if first is None else first)
        out, rows, delayed = [], self.rows, group.delayed
        for seq in islice(group.held_from(from_seq), limit):
            out.append({"seq": seq, "body": rows.body(seq), "key": rows.keys.get(seq),
                        "headers": given_headers(rows.headers.get(seq)),
                        "deliveries": group.deliveries.get(seq, 0), "put_at_ms": rows.put_time(seq),
                        "priority": rows.priority_of(seq), "next_ready_at_ms": delayed.get(seq)})
        return {"messages": out, "last_seq": self.next_seq - 1}

    # ---- snapshot -------------------------------------------------------------
    def to_state(self) -> list:
        return [self.name, self.config, self.incarnation, self.next_seq, self.next_lease,
                [self.counters[c] for c in COUNTERS],
                self.rows.to_state(),
                self.dedup.to_state(),
                [g.to_state() for g in self.groups.values()],
                [[g, s] for g, s in self.outbox],
                [[rid, self.redrives[rid][0], at] for at, rid in self.redrive_order],
                [list(self.ordering), list(self.ordering.values())]]

    @classmethod
    def from_state(cls, state: list, version: int) -> "Queue":
        # A version-4 snapshot has neither redrives nor the counters added since;
        # one before version 7 has no ordering keys; one before version 8 holds
        # the dedup window's ids themselves; one before version 9 holds the
        # messages as one list per field (`Rows.from_message_columns`).
        name, config, incarnation, next_seq, next_lease, counters, messages, dedup, groups, outbox, *newer = state
        redrives = newer[0] if newer else []
        ordering = newer[1] if len(newer) > 1 else [[], []]
        # A config saved before a field existed gets the field's default, so a
        # create with equal settings still finds it equal.
        queue = cls(name, full_config(config), incarnation)
        queue.next_seq, queue.next_lease = next_seq, next_lease
        queue.counters = {**dict.fromkeys(COUNTERS, 0), **dict(zip(COUNTERS, counters))}
        rows = queue.rows = (Rows.from_state(messages, next_seq, version) if version >= 9
                             else Rows.from_message_columns(messages, next_seq))
        # in seq order: the newest held version wins (a retained one is no version to replace)
        queue.keys = {key: seq for seq, key in rows.keys.items() if not rows.is_retained(seq)}
        queue.expiries = SortedList(rows.expiries())
        queue.dedup = DedupWindow.from_state(dedup) if version >= 8 else DedupWindow.from_ids(dedup)
        queue.groups = {g[0]: Group.from_state(g, version, rows.ready_flags) for g in groups}
        queue.outbox = deque((g, s) for g, s in outbox)
        queue.redrives = {rid: (result, at) for rid, result, at in redrives}
        queue.redrive_order = deque((at, rid) for rid, _, at in redrives)
        queue.ordering = dict(zip(*ordering))
        return queue
