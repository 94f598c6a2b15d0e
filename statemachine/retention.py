"""Retention and replay: a queue that keeps what its groups are done with, and groups moved back.

A queue whose config sets ``retention_ms`` and/or ``retention_bytes`` keeps a
message every group is done with (acked, committed past, dead-lettered, or
its last group deleted) as a *retained* row (rows.py) instead of removing it:
no group holds it, it has no TTL any more, and its body stays a reference
into its log entry, which compaction therefore keeps.  Retained messages go,
oldest first, once put longer ago than ``retention_ms``, while their bytes
pass ``retention_bytes``, and as soon as retention is turned off; they also
count toward ``max_length`` and ``max_bytes`` and are the first to go when a
put needs the room (``Queue.drop_overflow``).  A tick removes at most
TRIM_STEP of them (the next tick, 20 ms on, goes on), so that a million
falling due together never hold the apply thread.

A group can be made at, or moved to (a seek), a position: ``"earliest"`` (the
first stored message, retained or held), ``"latest"`` (after the last),
``{"seq": n}`` or ``{"time_ms": t}`` (the first stored message put at or
after log time t).  From there on it holds every stored message as if it had
never received it (deliveries 0, ready, or delayed while a put's delay
runs); a seek also finishes what it held before the position, as a commit
does.  A seq past the last stored message is ``"latest"``: messages put
later reach the group as they reach every group.
"""

from .results import CONFLICT, error

TRIM_STEP = 10_000      # retained messages removed by one advance
# A group that starts at the earliest message (or any stored one, or is moved
# back there) counts itself into every stored message from there in one entry:
# about 0.5 us a message, so 200 000 cost what the widest put costs
# (bench/widest_entry.py) and no more can be applied between two heartbeats
# without risking an election (issue 21).
MAX_EARLIEST_GROUP_MESSAGES = 200_000


def keeps(config: dict) -> bool:
    return config["retention_ms"] is not None or config["retention_bytes"] is not None


def keep(queue, seq: int) -> None:
    """Retain the message no group holds any more."""
    key, expires_at = queue.rows.retain(seq)
    if key is not None and queue.keys.get(key) == seq:
        del queue.keys[key]                # no longer a version a keyed put may replace
    if expires_at is not None:
        queue.expiries.remove((expires_at, seq))


def due(queue):
    """When `queue`'s retained messages next have to go (it holds some): now when retention is
    off or past its bytes, else when the oldest outlives retention_ms (None: never)."""
    rows, config = queue.rows, queue.config
    keep_ms, keep_bytes = config["retention_ms"], config["retention_bytes"]
    if (keep_ms is None and keep_bytes is None) or (keep_bytes is not None and rows.retained_bytes > keep_bytes):
        return 0
    return None if keep_ms is None else rows.put_time(rows.oldest_retained()) + keep_ms


def trim(queue, clock: int) -> None:
    """Remove the retained messages that retention no longer keeps at log time `clock`, oldest
    first, at most TRIM_STEP of them."""
    rows, config = queue.rows, queue.config
    keep_ms, keep_bytes = config["retention_ms"], config["retention_bytes"]
    for _ in range(TRIM_STEP):
        seq = rows.oldest_retained()
        if seq is None:
            return
        if not ((keep_ms is None and keep_bytes is None)
                or (keep_bytes is not None and rows.retained_bytes > keep_bytes)
                or (keep_ms is not None and rows.put_time(seq) + keep_ms <= clock)):
            return
        queue._unstore(seq)


def first_seq_at(queue, start):
    """The first seq a group at position `start` holds now, or None when it holds none (latest)."""
    rows = queue.rows
    if start == "latest":
        return None
    if start == "earliest":
        return rows.first_seq()
    if "seq" in start:
        return start["seq"] if start["seq"] < queue.next_seq else None
    return rows.first_put_at_or_after(start["time_ms"])


def join(queue, group, seqs: list, clock: int) -> None:
    """`group` holds the stored messages `seqs` (which it does not hold) from now on, as new to it:
    a retained one is held again, and each is ready, or delayed while its put's delay runs."""
    rows, keys = queue.rows, queue.keys
    shows_at, ready = rows.shows_at, group.ready
    base, pending, priority = rows.base, rows.pending, rows.priority
    for seq in seqs:
        row = seq - base
        if pending[row]:
            pending[row] += 1
        else:
            rows.revive(seq)
            key = rows.keys.get(seq) if rows.keys else None
            if key is not None and keys.get(key, 0) < seq:
                keys[key] = seq
        visible_at = shows_at.get(seq) if shows_at else None
        if visible_at is not None and visible_at > clock:
            group.delay(seq, visible_at)
        else:
            ready.add(seq, priority[row])


def seek(queue, group, to, clock: int) -> dict:
    """Move `group` to position `to` (docs above); 409 when more than MAX_EARLIEST_GROUP_MESSAGES
    stored messages it does not hold would join it, changing nothing."""
    rows = queue.rows
    first = first_seq_at(queue, to)
    if first is None:
        first = queue.next_seq
    held = group.held()
    kept = [seq for seq in held if seq >= first]
    joining = rows.stored_count_from(first) - len(kept)
    if joining > MAX_EARLIEST_GROUP_MESSAGES:
        return error(CONFLICT, f"{joining} stored messages of queue {queue.name!r} from there on would join "
                               f"group {group.name!r}, which one entry can do for at most "
                               f"{MAX_EARLIEST_GROUP_MESSAGES}: seek to a later position")
    acked = 0
    for seq in held:
        if seq < first:
            queue.finish(group, seq)
            acked += 1
    queue.counters["acked_total"] += acked
    for seq in kept:                     # held again as new: leases, delays, deliveries forgotten
        group.forget(seq)
    kept_set = set(kept)
    joined = [seq for seq in rows.stored_from(first) if seq not in kept_set]
    join(queue, group, joined, clock)
    priority = rows.priority
    for seq in kept:
        visible_at = rows.shows_at.get(seq) if rows.shows_at else None
        if visible_at is not None and visible_at > clock:
            group.delay(seq, visible_at)
        else:
            group.ready.add(seq, priority[seq - rows.base])
    return {**queue.group_stats(group), "acked": acked, "replayed": len(joined)}
